"""The default model's text: Python sources the `[dev]` install brings, split by whole package.

    python scripts/default_model_corpus.py build/corpus.jsonl.xz   # write the corpus file

Sources: the running interpreter's standard library (test suites left out) and the `*.py`
files of every distribution in the dependency closure of `hybridrt[dev]` whose licence is
permissive (MIT, BSD, Apache, PSF, ISC and the like). onnx and onnxruntime stay out entirely
(they are evaluation targets elsewhere), and so does hybridrt itself. Vendored copies
(`_vendor/`, `vendored/`, `extern/`) are dropped so that a held-out package cannot leak into
training through another package's copy of it; generated tables and minified files are
dropped; identical files are kept once. Each distribution contributes at most
PER_PACKAGE_BYTES, chosen by a hash of the path, so that the largest packages (torch,
transformers, sympy) do not swamp the rest.

The corpus file (xz-compressed JSON lines, one document each: split, source, path, text, with a
first line describing the sources and their licences) is what training reads, so a model can be
trained on a machine other than the one that gathered its text.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import lzma
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Held out for evaluation, never trained on.
HELDOUT_STDLIB = (
    "argparse.py", "calendar.py", "configparser.py", "csv.py", "dataclasses.py", "difflib.py",
    "enum.py", "fractions.py", "heapq.py", "json/", "logging/", "pathlib.py", "pprint.py",
    "shlex.py", "statistics.py", "string.py", "textwrap.py", "tomllib/", "zipfile.py",
)  # fmt: skip
# Whole packages from other projects, of different kinds: CLI, templating, terminal UI, packaging
# metadata, an HTTP state machine.
HELDOUT_PACKAGES = ("click", "jinja2", "rich", "packaging", "h11")
NEVER = ("onnx", "onnxruntime", "hybridrt")  # not even for the tokenizer
STDLIB_EXCLUDED_DIRS = ("site-packages", "test", "tests", "idle_test")
VENDORED_DIRS = ("_vendor", "vendor", "_vendored", "vendored", "extern", "_extern")
PERMISSIVE = re.compile(r"\b(MIT|BSD|0BSD|Apache|PSF|Python Software Foundation|ISC|Zlib|CC0|BSL-1\.0|CNRI)", re.I)
COPYLEFT = re.compile(r"\b(GPL|LGPL|AGPL|MPL|Mozilla|EPL)\b", re.I)
PER_PACKAGE_BYTES = 8_000_000
MAX_FILE_BYTES = 400_000
MAX_MEAN_LINE = 120  # longer average lines: generated data, not code people write
SPECIAL_STRINGS = ("<s>", "</s>", "<pad>")


@dataclass(frozen=True)
class Source:
    name: str  # "stdlib" or a distribution name
    version: str
    licence: str
    root: Path
    files: tuple[str, ...]  # paths relative to root


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dev_closure() -> list[md.Distribution]:
    """Distributions that `pip install hybridrt[dev]` needs, found from installed metadata."""
    from packaging.requirements import Requirement

    seen: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [("hybridrt", {"dev"})]
    while todo:
        name, extras = todo.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        key = _key(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | extras
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in (extras or {""})]
            if req.marker is None or any(req.marker.evaluate(e) for e in envs):
                todo.append((req.name, set(req.extras)))
    return [md.distribution(k) for k in sorted(seen)]


def licence_of(dist: md.Distribution) -> str:
    meta = dist.metadata
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")]
    text = meta.get("License-Expression") or (meta.get("License") or "").split("\n")[0][:80]
    return text.strip() or "; ".join(classifiers)


def is_permissive(licence: str) -> bool:
    return bool(PERMISSIVE.search(licence)) and not COPYLEFT.search(licence)


def stdlib_source() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    rels = [r for r in rels if not any(part in STDLIB_EXCLUDED_DIRS for part in r.split("/")[:-1])]
    return Source("stdlib", sys.version.split()[0], "PSF-2.0", root, tuple(rels))


def package_sources() -> tuple[list[Source], list[str]]:
    """(permissively licensed distributions of the dev closure, notes on those left out)."""
    sources, skipped = [], []
    for dist in dev_closure():
        name, licence = _key(dist.metadata["Name"]), licence_of(dist)
        if name in NEVER:
            skipped.append(f"{name}: never used")
            continue
        if not is_permissive(licence):
            skipped.append(f"{name}: licence {licence!r} not permissive")
            continue
        root = Path(str(dist.locate_file("")))
        files = sorted(
            str(f)
            for f in dist.files or []
            if str(f).endswith(".py") and not any(p in VENDORED_DIRS for p in Path(str(f)).parts)
        )
        if files:
            sources.append(Source(name, dist.version, licence, root, tuple(files)))
    return sources, skipped


def is_stdlib_heldout(rel: str) -> bool:
    return any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in HELDOUT_STDLIB)


def usable(text: str) -> bool:
    lines = text.count("\n") + 1
    return 0 < len(text) <= MAX_FILE_BYTES and len(text) / lines <= MAX_MEAN_LINE


def documents(source: Source) -> Iterator[tuple[str, str]]:
    """(path, text) of a source's usable files, capped at PER_PACKAGE_BYTES (stdlib uncapped)."""
    order = sorted(source.files, key=lambda r: hashlib.sha256(r.encode()).hexdigest())
    total = 0
    for rel in order:
        try:
            text = (source.root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not usable(text) or any(s in text for s in SPECIAL_STRINGS):
            continue
        if source.name != "stdlib" and total + len(text) > PER_PACKAGE_BYTES:
            continue
        total += len(text)
        yield rel, text


def split_of(source: Source, rel: str) -> str:
    if source.name == "stdlib":
        return "heldout-stdlib" if is_stdlib_heldout(rel) else "train"
    return "heldout-packages" if source.name in HELDOUT_PACKAGES else "train"


def write_corpus(path: Path) -> dict:
    sources, skipped = package_sources()
    sources = [stdlib_source(), *sources]
    missing = set(HELDOUT_PACKAGES) - {s.name for s in sources}
    if missing:
        raise SystemExit(f"held-out packages not installed: {sorted(missing)}")
    seen: set[str] = set()
    rows, counts = [], {}
    for source in sources:
        for rel, text in documents(source):
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            split = split_of(source, rel)
            rows.append({"split": split, "source": source.name, "path": rel, "text": text})
            c = counts.setdefault(source.name, {"files": 0, "bytes": 0, "splits": set()})
            c["files"] += 1
            c["bytes"] += len(text.encode())
            c["splits"].add(split)
    header = {
        "sources": [
            {"name": s.name, "version": s.version, "licence": s.licence}
            | {k: sorted(v) if isinstance(v, set) else v for k, v in counts.get(s.name, {}).items()}
            for s in sources
        ],
        "skipped": skipped,
        "heldout_stdlib": list(HELDOUT_STDLIB),
        "heldout_packages": list(HELDOUT_PACKAGES),
        "per_package_bytes": PER_PACKAGE_BYTES,
        "python": sys.version.split()[0],
    }
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(tmp, "wt", encoding="utf-8", preset=6) as f:
        f.write(json.dumps(header) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return header


def read_corpus(path: Path) -> tuple[dict, list[dict]]:
    """(header, documents) of a corpus file written by write_corpus."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())
        return header, [json.loads(line) for line in f]


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    header = write_corpus(Path(sys.argv[1]))
    for s in header["sources"]:
        print(f"{s['name']:22s} {s['version']:14s} {s.get('files', 0):6d} files {s.get('bytes', 0) / 1e6:7.2f} MB  "
              f"{','.join(s.get('splits', [])):24s} {s['licence'][:50]}")  # fmt: skip
    for note in header["skipped"]:
        print("left out:", note)


if __name__ == "__main__":
    main()
