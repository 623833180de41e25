"""An exported model and the runtime-only hybridrt, packaged for AWS Lambda (x86_64, Python 3.12
by default); `hybridrt package-lambda` runs it. Writes, through a temporary directory renamed
into place at the end:

  OUT/lambda.zip      a zip deployment: hybridrt (without the shipped checkpoint), its base
                      dependencies for the Lambda runtime's platform (onnxruntime, numpy,
                      tokenizers, tqdm, and llguidance for constrained decoding; no torch, no
                      other `serve` extra), the model under model/, and
                      bytecode compiled ahead (the deployment is read-only at run time).
                      Handler: hybridrt.deploy.aws_lambda.handler; it finds model/ by itself
                      ($LAMBDA_TASK_ROOT/model), or set HYBRIDRT_MODEL.
  OUT/Dockerfile      a container image on public.ecr.aws/lambda/python:VERSION that pip-installs
  OUT/hybridrt-*.whl  the hybridrt wheel (runtime dependencies only) and copies model/.
  OUT/model/          the model directory.
  OUT/sizes.json      the zip's packed and unpacked sizes (AWS allows 250 MB unpacked for a zip
                      deployment, layers included; a container image up to 10 GB).

Dependencies come from PyPI (`pip install --target DIR --platform TAG --only-binary=:all:
--python-version VERSION`); when that fails (no network, no wheel) packaging stops with pip's
error. The python3.11 runtime (Amazon Linux 2, glibc 2.26) cannot run onnxruntime >= 1.17,
whose wheels are manylinux_2_28: Python 3.11 fails at this step.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeployError
from ..graphs.manifest import read_manifest

PACKAGE = Path(__file__).resolve().parents[1]  # the installed hybridrt
# Lambda's Python runtimes: 3.11 runs on Amazon Linux 2 (glibc 2.26), 3.12 and later on Amazon
# Linux 2023 (glibc 2.34). onnxruntime >= 1.17 publishes manylinux_2_28 wheels only, so the base
# dependency onnxruntime>=1.20 has no wheel for the 3.11 runtime: 3.12 is the default.
AL2 = ["manylinux_2_26_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
AL2023 = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", *AL2]
PLATFORMS = {"3.11": AL2, "3.12": AL2023, "3.13": AL2023}  # pip takes the tags it is given, no older ones
DEFAULT_PYTHON = "3.12"
LAMBDA_LIMIT = 250 * 10**6  # unzipped bytes, function and layers together
# Parts of the dependencies that generation never imports (onnxruntime's offline tools, test
# suites, headers and scripts).
STRIP = (
    "onnxruntime/transformers",
    "onnxruntime/quantization",
    "onnxruntime/tools",
    "onnxruntime/datasets",
    "numpy/_core/tests",
    "numpy/tests",
    "numpy/f2py",
    "numpy/_pyinstaller",
    "numpy/typing/tests",
    "bin",
)
# Distributions that the dependencies pull in but generation never imports: tokenizers'
# Hub client (loading tokenizer.json from a file needs none of it) and that client's own
# dependencies. Removed by their RECORD; the handler runs from the zip without them.
PRUNE = {
    "huggingface-hub",
    "hf-xet",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "h11",
    "anyio",
    "sniffio",
    "click",
    "fsspec",
    "pyyaml",
    "filelock",
    "truststore",
    "idna",
    "certifi",
    "shellingham",
    "typer",
    "typer-slim",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
}
# The dist-info files besides METADATA that the wheel carries over from the installed hybridrt.
DIST_INFO = ("entry_points.txt", "top_level.txt")

DOCKERFILE = """\
# AWS Lambda container image: the runtime-only hybridrt and the model, no torch.
#   docker build -t hybridrt-lambda . && docker run -p 9000:8080 hybridrt-lambda
FROM public.ecr.aws/lambda/python:{python}
COPY {wheel} /tmp/
RUN pip install --no-cache-dir /tmp/{wheel} {grammar} && rm /tmp/{wheel}
COPY model ${{LAMBDA_TASK_ROOT}}/model
ENV HYBRIDRT_MODEL=${{LAMBDA_TASK_ROOT}}/model
CMD ["hybridrt.deploy.aws_lambda.handler"]
"""


@dataclass(frozen=True)
class Packaged:
    directory: Path
    wheel: str
    zip_bytes: int
    unzipped_bytes: int

    @property
    def under_lambda_limit(self) -> bool:
        return self.unzipped_bytes <= LAMBDA_LIMIT


# Besides the base requirements: the grammar engine of response_format and forced tool calls.
GRAMMAR = "llguidance>=1.0"


def dependencies() -> list[str]:
    """hybridrt's base requirements (no extras), from its installed metadata, and GRAMMAR."""
    required = importlib.metadata.requires("hybridrt") or []
    return [r for r in required if "extra" not in r.partition(";")[2]] + [GRAMMAR]


def pip(*args: str, hint: str = "") -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        offline = ("NewConnectionError", "Network is unreachable", "Could not find a version")
        if not hint and any(w in tail for w in offline):
            hint = " (is PyPI reachable from this machine? packaging downloads the Lambda platform's wheels)"
        raise DeployError(f"`pip {' '.join(args[:2])} ...` failed{hint}:\n{tail}")


def install_dependencies(target: Path, python: str) -> None:
    """The base dependencies for the Lambda platform into `target`, less what generation never imports."""
    pip(
        "install",
        "--quiet",
        "--target",
        str(target),
        *(arg for tag in PLATFORMS[python] for arg in ("--platform", tag)),
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        *dependencies(),
        hint=(
            " (the python3.11 Lambda runtime is Amazon Linux 2, glibc 2.26: onnxruntime>=1.20 has only "
            "manylinux_2_28 wheels; package for Python 3.12)"
            if python == "3.11"
            else ""
        ),
    )
    for part in STRIP:
        shutil.rmtree(target / part, ignore_errors=True)
    for record in list(target.glob("*.dist-info/RECORD")):
        if record.parent.name.split("-")[0].lower().replace("_", "-") not in PRUNE:
            continue
        files = [Path(line.split(",")[0]) for line in record.read_text().splitlines() if line]
        for name in files:
            path = (target / name).resolve()
            if path.is_file() and target.resolve() in path.parents:
                path.unlink()
        for top in sorted({name.parts[0] for name in files if name.parts and name.parts[0] != ".."}):
            path = (target / top).resolve()
            if path.is_dir() and path.parent == target.resolve():
                shutil.rmtree(path, ignore_errors=True)


def package_files(skip_checkpoint: bool) -> list[Path]:
    """The installed package's files (no bytecode), optionally without the shipped checkpoint."""
    out = []
    for path in sorted(PACKAGE.rglob("*")):
        parts = path.relative_to(PACKAGE).parts
        if not path.is_file() or "__pycache__" in parts or path.suffix == ".pyc":
            continue
        if skip_checkpoint and "default-model" in parts:
            continue
        out.append(path)
    return out


def copy_package(target: Path) -> None:
    for path in package_files(skip_checkpoint=True):
        dest = target / "hybridrt" / path.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)


def write_wheel(out: Path) -> Path:
    """The hybridrt wheel (pure Python, py3-none-any) of the installed package and its metadata:
    the files `pip wheel` would put in it, with no source tree needed."""
    dist = importlib.metadata.distribution("hybridrt")
    info = f"hybridrt-{dist.version}.dist-info"
    path = out / f"hybridrt-{dist.version}-py3-none-any.whl"
    entries: list[tuple[str, bytes]] = []
    for file in package_files(skip_checkpoint=False):
        entries.append((f"hybridrt/{file.relative_to(PACKAGE).as_posix()}", file.read_bytes()))
    # An egg-info (a source checkout's, found first from its root) names its METADATA PKG-INFO.
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if metadata is None:
        raise DeployError(
            f"the installed hybridrt {dist.version} has no metadata to build its wheel from; reinstall it"
        )
    entries.append((f"{info}/METADATA", metadata.encode()))
    for name in DIST_INFO:
        text = dist.read_text(name)
        if text is not None:
            entries.append((f"{info}/{name}", text.encode()))
    wheel = "Wheel-Version: 1.0\nGenerator: hybridrt\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries.append((f"{info}/WHEEL", wheel.encode()))
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in entries]
    entries.append((f"{info}/RECORD", ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            z.writestr(name, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def compile_bytecode(build: Path, python: str, exe: str | None, say: Callable[[str], None]) -> None:
    """Compile every module ahead with the runtime's Python version: /var/task is read-only, so
    Lambda would otherwise compile them on every cold start. Unchecked hashes stay valid
    whatever timestamps the zip gives the sources."""
    if exe is None:
        same = sys.version_info[:2] == tuple(map(int, python.split(".")))
        exe = sys.executable if same else shutil.which(f"python{python}")
    if exe is None:
        say(f"warning: no python{python} (--bytecode-python): no bytecode in the zip")
        return
    cmd = [exe, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(build)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        tail = (result.stdout.strip() or result.stderr.strip())[-500:]
        say(f"warning: some modules did not compile (they compile at import instead): {tail}")


def write_zip(source: Path, path: Path) -> int:
    """Zip `source`; returns the unpacked size."""
    total = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for file in sorted(source.rglob("*")):
            if file.is_file():
                total += file.stat().st_size
                z.write(file, file.relative_to(source).as_posix())
    return total


def package(
    model: Path,
    out: Path,
    python: str = DEFAULT_PYTHON,
    bytecode_python: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> Packaged:
    """Write OUT (see the module docstring) for the exported directory `model`."""
    if python not in PLATFORMS:
        raise DeployError(f"no Lambda platform for Python {python}; one of {', '.join(sorted(PLATFORMS))}")
    out = out.resolve()
    if out.exists() and not force:
        raise DeployError(f"{out} exists; pass force=True to replace it")
    read_manifest(model)  # a clear error for a directory that is not an export
    if out == model.resolve() or out in model.resolve().parents:
        raise DeployError(f"the output {out} would replace the model directory {model}; choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build = tmp / "build"
        say(f"downloading {', '.join(dependencies())} for {PLATFORMS[python][0]} / CPython {python}")
        install_dependencies(build, python)
        copy_package(build)
        shutil.copytree(model, build / "model")
        compile_bytecode(build, python, bytecode_python, say)
        unpacked = write_zip(build, tmp / "lambda.zip")
        shutil.move(str(build / "model"), tmp / "model")
        shutil.rmtree(build)
        wheel = write_wheel(tmp)
        (tmp / "Dockerfile").write_text(DOCKERFILE.format(python=python, wheel=wheel.name, grammar=f"'{GRAMMAR}'"))
        done = Packaged(out, wheel.name, (tmp / "lambda.zip").stat().st_size, unpacked)
        sizes = {"zip_bytes": done.zip_bytes, "unzipped_bytes": unpacked, "under_lambda_limit": done.under_lambda_limit}
        (tmp / "sizes.json").write_text(json.dumps(sizes, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 is not what a build context wants
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return done
