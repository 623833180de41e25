"""Train the model hybridrt ships (hybridrt/data/default-model) on Python sources.

    python scripts/default_model_corpus.py build/corpus.jsonl.xz        # gather the text once
    python scripts/train_default_model.py --corpus build/corpus.jsonl.xz --minutes 40
    python scripts/train_default_model.py --write-heldout DIR           # only write the held-out texts

Data (scripts/default_model_corpus.py): the standard library and the permissively licensed
packages that `pip install hybridrt[dev]` brings, read from a corpus file so that the text can be
gathered on one machine and the model trained on another (a GPU, with --device cuda). The
held-out stdlib modules and the held-out packages are never trained on (not by the tokenizer
either). Every document is framed as <s> text </s>.

Model: a Jamba (`JambaForCausalLM`) layout built from HF_CONFIG through the same translator
that loads Jamba checkpoints, so config.json and the trained model cannot disagree. It is
trained as hybridrt's reference `HybridForCausalLM`, then written with Hugging Face's tensor
names in float16, evaluated from the written files, and checked against transformers.

The result appears at --out only once complete: it is built in a sibling temp directory and
renamed into place. Logs, a CSV and loss.png go to --log-dir.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers: one core unless told (the CPU machine is shared)

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from default_model_corpus import read_corpus, write_corpus
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import hybridrt
from hybridrt.config import HybridConfig
from hybridrt.graphs.files import atomic_directory
from hybridrt.kinds import MambaParams
from hybridrt.models.decoder import HybridForCausalLM
from hybridrt.models.families.jamba import FAMILY, translate
from hybridrt.models.loading.checkpoint import load_model
from hybridrt.models.mixers.mamba import MambaMixer
from hybridrt.models.state import zero_states

DEFAULT_OUT = Path(hybridrt.__file__).resolve().parent / "data" / "default-model"

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos in HF_CONFIG
PAD, BOS, EOS = 0, 1, 2

# Attention at layers 3 and 7, Mamba elsewhere; one expert (a dense MLP) in every layer. The
# width (TrainConfig.hidden, heads of 32) is chosen per run: ~10 M parameters at hidden 256 and
# 8 k tokens keep the shipped directory under 25 MB in float16.
HF_CONFIG = {
    "model_type": "jamba",
    "architectures": ["JambaForCausalLM"],
    "num_hidden_layers": 8,
    "num_key_value_heads": 2,
    "attn_layer_period": 4,
    "attn_layer_offset": 3,
    "num_experts": 1,
    "num_experts_per_tok": 1,
    "expert_layer_period": 1,
    "expert_layer_offset": 0,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "use_cache": True,
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "dtype": "float16",
}


# The settings every caller gets unless it passes its own (export records them in hybridrt.json):
# prompts start like a training document (<s>), and greedy decoding of a model this small loops
# without a repetition penalty ("return fibonacci(n)" over and over at 1.0; Python at 1.3).
GENERATION = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "repetition_penalty": 1.3}
GENERATION |= {"add_bos_token": True}


@dataclass(frozen=True)
class TrainConfig:
    """Training settings; the command line's defaults come from here."""

    minutes: float = 40.0  # wall-clock budget of the training loop (the cosine spans it)
    steps: int = 0  # if > 0: train exactly this many steps, the cosine spans them
    vocab: int = 8192
    hidden: int = 256  # MLP 3x, attention heads of 32
    seq_len: int = 256
    batch: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 20
    eval_every: int = 100
    eval_windows: int = 16
    threads: int = 1
    device: str = "cpu"  # or "cuda"
    corpus: str = "build/corpus.jsonl.xz"  # written by scripts/default_model_corpus.py if missing
    tokenizer_bytes: int = 30_000_000  # training text sampled for the BPE merges
    out: str = str(DEFAULT_OUT)
    log_dir: str = "build/train-default"


# Corpus -------------------------------------------------------------------------------


def split_docs(rows: list[dict]) -> dict[str, list[str]]:
    """Corpus rows -> {"train": [...], "heldout-stdlib": [...], "heldout-packages": [...]} texts."""
    out: dict[str, list[str]] = {"train": [], "heldout-stdlib": [], "heldout-packages": []}
    for row in rows:
        out[row["split"]].append(row["text"])
    return out


def tokenizer_sample(docs: list[str], max_bytes: int) -> list[str]:
    """Every k-th training document, about max_bytes in all: BPE merges settle long before 90 MB."""
    total = sum(len(d) for d in docs)
    step = max(1, math.ceil(total / max_bytes))
    return docs[::step]


def heldout_text(docs: list[str]) -> str:
    """The held-out set as one text; tokenized as is, it gives the evaluation stream."""
    for d in docs:
        if any(s in d for s in SPECIAL_TOKENS):
            raise SystemExit("a held-out document contains a special-token string; pick other modules")
    return "".join(f"<s>{d}</s>" for d in docs)


# Tokenizer and token streams ----------------------------------------------------------


def train_tokenizer(docs: list[str], vocab: int) -> Tokenizer:
    """Byte-level BPE (no normalizer, no prefix space): any byte string round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    assert [tok.token_to_id(s) for s in SPECIAL_TOKENS] == [PAD, BOS, EOS]
    return tok


def token_stream(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """<s> doc </s> for each document, concatenated: int64 [tokens]."""
    tok.encode_special_tokens = True  # a "<s>" inside source code is text, not a marker
    try:
        encs = tok.encode_batch(docs, add_special_tokens=False)
    finally:
        tok.encode_special_tokens = False
    return torch.cat([torch.tensor([BOS, *e.ids, EOS]) for e in encs])


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[n, seq_len + 1] windows overlapping by one token, so every token is a target once."""
    return stream.unfold(0, seq_len + 1, seq_len)


# Model --------------------------------------------------------------------------------


def build_model(vocab: int, tc: TrainConfig) -> tuple[dict, HybridConfig, HybridForCausalLM]:
    size = {"hidden_size": tc.hidden, "intermediate_size": 3 * tc.hidden, "num_attention_heads": tc.hidden // 32}
    hf = dict(HF_CONFIG, vocab_size=vocab, **size)
    cfg = translate(hf)
    torch.manual_seed(tc.seed)
    model = HybridForCausalLM(cfg)
    init_weights(model, cfg, hf["initializer_range"])
    return hf, cfg, model


@torch.no_grad()
def init_weights(model: HybridForCausalLM, cfg: HybridConfig, std: float) -> None:
    """GPT-2 style normal init (residual outputs scaled by depth) and Mamba's S4D-real A and dt."""
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", ".D")):
            p.fill_(1.0)
        elif name.endswith("A_log"):
            p.copy_(torch.log(torch.arange(1, cfg.mamba_d_state + 1, dtype=torch.float32)).expand_as(p))
        elif name.endswith("dt_proj.weight"):
            rank = cfg.params(MambaParams).dt_rank(cfg.hidden_size)
            p.uniform_(-(rank**-0.5), rank**-0.5)
        elif name.endswith("dt_proj.bias"):  # softplus(bias) log-uniform in [1e-3, 1e-1] (Mamba)
            dt = torch.exp(torch.empty_like(p).uniform_(math.log(1e-3), math.log(1e-1)))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
            p.normal_(0.0, std / math.sqrt(2 * cfg.num_layers))
        elif name.endswith("conv1d.weight") or name.endswith("conv1d.bias"):
            pass  # PyTorch's default fan-in init, as Mamba
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, std)


@contextlib.contextmanager
def stepped_scan(model: HybridForCausalLM) -> Iterator[None]:
    """Every Mamba mixer steps its state over time (MambaMixer.stepped_scan) inside the block:
    the reference chunked scan is shaped for export and its backward is ~10x slower."""
    mixers = [m for m in model.modules() if isinstance(m, MambaMixer)]
    for m in mixers:
        m.stepped_scan = True
    try:
        yield
    finally:
        for m in mixers:
            m.stepped_scan = False


def logits_of(model: HybridForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """ids [b, l] -> logits [b, l, v] from a fresh state, on the device of ids."""
    b, l = ids.shape
    states = [s.to(ids.device) for s in zero_states(model.config, b, l)]
    return model(ids, torch.zeros(b, dtype=torch.long, device=ids.device), None, states)[0]


@torch.no_grad()
def check_stepped_scan(model: HybridForCausalLM, ids: torch.Tensor) -> float:
    ref = logits_of(model, ids)
    with stepped_scan(model):
        stepped = logits_of(model, ids)
    diff = (ref - stepped).abs().max().item()
    if diff > 1e-3:
        raise SystemExit(f"training scan disagrees with the reference model: max |logit diff| {diff:.2e}")
    return diff


# Training -----------------------------------------------------------------------------


def batches(n: int, batch: int, seed: int) -> Iterator[torch.Tensor]:
    """Window indices, a seeded permutation per epoch: the data order depends only on the seed."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n - batch + 1, batch):
            yield perm[i : i + batch]


def lr_at(tc: TrainConfig, step: int, progress: float) -> float:
    """Linear warmup, then cosine from lr to min_lr_ratio * lr as progress goes 0 -> 1."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * cos)


def optimizer(model: HybridForCausalLM, tc: TrainConfig) -> torch.optim.Optimizer:
    decay, keep = [], []
    for name, p in model.named_parameters():
        is_matrix = p.dim() >= 2 and not name.endswith("A_log")
        (decay if is_matrix else keep).append(p)
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def nll(model: HybridForCausalLM, wins: torch.Tensor, batch: int) -> tuple[float, int]:
    """Summed next-token NLL (nats) over windows [n, l+1] and the number of targets (<s> excluded)."""
    total, count = 0.0, 0
    for i in range(0, len(wins), batch):
        w = wins[i : i + batch]
        logits = logits_of(model, w[:, :-1])
        target = w[:, 1:].masked_fill(w[:, 1:] == BOS, -100)
        total += F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum").item()
        count += int((target != -100).sum())
    return total, count


def heldout_figures(model: HybridForCausalLM, stream: torch.Tensor, n_bytes: int, tc: TrainConfig) -> dict:
    """Loss over the whole held-out stream; bits per byte = total NLL in bits / UTF-8 bytes of the text."""
    full = windows(stream, tc.seq_len)
    tail = stream[len(full) * tc.seq_len :]
    total, count = nll(model, full, tc.batch)
    if len(tail) > 1:
        t, c = nll(model, tail.unsqueeze(0), 1)
        total, count = total + t, count + c
    return {
        "heldout_loss_nats_per_token": round(total / count, 4),
        "heldout_bits_per_byte": round(total / math.log(2) / n_bytes, 4),
        "heldout_tokens": count,
        "heldout_bytes": n_bytes,
    }


def train(model: HybridForCausalLM, train_wins: torch.Tensor, eval_wins: torch.Tensor, tc: TrainConfig) -> dict:
    log_dir = Path(tc.log_dir)
    opt = optimizer(model, tc)
    order = batches(len(train_wins), tc.batch, tc.seed)
    budget = tc.minutes * 60
    rows, recent, step, t0 = [], [], 0, time.time()
    with open(log_dir / "train.csv", "w", newline="") as f, stepped_scan(model):
        out = csv.writer(f)
        out.writerow(["step", "tokens", "elapsed_s", "lr", "train_loss", "heldout_loss"])
        while True:
            elapsed = time.time() - t0
            if (tc.steps and step >= tc.steps) or (not tc.steps and elapsed >= budget):
                break
            lr = lr_at(tc, step, step / tc.steps if tc.steps else elapsed / budget)
            for g in opt.param_groups:
                g["lr"] = lr
            w = train_wins[next(order)]
            model.train()
            logits = logits_of(model, w[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            step += 1
            recent.append(loss.item())
            if step % tc.log_every == 0 or step == tc.steps:
                held = ""
                if step % tc.eval_every == 0:
                    model.eval()
                    t, c = nll(model, eval_wins, tc.batch)
                    held = f"{t / c:.4f}"
                elapsed, train_loss = time.time() - t0, sum(recent) / len(recent)
                tokens = step * tc.batch * tc.seq_len
                rows.append((step, tokens, elapsed, lr, train_loss, held))
                out.writerow([step, tokens, f"{elapsed:.1f}", f"{lr:.3e}", f"{train_loss:.4f}", held])
                f.flush()
                print(
                    f"step {step:6d}  tokens {tokens / 1e6:7.3f}M  lr {lr:.2e}  loss {train_loss:.4f}"
                    f"{'  heldout ' + held if held else ''}  {tokens / elapsed:6.0f} tok/s  {elapsed / 60:5.1f} min",
                    flush=True,
                )
                recent = []
    model.eval()
    elapsed = time.time() - t0
    plot(rows, log_dir / "loss.png")
    last = [r[4] for r in rows[-5:]] or recent
    return {
        "steps": step,
        "tokens_seen": step * tc.batch * tc.seq_len,
        "train_seconds": round(elapsed, 1),
        "train_tokens_per_second": round(step * tc.batch * tc.seq_len / elapsed, 1),
        "train_loss": round(sum(last) / max(1, len(last)), 4),
    }


def plot(rows: list[tuple], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r[1] / 1e6 for r in rows], [r[4] for r in rows], label="train")
    held = [(r[1] / 1e6, float(r[5])) for r in rows if r[5]]
    if held:
        ax.plot(*zip(*held, strict=True), "o-", label="held-out (sample)")
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Writing the checkpoint ---------------------------------------------------------------


def hf_name(name: str, cfg: HybridConfig) -> str:
    """Our parameter name -> transformers' Jamba name (the inverse of the family's renames)."""
    if name.startswith("model.norm."):
        return name.replace("model.norm.", "model.final_layernorm.", 1)
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        kind = cfg.layer_types[int(parts[2])]
        swap = {"mixer": "mamba" if kind == "mamba" else "self_attn", "ffn": "feed_forward"}
        swap |= {"input_norm": "input_layernorm", "ffn_norm": "pre_ff_layernorm"}
        swap |= {"dt_norm": "dt_layernorm", "b_norm": "b_layernorm", "c_norm": "c_layernorm"}
        parts = parts[:3] + [swap.get(p, p) for p in parts[3:]]
    return ".".join(parts)


def hf_state_dict(model: HybridForCausalLM) -> dict[str, torch.Tensor]:
    cfg = model.config
    out = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        new = hf_name(name, cfg)
        assert FAMILY.rename(new) == name, f"{new} would load as {FAMILY.rename(new)}, not {name}"
        out[new] = p.detach().to(torch.float16).contiguous()
    return out


def write_checkpoint(path: Path, model: HybridForCausalLM, hf: dict, tok: Tokenizer) -> None:
    save_file(hf_state_dict(model), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "model.safetensors").chmod(0o644)  # safetensors creates it owner-only
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    tok.save(str(path / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": hf["max_position_embeddings"],
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")


@torch.no_grad()
def transformers_parity(path: Path, model: HybridForCausalLM, ids: torch.Tensor) -> float | None:
    """Max |logit difference| between transformers' JambaForCausalLM and our model, both float32."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    diff = (theirs(ids).logits - logits_of(model, ids)).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"{path}: transformers and hybridrt disagree: max |logit diff| {diff:.2e}")
    return diff


def sources_table(header: dict) -> str:
    rows = ["| source | version | licence | files | MB | used for |", "| --- | --- | --- | --- | --- | --- |"]
    for src in header["sources"]:
        use = ", ".join(src.get("splits", [])) or "none (no usable files)"
        rows.append(f"| {src['name']} | {src['version']} | {src['licence'][:60]} | {src.get('files', 0)} "
                    f"| {src.get('bytes', 0) / 1e6:.2f} | {use} |")  # fmt: skip
    return "\n".join(rows)


def readme(hf: dict, info: dict, header: dict) -> str:
    t = info
    std, pkg = t["heldout-stdlib"], t["heldout-packages"]
    layers = ", ".join(f"{i}:{k}" for i, k in enumerate(translate(hf).layer_types))
    skipped = "; ".join(header["skipped"])
    return f"""# hybridrt default model

A small Jamba-layout hybrid (Mamba + attention) language model of Python source code,
shipped with hybridrt so that export, runtime and examples work without a download. It
is a test, demo and draft model, not a useful code model.

- Architecture: `JambaForCausalLM`, {t["parameters"]:,} parameters (embeddings tied),
  hidden {hf["hidden_size"]}, dense MLP {hf["intermediate_size"]}, {hf["num_attention_heads"]} heads /
  {hf["num_key_value_heads"]} KV heads (no positional encoding, as Jamba), Mamba d_state
  {hf["mamba_d_state"]}, d_conv {hf["mamba_d_conv"]}, expand {hf["mamba_expand"]}; {hf["num_hidden_layers"]} layers:
  {layers}.
  Weights in float16 with transformers' tensor names. Trained as hybridrt's reference
  `HybridForCausalLM`, its Mamba scan stepped over time during training (same math, checked
  against the reference before training).
- Tokenizer: byte-level BPE, {hf["vocab_size"]} tokens, trained on a sample of the training split;
  `<pad>` 0, `<s>` 1, `</s>` 2. Training documents were framed as `<s>` text `</s>`, so
  prompts should start with `<s>`.
- Data (`scripts/default_model_corpus.py`): the `*.py` files of the CPython {t["corpus_python"]} standard
  library (test suites left out) and of the permissively licensed packages that `pip install
  hybridrt[dev]` installs, vendored copies dropped, identical files kept once, at most
  {header["per_package_bytes"] / 1e6:.0f} MB per package: {t["train_files"]:,} files, {t["train_bytes"]:,} bytes,
  {t["train_tokens"]:,} tokens for training. Left out: {skipped}.
  Held out, never trained on: the stdlib modules {", ".join(header["heldout_stdlib"])}
  ({t["heldout_files"]["heldout-stdlib"]} files) and the whole packages {", ".join(header["heldout_packages"])}
  ({t["heldout_files"]["heldout-packages"]} files).
- Training: `{t["command"]}`, {t["steps"]} steps of {t["batch"]} x {t["seq_len"]} tokens
  ({t["tokens_seen"]:,} tokens seen), AdamW (betas 0.9/0.95, weight decay {t["weight_decay"]}),
  peak lr {t["lr"]}, {t["warmup"]} warmup steps then cosine to {t["min_lr_ratio"]} x peak
  over the time budget, gradient clipping {t["grad_clip"]}, seed {t["seed"]}, float32 (TF32 matmuls on a GPU) on
  {t["device"]}, {t["train_seconds"] / 60:.1f} minutes ({t["train_tokens_per_second"]:,.0f} tokens/s).

## Results

| figure | stdlib held-out modules | held-out packages (never-seen projects) |
| --- | --- | --- |
| loss (nats/token) | {std["heldout_loss_nats_per_token"]} | {pkg["heldout_loss_nats_per_token"]} |
| bits per byte | {std["heldout_bits_per_byte"]} | {pkg["heldout_bits_per_byte"]} |
| target tokens | {std["heldout_tokens"]:,} | {pkg["heldout_tokens"]:,} |
| UTF-8 bytes | {std["heldout_bytes"]:,} | {pkg["heldout_bytes"]:,} |

Train loss over the last logged steps: {t["train_loss"]} nats/token. Held-out figures cover
the whole held-out texts, scored from the float16 weights as written, in windows of
{t["seq_len"]} tokens. Bits per byte = total negative log-likelihood in bits (the `</s>` targets
included, `<s>` excluded) / UTF-8 bytes of the documents. Rebuild the held-out texts
(documents framed as `<s>`...`</s>`) with `python scripts/train_default_model.py --write-heldout DIR`
from the same corpus file.

transformers' `JambaForCausalLM` and hybridrt's reference model agree on these weights to
{t["transformers_max_logit_diff"]} (max |logit difference|, float32).

## Sources and licences

{sources_table(header)}
"""


# Main ---------------------------------------------------------------------------------


def parse_args() -> tuple[TrainConfig, Path | None]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(TrainConfig):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ap.add_argument("--write-heldout", type=Path, metavar="DIR", help="write the held-out texts and exit")
    args = vars(ap.parse_args())
    heldout_dir = args.pop("write_heldout")
    return TrainConfig(**args), heldout_dir


def load_corpus(tc: TrainConfig) -> tuple[dict, dict[str, list[str]]]:
    path = Path(tc.corpus)
    if not path.exists():
        print(f"writing the corpus to {path}", flush=True)
        write_corpus(path)
    header, rows = read_corpus(path)
    return header, split_docs(rows)


def main() -> None:
    tc, heldout_dir = parse_args()
    header, docs = load_corpus(tc)
    held_sets = ("heldout-stdlib", "heldout-packages")
    texts = {name: heldout_text(docs[name]) for name in held_sets}
    if heldout_dir is not None:
        heldout_dir.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (heldout_dir / f"{name}.txt").write_text(text, encoding="utf-8")
            print(f"{heldout_dir / name}.txt: {len(docs[name])} files, {len(text.encode())} bytes")
        return
    torch.set_num_threads(tc.threads)
    torch.set_num_interop_threads(tc.threads)
    torch.backends.cuda.matmul.allow_tf32 = True  # the scan stays float32; TF32 only in matmuls
    device = torch.device(tc.device)
    out, log_dir = Path(tc.out).resolve(), Path(tc.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    tok = train_tokenizer(tokenizer_sample(docs["train"], tc.tokenizer_bytes), tc.vocab)
    train_stream = token_stream(tok, docs["train"])
    held = {name: token_stream(tok, docs[name]) for name in held_sets}
    for name in held_sets:
        assert torch.equal(held[name], torch.tensor(tok.encode(texts[name], add_special_tokens=False).ids))
    print(f"tokenizer + streams: {time.time() - t_start:.0f}s; train {len(train_stream):,} tokens, held-out "
          + ", ".join(f"{n} {len(s):,}" for n, s in held.items()), flush=True)  # fmt: skip

    hf, cfg, model = build_model(tok.get_vocab_size(), tc)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    held_wins = {name: windows(s, tc.seq_len).to(device) for name, s in held.items()}
    stdlib_wins = held_wins["heldout-stdlib"]
    pick = torch.linspace(0, len(stdlib_wins) - 1, tc.eval_windows).long()
    scan_diff = check_stepped_scan(model, stdlib_wins[:2, :64])
    print(f"{n_params:,} parameters; layers {cfg.layer_types}; training scan matches ({scan_diff:.1e})", flush=True)

    info = train(model, windows(train_stream, tc.seq_len).to(device), stdlib_wins[pick], tc)

    with atomic_directory(out) as tmp:  # a half-written model never appears at `out`
        write_checkpoint(tmp, model, hf, tok)
        written, _ = load_model(tmp)
        written.to(device)
        t_eval = time.time()
        with stepped_scan(written):
            for name in held_sets:
                n_bytes = sum(len(d.encode()) for d in docs[name])
                info[name] = heldout_figures(written, held[name].to(device), n_bytes, tc)
        print(f"held-out evaluation: {time.time() - t_eval:.0f}s {info}", flush=True)
        written.cpu()
        probe = held["heldout-stdlib"][:128].unsqueeze(0)
        check_stepped_scan(written, probe)
        hf_diff = transformers_parity(tmp, written, probe)

        info |= {
            "parameters": n_params,
            "command": " ".join(["python", *sys.argv]),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{tc.threads} CPU thread(s)",
            "train_files": len(docs["train"]),
            "train_bytes": sum(len(d.encode()) for d in docs["train"]),
            "train_tokens": len(train_stream),
            "heldout_files": {name: len(docs[name]) for name in held_sets},
            "corpus_python": header["python"],
            "transformers_max_logit_diff": f"{hf_diff:.1e}" if hf_diff is not None else "not checked",
            "total_seconds": round(time.time() - t_start, 1),
        }
        settings = ("seq_len", "batch", "lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip", "seed", "minutes")
        info |= {k: getattr(tc, k) for k in (*settings, "threads")}
        (tmp / "config.json").write_text(json.dumps(dict(hf, hybridrt_training=info), indent=2) + "\n")
        (tmp / "README.md").write_text(readme(hf, info, header))
        (log_dir / "summary.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
