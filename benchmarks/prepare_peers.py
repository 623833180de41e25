"""The peers' model files for benchmarks/bench_peers.py, made reproducibly from the bench checkpoints.

python benchmarks/prepare_peers.py --work build/bench --out build/peers --src llama_cpp_python-0.3.36.tar.gz

For each bench checkpoint (WORK/<model>/hf, never modified) a copy OUT/<model>/hf with a shared
sentencepiece tokenizer (trained once on the Python standard library's sources), then:
llama.cpp GGUF files OUT/<model>/{f32,q8_0,q4_0}.gguf (the converter from llama-cpp-python's
source distribution, extracted under OUT/src; quantization through llama_cpp), and
onnxruntime-genai exports OUT/llama-125m/genai-{fp32,int8,int4} (2 intra-op threads).
Each output is smoke-checked in its own process (load, 4 greedy tokens); OUT/peers.json records
what was made, what passed, and each failure's last line. Steps whose outputs exist are skipped.
Finally prints the bench_peers.py arguments that use the outputs. See ../shared/bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODELS = ("jamba-125m", "granite-h-125m", "llama-125m")
QUANTS = ("q8_0", "q4_0")
GENAI_PRECISIONS = ("fp32", "int8", "int4")
GENAI_SUPPORTED = ("llama-125m",)  # the builder refuses Jamba and crashes on Mamba2: one fp32 try records why
GENAI_THREADS = 2
VOCAB = 32000
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
CORPUS_BYTES = 24_000_000  # characters: enough distinct text for 32000 BPE pieces, trained in seconds

Record = dict[str, Any]


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> str | None:
    """Run a command with its output in `log`; None on success, else the last line of its output."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode == 0:
        return None
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return (lines[-1] if lines else f"exit status {done.returncode}")[:300]


def extract_converter(tarball: Path, src: Path) -> Path:
    """The converter, its `conversion` package and gguf-py from the sdist; returns the llama.cpp folder."""
    with tarfile.open(tarball) as tar:
        first = tar.next()
        assert first is not None, f"{tarball} is empty"
        root = first.name.split("/")[0]
        llama = src / root / "vendor" / "llama.cpp"
        if not (llama / "convert_hf_to_gguf.py").exists():
            prefix = f"{root}/vendor/llama.cpp/"
            wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
            members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
            tar.extractall(src, members=members, filter="data")
    return llama


def corpus(path: Path) -> Path:
    """Sorted standard-library Python sources (not site-packages), cut at CORPUS_BYTES: same text every run."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    size = 0
    with path.open("w", encoding="utf-8") as out:
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            out.write(text)
            size += len(text)
            if size >= CORPUS_BYTES:
                break
    return path


@contextlib.contextmanager
def sentencepiece_proto() -> Iterator[None]:
    """transformers' own sentencepiece_model_pb2 in place of the sentencepiece wheel's.

    The wheel's module is generated for a newer protobuf than the one installed, and the
    import fails; transformers then falls back to reading tokenizer.model as tiktoken.
    """
    from transformers.utils import sentencepiece_model_pb2_new

    name = "sentencepiece.sentencepiece_model_pb2"
    saved = sys.modules.get(name)
    sys.modules[name] = sentencepiece_model_pb2_new
    try:
        yield
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def train_tokenizer(directory: Path) -> Path:
    """Llama-style sentencepiece BPE (byte fallback, unk/bos/eos 0/1/2) plus transformers' tokenizer files."""
    if all((directory / f).exists() for f in TOKENIZER_FILES[:3]):
        return directory
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    text = corpus(directory / "corpus.txt")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(directory / "tokenizer"),
        model_type="bpe",
        vocab_size=VOCAB,
        byte_fallback=True,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        character_coverage=0.9999,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        shuffle_input_sentence=False,
        max_sentence_length=16384,
        num_threads=2,
        minloglevel=2,
    )
    (directory / "tokenizer.vocab").unlink()
    text.unlink()
    # LlamaTokenizerFast(vocab_file=...) yields a 3-token vocabulary in transformers 5; from_pretrained converts.
    with sentencepiece_proto():
        tok = LlamaTokenizer.from_pretrained(directory)
    if len(tok) != VOCAB:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, expected {VOCAB}")
    tok.save_pretrained(directory)
    return directory


def granite_config_fixes(config: dict[str, Any]) -> dict[str, Any]:
    """What the GGUF converter and llama.cpp need of a transformers-5 granitemoehybrid config.

    The converter finds attention layers by the name "attention" (transformers 5 writes
    "full_attention"/"linear_attention"), and a dense model with num_experts_per_tok 2 but
    num_local_experts 0 aborts llama.cpp (`n_expert_used_max <= n_expert`).
    """
    names = {"full_attention": "attention", "linear_attention": "mamba"}
    config["layer_types"] = [names.get(t, t) for t in config["layer_types"]]
    if not config.get("num_local_experts"):
        config["num_local_experts"] = 0
        config["num_experts_per_tok"] = 0
    return config


CONFIG_FIXES = {"granite-h-125m": granite_config_fixes}


def copy_checkpoint(bench_hf: Path, dest: Path, tokenizer: Path, name: str) -> Path:
    """OUT/<model>/hf: hard-linked weights (symlink across filesystems), one file or shards and
    their index as the checkpoint has them; copied configs, the shared tokenizer."""
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(bench_hf.glob("*.safetensors")) + sorted(bench_hf.glob("model.safetensors.index.json"))
    if not files:
        raise FileNotFoundError(f"{bench_hf} has no .safetensors weights")
    for src in files:
        if not (dest / src.name).exists():
            try:
                os.link(src, dest / src.name)
            except OSError:
                (dest / src.name).symlink_to(src.resolve())
    for f in ("config.json", "generation_config.json"):
        if (bench_hf / f).exists():
            shutil.copyfile(bench_hf / f, dest / f)
    if fix := CONFIG_FIXES.get(name):
        config = fix(json.loads((dest / "config.json").read_text()))
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in TOKENIZER_FILES:
        if (tokenizer / f).exists():
            shutil.copyfile(tokenizer / f, dest / f)
    return dest


def set_gguf_flag(gguf_py: Path, path: Path, key: str, value: int) -> None:
    """Overwrite one scalar metadata value of a GGUF file in place (the key must already be there)."""
    if str(gguf_py) not in sys.path:
        sys.path.insert(0, str(gguf_py))  # the converter's own gguf-py, not a PyPI `gguf` of another version
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    field = reader.get_field(key)
    if field is None:
        raise KeyError(f"{path.name} has no {key}")
    field.parts[field.data[0]][0] = value
    reader.data.flush()


def granite_gguf_fixes(gguf_py: Path, path: Path, config: dict[str, Any]) -> None:
    """The converter marks a Mamba2 hybrid as RoPE-free unless it is Bamba; the bench granite-h uses RoPE."""
    set_gguf_flag(gguf_py, path, "granitehybrid.rope.scaling.finetuned", 1)
    # The RoPE-free path also widened the context to 2**20; give back the trained one.
    set_gguf_flag(gguf_py, path, "granitehybrid.context_length", config["max_position_embeddings"])


GGUF_FIXES = {"granite-h-125m": granite_gguf_fixes}

# The converter reads hparams through AutoConfig, which renames layer_types back to the transformers-5
# spelling; models in RAW_CONFIG have it read the copy's config.json as written instead.
RAW_CONFIG = ("granite-h-125m",)
CONVERT = """
import json, runpy, sys
from pathlib import Path
llama, raw = Path(sys.argv[1]), sys.argv[2] == "True"
sys.argv = [str(llama / "convert_hf_to_gguf.py"), *sys.argv[3:]]
sys.path[:0] = [str(llama), str(llama / "gguf-py")]
from conversion import ModelBase
def load_hparams(dir_model, is_mistral_format):
    return json.loads((Path(dir_model) / "config.json").read_text())
if raw:
    ModelBase.load_hparams = staticmethod(load_hparams)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3].upper())
params.nthread = 2
status = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(f"llama_model_quantize returned {status}" if status else 0)
"""


def make_gguf(llama: Path, hf: Path, out: Path, name: str, logs: Path) -> dict[str, str | None]:
    """f32 from the converter (with the model's GGUF fixes), then q8_0 and q4_0; per file, None or the error."""
    f32 = out / "f32.gguf"
    made: dict[str, str | None] = {}
    if not f32.exists():
        tmp = out / "f32.gguf.part"
        cmd = [sys.executable, "-c", CONVERT, str(llama), str(name in RAW_CONFIG), str(hf)]
        cmd += ["--outtype", "f32", "--outfile", str(tmp)]
        made["f32"] = run(cmd, logs / f"{name}-convert.log")
        if made["f32"] is None:
            if fix := GGUF_FIXES.get(name):
                fix(llama / "gguf-py", tmp, json.loads((hf / "config.json").read_text()))
            tmp.rename(f32)
    made.setdefault("f32", None)
    for q in QUANTS:
        path = out / f"{q}.gguf"
        if not f32.exists():
            made[q] = "no f32.gguf to quantize"
            continue
        if not path.exists():
            tmp = out / f"{q}.gguf.part"
            made[q] = run([sys.executable, "-c", QUANTIZE, str(f32), str(tmp), q], logs / f"{name}-{q}.log")
            if made[q] is not None:
                tmp.unlink(missing_ok=True)
                continue
            tmp.rename(path)
        made[q] = None
    return made


def make_genai(hf: Path, out: Path, precision: str, logs: Path) -> str | None:
    """onnxruntime-genai's builder on the copy, then GENAI_THREADS intra-op threads; None or the error."""
    config = out / "genai_config.json"
    if not config.exists():
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
        cmd += ["-p", precision, "-e", "cpu", "-c", str(out.parent / "genai-cache")]
        if err := run(cmd, logs / f"{hf.parent.name}-genai-{precision}.log"):
            shutil.rmtree(out, ignore_errors=True)
            return err
    doc = json.loads(config.read_text())
    options = doc["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = GENAI_THREADS
    config.write_text(json.dumps(doc, indent=4) + "\n")
    return None


SMOKE_GGUF = """
import sys, llama_cpp, numpy as np
llm = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=2, verbose=False)
llm.eval(llm.tokenize(b"def main():"))
for _ in range(4):
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
    llm.eval([int(logits.argmax())])
print("tokens", llm.n_tokens)
"""

SMOKE_GENAI = """
import sys, onnxruntime_genai as og
model = og.Model(sys.argv[1])
ids = og.Tokenizer(model).encode("def main():")
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + 4, min_length=len(ids) + 4)
gen = og.Generator(model, params)
gen.append_tokens(ids)
n = 0
while not gen.is_done():
    gen.generate_next_token()
    n += 1
assert n == 4, n
print("tokens", n)
"""


def smoke(code: str, path: Path, log: Path) -> str | None:
    """Load and generate 4 tokens in a child process (llama.cpp aborts the process on bad models)."""
    env = os.environ | {"OMP_NUM_THREADS": "2"}
    return run([sys.executable, "-c", code, str(path)], log, env)


def record(path: Path, error: str | None, smoke_error: str | None = None) -> Record:
    """One peers.json entry: the output, whether it was made, and whether it passed the smoke check."""
    entry: Record = {"path": str(path), "made": error is None}
    if error is not None:
        entry["error"] = error
    else:
        entry["size_bytes"] = sum(p.stat().st_size for p in [path, *path.rglob("*")] if p.is_file())
        entry["smoke"] = "pass" if smoke_error is None else "fail"
        if smoke_error is not None:
            entry["smoke_error"] = smoke_error
    return entry


def bench_args(entries: list[Record]) -> list[str]:
    """bench_peers.py arguments for every output that passed its smoke check."""
    gguf = [f"{e['model']}:{e['mode']}={e['path']}" for e in entries if e["runtime"] == "llama.cpp" and ok(e)]
    genai = [f"{e['model']}:{e['mode']}={e['path']}" for e in entries if e["runtime"] == "onnxruntime-genai" and ok(e)]
    return (["--gguf", *gguf] if gguf else []) + (["--genai", *genai] if genai else [])


def ok(entry: Record) -> bool:
    """Made and smoke-checked."""
    return bool(entry["made"]) and entry.get("smoke") == "pass"


def merge(path: Path, entries: list[Record]) -> list[Record]:
    """A run over some models keeps the other models' entries of an earlier peers.json."""
    done = {e["model"] for e in entries}
    earlier = json.loads(path.read_text()) if path.exists() else []
    return [e for e in earlier if e["model"] not in done] + entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("build/bench"), help="holds <model>/hf bench checkpoints")
    ap.add_argument("--out", type=Path, default=Path("build/peers"))
    ap.add_argument("--src", type=Path, required=True, help="llama-cpp-python source distribution (.tar.gz)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--genai-models", nargs="*", default=list(MODELS), help="models to try the genai builder on")
    args = ap.parse_args()
    out: Path = args.out.resolve()
    logs = out / "logs"
    llama = extract_converter(args.src, out / "src")
    tokenizer = train_tokenizer(out / "tokenizer")
    entries: list[Record] = []
    for name in args.models:
        hf = copy_checkpoint((args.work / name / "hf").resolve(), out / name / "hf", tokenizer, name)
        for mode, error in make_gguf(llama, hf, out / name, name, logs).items():
            path = out / name / f"{mode}.gguf"
            check = None if error else smoke(SMOKE_GGUF, path, logs / f"{name}-{mode}-smoke.log")
            entries.append({"model": name, "runtime": "llama.cpp", "mode": mode} | record(path, error, check))
            print(json.dumps(entries[-1]), flush=True)
        if name not in args.genai_models:
            continue
        for p in GENAI_PRECISIONS if name in GENAI_SUPPORTED else GENAI_PRECISIONS[:1]:
            path = out / name / f"genai-{p}"
            error = make_genai(hf, path, p, logs)
            check = None if error else smoke(SMOKE_GENAI, path, logs / f"{name}-genai-{p}-smoke.log")
            entries.append({"model": name, "runtime": "onnxruntime-genai", "mode": p} | record(path, error, check))
            print(json.dumps(entries[-1]), flush=True)
    entries = merge(out / "peers.json", entries)
    (out / "peers.json").write_text(json.dumps(entries, indent=2) + "\n")
    print("python benchmarks/bench_peers.py " + " ".join(bench_args(entries)))


if __name__ == "__main__":
    main()
