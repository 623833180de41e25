"""How many of hybridrt's modules the main flows run: an export, an export that quantizes, a
quantization of an exported graph, and a served request's generation, on a tiny Granite-4.0-H
checkpoint (tests/family_checkpoints.py, seeded). A module counts when a function of it runs (a
profile hook, sys.setprofile); imports alone do not count.

    python scripts/flow_modules.py [--json OUT] [--list]

Run it on two checkouts (PYTHONPATH=CHECKOUT) to compare what a change did to the flows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def traced(run: Callable[[], Any]) -> set[str]:
    """The hybridrt modules with a function that runs during run(). What an import runs does not
    count: a module's top-level code (code name "<module>") and all it runs, its class bodies and
    the functions it calls (a module counts once a function of it runs after its import)."""
    import hybridrt

    package = str(Path(hybridrt.__file__).parent)
    seen: set[str] = set()
    importing = 0  # module bodies running now (nested imports)

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal importing
        if frame.f_code.co_name == "<module>":
            importing += {"call": 1, "return": -1}.get(event, 0)
        elif event == "call" and not importing:
            name = frame.f_code.co_filename
            if name.startswith(package):
                seen.add(str(Path(name).relative_to(Path(package).parent)))

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def flows(work: Path) -> dict[str, Callable[[], Any]]:
    from family_checkpoints import make_granitemoehybrid

    import hybridrt

    ckpt = make_granitemoehybrid(work / "ckpt", seed=0)
    text = ROOT / "README.md"

    def export() -> None:
        hybridrt.export_model(ckpt, work / "float")

    def export_int4() -> None:
        hybridrt.export_model(ckpt, work / "int4", quantize="int4", eval_text=str(text))

    def quantize() -> None:
        from hybridrt.quantization import quantize

        quantize(work / "float", work / "q", mode="int4", eval_text=str(text))

    def generate() -> None:
        model = hybridrt.load(work / "q")
        model.generate("Hello", max_new_tokens=4, temperature=0.0)

    return {"export": export, "export --quantize int4": export_int4, "quantize int4": quantize, "generate": generate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the modules of each flow here")
    ap.add_argument("--list", action="store_true", help="print each flow's modules")
    args = ap.parse_args(argv)
    result: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in flows(Path(tmp)).items():
            result[name] = sorted(traced(run))
            print(f"{name}: {len(result[name])} modules")
            if args.list:
                print("  " + "\n  ".join(result[name]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
