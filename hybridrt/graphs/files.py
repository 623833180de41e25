"""Writing a graph directory: one atomic writer and one ONNX save for export, quantization and
scripts (scripts/train_default_model.py can publish its checkpoint with `atomic_directory`); and
a path argument checked as one (as_path).

Writing is atomic: everything goes to a temporary directory beside the target, which takes
the target's name only once the block that fills it has finished; on any error the
temporary directory is removed and an existing target is left as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import GenerationError, HybridrtError
from .manifest import TOKENIZER_FILES

# onnx 1.23 writes IR 14 by default, newer than many onnxruntime builds read (1.31 stops at
# 13); IR 10 (onnx 1.16, the release of opset 20) loads in every onnxruntime from 1.20 on,
# the floor in pyproject.toml. Every graph hybridrt writes is saved at this version.
IR_VERSION = 10
# Initializers of at least this many bytes go to the external data file when one is used.
EXTERNAL_SIZE_THRESHOLD = 1024


@contextmanager
def atomic_directory(out: str | Path, error: type[HybridrtError] = HybridrtError) -> Iterator[Path]:
    """Yields an empty temporary directory beside `out`; when the block ends without error it
    replaces `out` (an existing `out` is swapped out, then removed) with ordinary permissions.
    A parent that cannot be written is `error`, naming the directory."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise error(
            f"cannot write beside {out}: {e.strerror} ({e.filename}); choose another output directory"
        ) from None
    try:
        yield tmp
        _normal_permissions(tmp)
        old = out.with_name(f"{tmp.name}.old")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _normal_permissions(directory: Path) -> None:
    """mkdtemp creates 0700 and some writers 0600; the result is an ordinary directory, and so
    is each directory inside it (a Triton repository has version folders)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        if path.is_dir():
            _normal_permissions(path)
        else:
            path.chmod(0o666 & ~umask)


def save_onnx(model: Any, path: Path, external: bool) -> None:
    """Save an onnx.ModelProto at IR_VERSION; `external` puts the weights in `<name>.data`."""
    import onnx

    model.ir_version = IR_VERSION
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=EXTERNAL_SIZE_THRESHOLD,
    )


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files that `src` holds, copied into `dst`."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def as_path(value: object, what: str, error: type[HybridrtError] = GenerationError) -> Path:
    """A str or os.PathLike argument as a Path; `error` naming `what` for anything else."""
    if isinstance(value, str | os.PathLike) and str(value) and encodable(str(value)):
        return Path(value)
    raise error(f"{what} must be a path (a non-empty str or pathlib.Path), got {shown(value)}")


def encodable(text: str) -> bool:
    """Whether UTF-8 encodes `text` (a lone surrogate such as '\\udcff' it does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: object) -> str:
    """A value as an error message shows it: its repr, cut after 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
