"""Package an exported model and the runtime-only hybridrt for AWS Lambda (x86_64, Python 3.12 by default).

    python scripts/package_lambda.py MODEL -o OUT [--python 3.12] [--force]

MODEL: an exported model directory, or "default" (exported here first when its cached export is
missing: that needs the `export` extra, torch; the Lambda itself never exports). Writes, through
a temporary directory renamed into place at the end:

  OUT/lambda.zip   a zip deployment: hybridrt (without the shipped checkpoint), its base
                   dependencies for the Lambda runtime's platform (onnxruntime, numpy,
                   tokenizers, tqdm; no torch, no `serve` extra), the model under model/, and
                   bytecode compiled ahead (the deployment is read-only at run time).
                   Handler: hybridrt.serve.aws_lambda.handler; it finds model/ by itself
                   ($LAMBDA_TASK_ROOT/model), or set HYBRIDRT_MODEL.
  OUT/Dockerfile   a container image on public.ecr.aws/lambda/python:VERSION that pip-installs
  OUT/hybridrt-*.whl  the hybridrt wheel (runtime dependencies only) and copies model/.
  OUT/model/       the model directory.
  OUT/sizes.json   the zip's packed and unpacked sizes (AWS allows 250 MB unpacked for a zip
                   deployment, layers included; a container image up to 10 GB).

Dependencies come from PyPI (`pip install --target DIR --platform TAG --only-binary=:all:
--python-version VERSION`); when that fails (no network, no wheel) the script stops with pip's
error and says so. The python3.11 runtime (Amazon Linux 2, glibc 2.26) cannot run onnxruntime
>= 1.17, whose wheels are manylinux_2_28: `--python 3.11` fails at this step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# Lambda's Python runtimes: 3.11 runs on Amazon Linux 2 (glibc 2.26), 3.12 and later on Amazon
# Linux 2023 (glibc 2.34). onnxruntime >= 1.17 publishes manylinux_2_28 wheels only, so the base
# dependency onnxruntime>=1.20 has no wheel for the 3.11 runtime: 3.12 is the default.
AL2 = ["manylinux_2_26_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
AL2023 = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", *AL2]
PLATFORMS = {"3.11": AL2, "3.12": AL2023, "3.13": AL2023}  # pip takes the tags it is given, no older ones
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

DOCKERFILE = """\
# AWS Lambda container image: the runtime-only hybridrt and the model, no torch.
#   docker build -t hybridrt-lambda . && docker run -p 9000:8080 hybridrt-lambda
FROM public.ecr.aws/lambda/python:{python}
COPY {wheel} /tmp/
RUN pip install --no-cache-dir /tmp/{wheel} && rm /tmp/{wheel}
COPY model ${{LAMBDA_TASK_ROOT}}/model
ENV HYBRIDRT_MODEL=${{LAMBDA_TASK_ROOT}}/model
CMD ["hybridrt.serve.aws_lambda.handler"]
"""


def fail(message: str) -> SystemExit:
    return SystemExit(f"package_lambda: {message}")


def model_source(name: str) -> Path:
    sys.path.insert(0, str(ROOT))
    from hybridrt.default_model import ensure_exported, is_default
    from hybridrt.graphs.manifest import read_manifest

    if is_default(name):
        try:
            directory = ensure_exported(lambda line: print(f"  export: {line}", file=sys.stderr))[0]
        except ImportError as e:
            raise fail(f"exporting the default model needs the export extra (torch): {e}") from None
    else:
        directory = Path(name)
    read_manifest(directory)  # a clear error for a directory that is not an export
    return directory


def dependencies() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def pip(*args: str, hint: str = "") -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        offline = ("NewConnectionError", "Network is unreachable", "Could not find a version")
        if not hint and any(w in tail for w in offline):
            hint = " (is PyPI reachable from this machine? the packaging step downloads the Lambda platform's wheels)"
        raise fail(f"`pip {' '.join(args[:2])} ...` failed{hint}:\n{tail}")


def install_dependencies(target: Path, python: str) -> None:
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
            "manylinux_2_28 wheels; package for --python 3.12)"
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


def copy_package(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "default-model")
    shutil.copytree(ROOT / "hybridrt", target / "hybridrt", ignore=ignore)


def build_wheel(out: Path, scratch: Path) -> Path:
    """The hybridrt wheel, built from a copy of the sources (the build writes next to them)."""
    src = scratch / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "hybridrt", src / "hybridrt", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src))
    shutil.rmtree(src)
    [wheel] = out.glob("hybridrt-*.whl")
    return wheel


def compile_bytecode(build: Path, python: str, exe: str | None) -> None:
    """Compile every module ahead with the runtime's Python version: /var/task is read-only, so
    Lambda would otherwise compile them on every cold start. Unchecked hashes stay valid
    whatever timestamps the zip gives the sources."""
    exe = (
        sys.executable
        if sys.version_info[:2] == tuple(map(int, python.split(".")))
        else shutil.which(f"python{python}")
    )
    if exe is None:
        print(f"warning: no python{python} (--bytecode-python): no bytecode in the zip", file=sys.stderr)
        return
    cmd = [exe, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(build)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        tail = (result.stdout.strip() or result.stderr.strip())[-500:]
        print(f"warning: some modules did not compile (they compile at import instead): {tail}", file=sys.stderr)


def write_zip(source: Path, path: Path) -> int:
    """Zip `source`; returns the unpacked size."""
    total = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for file in sorted(source.rglob("*")):
            if file.is_file():
                total += file.stat().st_size
                z.write(file, file.relative_to(source).as_posix())
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="exported model directory, or 'default'")
    ap.add_argument("-o", "--output", required=True, type=Path, help="output directory")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ap.add_argument(
        "--python", choices=sorted(PLATFORMS), default="3.12", help="the Lambda Python runtime (default: 3.12)"
    )
    ap.add_argument("--bytecode-python", help="a Python of the runtime's version to compile bytecode with")
    args = ap.parse_args(argv)
    out: Path = args.output.resolve()
    if out.exists() and not args.force:
        raise fail(f"{out} exists; pass --force to replace it")
    model = model_source(args.model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build = tmp / "build"
        print(f"downloading {', '.join(dependencies())} for {PLATFORMS[args.python][0]} / CPython {args.python}")
        install_dependencies(build, args.python)
        copy_package(build)
        shutil.copytree(model, build / "model")
        compile_bytecode(build, args.python, args.bytecode_python)
        unpacked = write_zip(build, tmp / "lambda.zip")
        shutil.move(str(build / "model"), tmp / "model")
        for child in build.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        wheel = build_wheel(tmp, build)
        shutil.rmtree(build)
        (tmp / "Dockerfile").write_text(DOCKERFILE.format(python=args.python, wheel=wheel.name))
        sizes = {"zip_bytes": (tmp / "lambda.zip").stat().st_size, "unzipped_bytes": unpacked}
        sizes["under_lambda_limit"] = unpacked <= LAMBDA_LIMIT
        (tmp / "sizes.json").write_text(json.dumps(sizes, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 is not what a build context wants
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mb = 1e6
    print(
        f"wrote {out}: lambda.zip {sizes['zip_bytes'] / mb:.1f} MB ({unpacked / mb:.1f} MB unzipped; "
        f"AWS limit {LAMBDA_LIMIT / mb:.0f} MB), Dockerfile, {wheel.name}, model/"
    )
    if not sizes["under_lambda_limit"]:
        print("the unzipped size exceeds Lambda's zip limit: deploy the container image instead", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
