"""Fuzz suite: hostile inputs across the runtime API (load, generate, stream, session), the
CLI (every subcommand, bad paths, bad flags) and damaged directories. Every case either
works or raises a HybridrtError (the CLI: exit code 2 and one line on stderr, no
traceback), and a failed export or quantize leaves no directory behind.

Seeded and bounded: each test generates its cases from a fixed seed; valid generations ask
for a few tokens only. The session prints the tally (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fuzzing import Cases

import hybridrt
from hybridrt.cli import main
from hybridrt.graphs.manifest import MANIFEST

SEED = 10
# Values of every JSON/Python type, edge numbers and bad text, tried for each parameter.
HOSTILE: list[Any] = [
    None,
    True,
    False,
    -1,
    0,
    1,
    3,
    2**63,
    0.5,
    -0.5,
    1.5,
    math.nan,
    math.inf,
    -math.inf,
    "x",
    "",
    "\udcff",
    [],
    [1],
    [-1],
    [1.5],
    [[1]],
    ["a", 1],
    ["", "x"],
    (2, 3),
    {},
    {"a": 1},
    b"x",
    1 + 2j,
    object(),
    np.int64(3),
    np.float32(0.5),
    np.float64(math.nan),
    np.array([1, 2]),
    np.bool_(True),
]
PARAMETERS = (
    "max_new_tokens",
    "min_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "eos_token_id",
    "stop_strings",
    "add_bos_token",
    "num_beams",
    "length_penalty",
    "early_stopping",
    "num_return_sequences",
)


@pytest.fixture(scope="module")
def model(jamba_onnx: Path) -> hybridrt.runtime.model.Model:
    return hybridrt.load(jamba_onnx)


def _call(model: Any, how: str, prompt: Any, kwargs: dict[str, Any]) -> Any:
    """One runtime API entry point, consumed to the end."""
    if how == "generate":
        return model.generate(prompt, **kwargs)
    if how == "stream":
        return "".join(model.stream(prompt, **kwargs))
    chat = model.session()
    if how == "session.generate":
        chat.generate(prompt, **kwargs)
        return chat.generate(prompt, **kwargs)  # a second turn on the carried states
    return "".join(chat.stream(prompt, **kwargs))


HOW = ("generate", "stream", "session.generate", "session.stream")


def test_generation_parameters(model: Any) -> None:
    """Every GenerationConfig field x every hostile value x every entry point."""
    rng = random.Random(SEED)
    cases = Cases()
    for name in PARAMETERS:
        for value in HOSTILE:
            how = rng.choice(HOW)
            prompt = rng.choice(["def fib", [5, 6, 7]])
            kwargs = {"max_new_tokens": 3} | {name: value}
            cases.run(f"{how}({prompt!r}, {name}={value!r})", _call, model, how, prompt, kwargs)
    for bad in ({"max_tokens": 3}, {"temperature": 0.5, "top_k": 5, "seed": 1, "nonsense": 1}, {"": 1}):
        cases.run(f"generate(**{bad})", model.generate, [5], **bad)
    cases.check(at_least=380)


def _prompts(rng: random.Random) -> Iterator[Any]:
    yield from [
        "",
        " ",
        "\n",
        "\udcff",
        "a\ud800b",
        ["a", "\udfff"],
        [],
        [[]],
        [[1, 2], []],
        [1, -1],
        [1, 320],
        [1, 2**63],
        [True, 2],
        [1.0],
        [None],
        ["a", None],
        [[1, 2], [3, "x"]],
        [[1, 2], 3],
        np.array([1, 2]),
        np.array([[1, 2], [3, 4]]),
        np.array([1.5]),
        np.array([], dtype=np.int64),
        {"a": 1},
        None,
        5,
        b"bytes",
        bytearray(b"ab"),
        "x" * 5000,
        [5] * 600,
        ["def f():"] * 3,
        [[5, 6], [7]],
    ]
    alphabet = "abc xyz\n\t()[]{}:;#'\"\\é数🙂\u200b\ufeff\x00\x7f"
    for _ in range(40):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
    for _ in range(30):
        yield [rng.randint(-3, 330) for _ in range(rng.randint(0, 6))]


def test_prompts(model: Any) -> None:
    """Text that cannot be encoded, ids outside the vocabulary, empty and odd prompts."""
    rng = random.Random(SEED + 1)
    cases = Cases()
    for prompt in _prompts(rng):
        how = rng.choice(HOW)
        cases.run(f"{how}({prompt!r:.60})", _call, model, how, prompt, {"max_new_tokens": 2})
    cases.check(at_least=100)


def test_a_batch_over_the_memory_limit_runs_in_batches_that_fit(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridrt.runtime.input_checks import row_bytes

    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14], [15, 16, 17, 18]]
    alone = [model.generate(p, max_new_tokens=6, eos_token_id=[]) for p in prompts]
    beams = [model.generate(p, max_new_tokens=4, num_beams=2, eos_token_id=[]) for p in prompts[:3]]
    one = row_bytes(model.manifest, 4 + 6)  # the longest row's states and logits
    monkeypatch.setenv("HYBRIDRT_MAX_GENERATION_BYTES", str(2 * one + 1))  # two rows at a time
    out, stats = model.generate_with_stats(prompts, max_new_tokens=6, eos_token_id=[])
    assert out == alone and stats.prompt_tokens == sum(len(p) for p in prompts)
    assert model.generate(prompts[:3], max_new_tokens=4, num_beams=2, eos_token_id=[]) == beams  # one row of 2 beams
    monkeypatch.setenv("HYBRIDRT_MAX_GENERATION_BYTES", str(one - 1))  # not even one row: refused, before any work
    with pytest.raises(hybridrt.GenerationError, match="HYBRIDRT_MAX_GENERATION_BYTES"):
        model.generate(prompts, max_new_tokens=6)
    monkeypatch.setenv("HYBRIDRT_MAX_GENERATION_BYTES", "lots")
    with pytest.raises(hybridrt.GenerationError, match="positive integer"):
        model.generate([5], max_new_tokens=2)


def test_load_arguments(jamba_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDRT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "file").write_text("x")
    paths: list[Any] = [tmp_path / "missing", tmp_path / "file", tmp_path, "", "default", "\udcff", str(jamba_onnx)]
    paths += [None, 5, b"x", [str(jamba_onnx)], object()]
    providers: list[Any] = ["auto", "cpu", "nope", "", 5, None, ["cpu", 3], ("cpu", "x"), ("cpu", {"x": 1}), []]
    threads: list[Any] = [None, 1, 0, -1, "2", 1.5, True]
    cases = Cases()
    for path in paths:
        cases.run(f"load({path!r})", hybridrt.load, path)
    for provider in providers:
        cases.run(f"load(provider={provider!r})", hybridrt.load, jamba_onnx, provider)
    for n in threads:
        cases.run(f"load(threads={n!r})", hybridrt.load, jamba_onnx, "cpu", threads=n)
    for flag in ("verify", "io_binding", "allow_fallback"):
        for value in ("x", None, 1):
            cases.run(f"load({flag}={value!r})", hybridrt.load, jamba_onnx, **{flag: value})
    cases.check(at_least=30)


def test_quantization_options() -> None:
    """Every QuantConfig field x every hostile value: quantize() reads its options through
    QuantConfig.from_kwargs before any work, so this is what a hostile caller meets."""
    from dataclasses import fields

    from hybridrt.quantization import QuantConfig

    cases = Cases()
    for f in fields(QuantConfig):
        for value in HOSTILE:
            mode = {} if f.name == "mode" else {"mode": "int4"}
            cases.run(f"QuantConfig({f.name}={value!r})", QuantConfig.from_kwargs, **mode, **{f.name: value})
    cases.check(at_least=500)


def test_export_and_quantize_arguments(jamba_onnx: Path, tmp_path: Path) -> None:
    """Paths and texts of the wrong type fail before any work, and write nothing."""
    from hybridrt.quantization import quantize

    cases = Cases()
    out = tmp_path / "out"
    for value in HOSTILE:
        if isinstance(value, str) and value:
            continue  # a real relative path: it would be created in the working directory
        cases.run(f"export_model({value!r}, out)", hybridrt.export_model, value, out)
        cases.run(f"export_model(src, {value!r})", hybridrt.export_model, tmp_path / "missing", value)
        cases.run(f"quantize({value!r}, out)", quantize, value, out, "int4")
        cases.run(f"quantize(src, {value!r})", quantize, jamba_onnx, value, "int4")
        cases.run(f"quantize(calibration={value!r})", quantize, jamba_onnx, out, "int8-static", calibration=value)
        cases.run(f"quantize(eval_text={value!r})", quantize, jamba_onnx, out, "int8-static", eval_text=value)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    cases.check(at_least=150)


# Damaged directories.


def _mutations(data: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, Callable[[dict[str, Any]], None]]]:
    """(label, edit) pairs over the manifest: each field, nested ones too, set to values of
    the wrong type or removed."""
    values: list[Any] = [None, 0, -1, 1, 2**40, 1.5, math.nan, "x", "", [], [1], {}, {"x": 1}, True]
    paths: list[tuple[Any, ...]] = [(k,) for k in data]
    paths += [("inputs", 0, k) for k in data["inputs"][0]] + [("inputs", 3, "dims", 1), ("outputs", 0, "dims", 2)]
    paths += [("outputs", 1, k) for k in data["outputs"][1]]
    paths += [("special_tokens", k) for k in data["special_tokens"]]
    paths += [("files", "model.onnx", "bytes"), ("files", "model.onnx", "sha256"), ("files", "../escape")]
    paths += [("parity", k) for k in data["parity"]] + [("config", "hidden_size"), ("config", "layer_types")]
    paths += [("quantization", "mode"), ("quantization", "report"), ("layer_types", 0), ("generation", "top_k")]
    paths += [("generation", "repetition_penalty"), ("generation", "add_bos_token")]
    for path in paths:
        for value in rng.sample(values, 4):
            yield f"{'.'.join(map(str, path))} = {value!r}", lambda d, p=path, v=value: _set(d, p, v)
        yield f"del {'.'.join(map(str, path))}", lambda d, p=path: _set(d, p, _DELETE)
    yield "max_length = 4", lambda d: d.update(max_length=4)
    yield "vocab_size = 10", lambda d: d.update(vocab_size=10)
    yield "layer_types reversed", lambda d: d["layer_types"].reverse()
    yield "inputs swapped", lambda d: d["inputs"].reverse()
    yield "generation recommended", lambda d: d.update(generation={"repetition_penalty": 1.3, "add_bos_token": True})
    yield "generation sampling", lambda d: d.update(generation={"do_sample": True, "temperature": 0.7, "top_k": 5})
    yield "schema_version 99", lambda d: d.update(schema_version=99)
    yield "format pt2", lambda d: d.update(format="pt2")
    yield "manifest is a list", lambda d: d.clear()


_DELETE = object()


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key] if not isinstance(data, dict) or key in data else data.setdefault(key, {})
        if data is None:
            return
    last = path[-1]
    if value is _DELETE:
        if isinstance(data, dict):
            data.pop(last, None)
        elif isinstance(data, list) and last < len(data):
            del data[last]
    elif isinstance(data, dict) or (isinstance(data, list) and last < len(data)):
        data[last] = value


def _use(directory: Path) -> None:
    """Load a directory and generate from it: the runtime path a damaged directory takes."""
    model = hybridrt.load(directory)
    model.generate("def", max_new_tokens=2)
    model.generate([5, 6], max_new_tokens=2, do_sample=True, seed=0)


@pytest.fixture
def scratch(jamba_onnx: Path, tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """A fresh copy of the exported directory per call."""
    n = 0

    def fresh() -> Path:
        nonlocal n
        n += 1
        return Path(shutil.copytree(jamba_onnx, tmp_path / f"copy{n}"))

    yield fresh


def test_mutated_manifests(jamba_onnx: Path, scratch: Callable[[], Path]) -> None:
    rng = random.Random(SEED + 2)
    original = json.loads((jamba_onnx / MANIFEST).read_text())
    cases = Cases()
    directory = scratch()
    for label, edit in _mutations(json.loads(json.dumps(original)), rng):
        data = json.loads(json.dumps(original))
        edit(data)
        (directory / MANIFEST).write_text(json.dumps(data if data else []))
        cases.run(f"manifest {label}", _use, directory)
        cases.run(f"inspect with manifest {label}", _cli, ["inspect", str(directory)])
    cases.check(at_least=250)


def _damage(rng: random.Random) -> Iterator[tuple[str, str, Callable[[Path], None]]]:
    for name in ("model.onnx", "hybridrt.json", "tokenizer.json", "tokenizer_config.json"):
        yield name, "missing", lambda p: p.unlink()
        yield name, "empty", lambda p: p.write_bytes(b"")
        yield name, "a directory", lambda p: (p.unlink(), p.mkdir())
        for cut in (1, 100, 0.5, 0.99):
            yield name, f"truncated at {cut}", lambda p, c=cut: _truncate(p, c)
        for _ in range(3):
            at, junk = rng.random(), bytes(rng.randrange(256) for _ in range(16))
            yield name, f"garbled at {at:.2f}", lambda p, a=at, j=junk: _garble(p, a, j)
        yield name, "not UTF-8", lambda p: p.write_bytes(b"\xff\xfe{" * 10)


def _truncate(path: Path, cut: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(cut * len(data)) if isinstance(cut, float) else cut])


def _garble(path: Path, at: float, junk: bytes) -> None:
    data = bytearray(path.read_bytes())
    i = int(at * max(len(data) - len(junk), 0))
    data[i : i + len(junk)] = junk
    path.write_bytes(bytes(data))


def test_damaged_files(scratch: Callable[[], Path]) -> None:
    """Truncated, missing, garbled files; loaded with and without checksum verification."""
    rng = random.Random(SEED + 3)
    cases = Cases()
    for name, how, damage in _damage(rng):
        directory = scratch()
        path = directory / name
        if not path.exists():
            continue
        damage(path)
        cases.run(f"{name} {how}: load", _use, directory)
        cases.run(f"{name} {how}: load(verify=False)", hybridrt.load, directory, verify=False)
        outcome = cases.run(f"{name} {how}: inspect", _cli, ["inspect", str(directory)])
        if name in ("model.onnx", "hybridrt.json") and outcome == "worked":
            cases.failures.append(f"{name} {how}: inspect exited 0 on a damaged directory")
        shutil.rmtree(directory)
    cases.check(at_least=90)


# The CLI, in process: exit code 0 or 2, and on 2 the error as one line on stderr (the
# last; progress lines may precede it), no traceback.


def _cli(argv: list[str]) -> str:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: usage errors, --help
            code = e.code if isinstance(e.code, int) else 2
    lines = err.getvalue().strip().splitlines()
    if code == 2:
        # The error is one line, the last (progress lines of a long step may come before it).
        errors = [line for line in lines if "error:" in line]
        if "Traceback" in err.getvalue() or len(errors) != 1 or lines[-1] != errors[0]:
            raise CliBroken(f"exit 2 with stderr {err.getvalue()!r}")
        if not errors[0].startswith("hybridrt"):
            raise CliBroken(f"exit 2 with an error line not from hybridrt: {errors[0]!r}")
        return "typed error"
    if code != 0:
        raise CliBroken(f"exit {code}, stderr {err.getvalue()[-300:]!r}")
    return "worked"


class CliBroken(Exception):
    """A CLI outcome other than exit 0, or exit 2 with one line on stderr."""


FLAG_VALUES = ["x", "", "-1", "0", "1", "2", "0.5", "nan", "inf", "-inf", "1e9", "99999999999999999999", "\udcff"]


def _cli_cases(onnx: Path, ckpt: Path, tmp: Path, rng: random.Random) -> Iterator[list[str]]:
    missing, afile, d = str(tmp / "missing"), str(tmp / "a.txt"), str(onnx)
    (tmp / "a.txt").write_text("def f():\n    return 1\n" * 20)
    (tmp / "bin").write_bytes(b"\xff\xfe\x00\x01" * 10)
    (tmp / "empty.txt").write_text("")
    yield from [
        [],
        ["nope"],
        ["--version"],
        ["--help"],
        ["generate"],
        ["generate", d],
        ["generate", missing, "hi"],
        ["generate", afile, "hi"],
        ["generate", "", "hi"],
        ["generate", d, "\udcff"],
        ["generate", d, ""],
        ["generate", d, "hi", "--bogus"],
        ["generate", d, "hi", "--temperature", "0", "--top-k", "5"],
        ["generate", d, "hi", "--temperature", "0", "--seed", "1"],
        ["generate", d, "hi", "--no-do-sample", "--temperature", "0.7"],
        ["generate", d, "hi", "--do-sample", "--temperature", "0"],
        ["generate", d, "hi", "--max-new-tokens", "100000"],
        ["generate", d, "hi", "--provider", "nope"],
        ["generate", d, "hi", "--provider", "cuda"],
        ["generate", d, "hi", "--stop", ""],
        ["inspect"],
        ["inspect", missing],
        ["inspect", afile],
        ["inspect", str(tmp)],
        ["inspect", d, "--no-verify"],
        ["eval", d],
        ["eval", d, "--text", missing],
        ["eval", d, "--text", str(tmp)],
        ["eval", d, "--text", str(tmp / "bin")],
        ["eval", d, "--text", str(tmp / "empty.txt")],
        ["eval", missing, "--text", afile],
        ["export"],
        ["export", missing, "-o", str(tmp / "out")],
        ["export", afile, "-o", str(tmp / "out")],
        ["export", str(tmp), "-o", str(tmp / "out")],
        ["export", str(ckpt), "-o", d],
        ["export", str(ckpt), "-o", str(tmp / "out"), "--format", "gguf"],
        ["export", str(ckpt), "-o", afile + "/sub"],
        ["quantize", d, "-o", str(tmp / "q")],
        ["quantize", missing, "-o", str(tmp / "q"), "--mode", "int4"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int3"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int8-dynamic", "--algo", "gptq"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int4", "--algo", "awq"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int4", "--block-size", "3"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int8-static"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int8-static", "--calibration", missing],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int4", "--eval-text", str(tmp / "bin")],
        ["quantize", d, "-o", d, "--mode", "int4", "--force"],
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int4", "--keep-float-default", "maybe"],
        # Fails late, at the quality gate, after the graph was written to a temporary directory.
        ["quantize", d, "-o", str(tmp / "q"), "--mode", "int8-dynamic", "--eval-text", afile, "--max-ppl-ratio", "0.5"],
        ["bench"],
        ["bench", missing],
        ["bench", d, "--batch", "0"],
        ["bench", d, "--prompt-tokens", "100000"],
        ["bench", d, "--assistant", missing],
        ["bench", d, "--assistant", d, "--schedule", "fast"],
        ["bench", d, "--assistant", d, "--num-assistant-tokens", "0"],
        ["generate", d, "def", "--assistant", missing],
        ["generate", d, "def", "--assistant", d, "--num-assistant-tokens", "-2"],
        ["demo", "--max-new-tokens", "0"],
        ["demo", "--repetition-penalty", "nan"],
        ["demo", "--prompt", "\udcff"],
    ]
    flags = {
        "generate": [
            "--max-new-tokens",
            "--min-new-tokens",
            "--temperature",
            "--top-k",
            "--top-p",
            "--repetition-penalty",
            "--seed",
            "--stop",
            "--threads",
            "--provider",
            "--num-assistant-tokens",
            "--num-beams",
            "--num-return-sequences",
            "--length-penalty",
        ],
        "eval": ["--window", "--stride", "--threads", "--provider"],
        "bench": [
            "--prompt-tokens",
            "--new-tokens",
            "--batch",
            "--repeats",
            "--threads",
            "--seed",
            "--num-assistant-tokens",
        ],
        "quantize": ["--block-size", "--samples", "--seq-len", "--accuracy-level", "--eval-tokens", "--vocab-bits"],
    }
    for _ in range(110):
        command = rng.choice(list(flags))
        chosen = rng.sample(flags[command], rng.randint(1, 3))
        argv = [command, d]
        argv += {
            "generate": ["def"],
            "eval": ["--text", afile],
            "quantize": ["-o", str(tmp / "q"), "--mode", "int4"],
        }.get(command, [])
        for flag in chosen:
            argv += [flag, rng.choice(FLAG_VALUES)]
        # Bounded work: what the fuzz does not set stays small.
        if command == "generate" and "--max-new-tokens" not in chosen:
            argv += ["--max-new-tokens", "3"]
        if command == "bench":
            argv += [f for f in ("--new-tokens", "2", "--prompt-tokens", "4", "--repeats", "1") if f not in chosen]
        if command == "eval" and "--window" not in chosen:
            argv += ["--window", "64"]
        if command == "quantize":
            argv += ["--agreement-prompts", "1", "--eval-text", afile, "--eval-tokens", "32"]
        yield argv


def _no_leftovers(parent: Path, before: set[str]) -> list[str]:
    """Names in `parent` that a failed export or quantize left behind (temporary dirs included)."""
    return sorted(set(p.name for p in parent.iterdir()) - before)


def test_cli(jamba_onnx: Path, jamba_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDRT_CACHE", str(tmp_path / "cache"))
    rng = random.Random(SEED + 4)
    cases = Cases()
    work = tmp_path / "work"
    work.mkdir()
    for argv in _cli_cases(jamba_onnx, jamba_dir, work, rng):
        before = set(p.name for p in work.iterdir())
        outcome = cases.run(f"hybridrt {' '.join(map(repr, argv))}", _cli, argv)
        left = _no_leftovers(work, before)
        if outcome != "worked" and left:
            cases.failures.append(f"hybridrt {argv}: a failed run left {left} behind")
        for name in left:
            shutil.rmtree(work / name)
    cases.check(at_least=150)


def _checkpoint_damage() -> Iterator[tuple[str, Callable[[Path], None]]]:
    yield "config.json missing", lambda d: (d / "config.json").unlink()
    yield "config.json garbled", lambda d: (d / "config.json").write_text("{garbled")
    yield "config.json a list", lambda d: (d / "config.json").write_text("[]")
    yield "model_type unknown", lambda d: _edit_json(d / "config.json", model_type="gpt9")
    yield "hidden_size a string", lambda d: _edit_json(d / "config.json", hidden_size="32")
    yield "vocab_size negative", lambda d: _edit_json(d / "config.json", vocab_size=-3)
    yield "weights truncated", lambda d: _truncate(d / "model.safetensors", 0.5)
    yield "weights missing", lambda d: (d / "model.safetensors").unlink()
    yield "weights garbled header", lambda d: _garble(d / "model.safetensors", 0.0, b"\xff" * 16)
    yield "generation_config garbled", lambda d: (d / "generation_config.json").write_text("{")
    yield (
        "generation_config bad type",
        lambda d: (d / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": "many"})),
    )
    yield "tokenizer garbled", lambda d: (d / "tokenizer.json").write_text("{")


def _edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_export_of_damaged_checkpoints_leaves_nothing(jamba_dir: Path, tmp_path: Path) -> None:
    """A failed export raises a HybridrtError and leaves neither the output nor a temporary
    directory behind."""
    cases = Cases()
    for label, damage in _checkpoint_damage():
        src = Path(shutil.copytree(jamba_dir, tmp_path / "src"))
        damage(src)
        out_parent = tmp_path / "out"
        out_parent.mkdir()
        outcome = cases.run(f"export with {label}", hybridrt.export_model, src, out_parent / "m", validate=False)
        if outcome != "worked" and list(out_parent.iterdir()):
            cases.failures.append(f"export with {label}: left {[p.name for p in out_parent.iterdir()]}")
        shutil.rmtree(src)
        shutil.rmtree(out_parent)
    cases.check(at_least=12)
