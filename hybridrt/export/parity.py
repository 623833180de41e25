"""Parity of an exported graph against the PyTorch reference, measured right after export.

Prompt lengths other than the traced one (1, 7, 64, 300; 300 spans several scan chunks) at
batch 2 from fresh states; a 17-token chunk over random states whose rows have seen
different numbers of tokens; then 16 decode steps from such states, in which each side
carries its own states. Figures land in hybridrt.json; above tolerance the export fails.
"""

from __future__ import annotations

import ctypes
import gc
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..graphs.contract import GraphContract
from ..graphs.feeds import state_shape
from ..models.decoder import HybridForCausalLM
from ..models.state import random_states, zero_tensors
from ..runtime.providers import threads_from_env
from .trace import GraphModule, feeds

PROMPT_LENGTHS = (1, 7, 64, 300)
DECODE_STEPS = 16
TOLERANCE = 1e-4

Runner = Callable[[tuple[torch.Tensor, ...]], list[np.ndarray]]


def ort_runner(path: Path, model: HybridForCausalLM, contract: GraphContract | None = None) -> Runner:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), _options(), providers=["CPUExecutionProvider"])
    names = (contract or GraphContract.of(model.config)).input_names

    def run(args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        return list(sess.run(None, {n: a.numpy() for n, a in zip(names, args)}))

    return run


def _options() -> Any:
    """The check's session options: errors only, HYBRIDRT_THREADS threads where set."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads_from_env() or 0
    return opts


def torch_runner(fn: Callable[..., Any]) -> Runner:
    def run(args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in fn(*args)]

    return run


def _reference(model: HybridForCausalLM, contract: GraphContract) -> Runner:
    return torch_runner(GraphModule(model, contract))


def _errors(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], kv: Sequence[bool], lengths: np.ndarray
) -> tuple[float, float]:
    """Worst logits and state differences (_state_error)."""
    logits = float(np.abs(a[0] - b[0]).max())
    states = max([_state_error(x, y, is_kv, lengths) for x, y, is_kv in zip(a[1:], b[1:], kv)], default=0.0)
    return logits, states


def _state_error(x: np.ndarray, y: np.ndarray, is_kv: bool, lengths: np.ndarray) -> float:
    """Worst difference of one state; a KV buffer counts up to each row's length (past that
    the graph may leave what the buffer held: nothing reads it)."""
    d = np.abs(x - y)
    if is_kv:
        d = d * (np.arange(d.shape[2])[None, :] < lengths[:, None])[:, None, :, None]
    return float(d.max()) if d.size else 0.0


def _summarized(report: dict[str, Any]) -> dict[str, Any]:
    """The worst case of every kind, and whether it is within TOLERANCE."""
    cases = report["prompt"] + [report["decode"]]
    report["max_abs_logits"] = max(c["max_abs_logits"] for c in cases)
    report["max_abs_state"] = max(c["max_abs_state"] for c in cases)
    report["passed"] = report["max_abs_logits"] <= TOLERANCE and report["max_abs_state"] <= TOLERANCE
    return report


def measure_parity(
    model: HybridForCausalLM,
    runner: Runner,
    lengths: Sequence[int] = PROMPT_LENGTHS,
    seed: int = 0,
    decode_steps: int = DECODE_STEPS,
    contract: GraphContract | None = None,
) -> dict[str, Any]:
    cfg = model.config
    contract = contract or GraphContract.of(cfg)
    ref = _reference(model, contract)
    g = torch.Generator().manual_seed(seed)
    kv = contract.kv
    lengths = [l for l in lengths if l <= cfg.max_position_embeddings]
    decode_steps = min(decode_steps, cfg.max_position_embeddings - 9 - 17)
    report: dict[str, Any] = {"tolerance": TOLERANCE, "prompt": [], "decode": {}}
    for l in lengths:
        ids = torch.randint(0, cfg.vocab_size, (2, l), generator=g)
        args = feeds(contract, ids, 0, zero_tensors(contract, 2, l + 5))
        e_logits, e_states = _errors(runner(args), ref(args), kv, np.array([l, l]))
        report["prompt"].append({"batch": 2, "seq": l, "max_abs_logits": e_logits, "max_abs_state": e_states})
    # Rows that have seen 3 and 9 tokens (random states): a chunk, then decode steps in which
    # each side carries its own states, with logits of the last position only.
    pasts = torch.tensor([3, 9])
    capacity = 9 + 17 + decode_steps + 3
    states = random_states(contract, 2, capacity, g)
    ids = torch.randint(0, cfg.vocab_size, (2, 17), generator=g)
    args = feeds(contract, ids, pasts, states)
    e_logits, e_states = _errors(runner(args), ref(args), kv, pasts.numpy() + 17)
    report["prompt"].append(
        {"batch": 2, "seq": 17, "pasts": [3, 9], "max_abs_logits": e_logits, "max_abs_state": e_states}
    )
    states_r = states_g = states
    worst = [0.0, 0.0]
    for _ in range(decode_steps + 1):
        args_r, args_g = feeds(contract, ids, pasts, states_r, False), feeds(contract, ids, pasts, states_g, False)
        out_r, out_g = ref(args_r), runner(args_g)
        e = _errors(out_g, out_r, kv, pasts.numpy() + ids.shape[1])
        worst = [max(worst[0], e[0]), max(worst[1], e[1])]
        states_r = [torch.from_numpy(x) for x in out_r[1:]]
        states_g = [torch.from_numpy(np.ascontiguousarray(x)) for x in out_g[1:]]
        pasts = pasts + ids.shape[1]
        ids = torch.from_numpy(out_r[0][:, -1].argmax(-1)).unsqueeze(1)
    report["decode"] = {"batch": 2, "steps": decode_steps, "max_abs_logits": worst[0], "max_abs_state": worst[1]}
    return _summarized(report)


# One call of the graph: (input_ids, past_lengths [b], logit_positions or None for all).
Call = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
# Calls in order, each after the first reading the states the one before wrote, from the
# given states or from fresh (zero) states of the given capacity.
Chain = tuple[list[Call], list[torch.Tensor] | int]


def measure_parity_streamed(
    weights: Any,
    graph: Path,
    lengths: Sequence[int] = PROMPT_LENGTHS,
    seed: int = 0,
    decode_steps: int = DECODE_STEPS,
    contract: GraphContract | None = None,
) -> dict[str, Any]:
    """measure_parity's cases, with the reference run one layer at a time (each layer's
    weights read, used for every case, then dropped: models.loading.weights.Weights) and its outputs
    kept on disk beside the graph, so the check never holds the float model, or the
    reference's outputs, beside the graph's session. Decode tokens are drawn at random (the
    same for both sides) rather than taken from the reference's argmax, since the reference
    finishes a layer for every step before it starts the next."""
    cfg = weights.cfg
    contract = contract or GraphContract.of(cfg)
    g = torch.Generator().manual_seed(seed)
    lengths = [l for l in lengths if l <= cfg.max_position_embeddings]
    decode_steps = min(decode_steps, cfg.max_position_embeddings - 9 - 17)
    chains: list[Chain] = []
    for l in lengths:
        ids = torch.randint(0, cfg.vocab_size, (2, l), generator=g)
        chains.append(([(ids, torch.zeros(2, dtype=torch.long), None)], l + 5))
    pasts = torch.tensor([3, 9])
    capacity = 9 + 17 + decode_steps + 3
    states = random_states(contract, 2, capacity, g)
    ids = torch.randint(0, cfg.vocab_size, (2, 17), generator=g)
    chains.append(([(ids, pasts, None)], states))
    steps: list[Call] = [(ids, pasts, torch.tensor([16]))]
    for k in range(decode_steps):
        steps.append((torch.randint(0, cfg.vocab_size, (2, 1), generator=g), pasts + 17 + k, torch.tensor([0])))
    chains.append((steps, states))
    with tempfile.TemporaryDirectory(prefix=".parity-", dir=graph.parent) as tmp:
        # The reference first, its outputs to disk, so the graph's session never shares
        # memory with the reference's outputs: the peak is the larger of the two phases.
        store = Path(tmp)
        _layer_major(weights, chains, contract, store)
        _release_freed_memory()
        results = _graph_errors(graph, chains, contract, store)
    report: dict[str, Any] = {"tolerance": TOLERANCE, "prompt": [], "decode": {}, "reference": "layer by layer"}
    for l, errors in zip(lengths, results):
        report["prompt"].append({"batch": 2, "seq": l, "max_abs_logits": errors[0][0], "max_abs_state": errors[0][1]})
    chunk = results[len(lengths)][0]
    report["prompt"].append(
        {"batch": 2, "seq": 17, "pasts": [3, 9], "max_abs_logits": chunk[0], "max_abs_state": chunk[1]}
    )
    decode = results[-1]
    report["decode"] = {
        "batch": 2,
        "steps": decode_steps,
        "max_abs_logits": max(e[0] for e in decode),
        "max_abs_state": max(e[1] for e in decode),
    }
    return _summarized(report)


def _graph_errors(
    graph: Path, chains: list[Chain], contract: GraphContract, store: Path
) -> list[list[tuple[float, float]]]:
    """Run each chain of calls through the graph (each side carrying its own states) and
    compare every call's outputs with the reference's, read back one call at a time."""
    import onnxruntime as ort

    from ..graphs.feeds import graph_feeds

    opts = _options()
    # No second, pre-packed copy of every weight, and no arena kept at the largest call's
    # activations: the check holds the float graph once.
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.enable_cpu_mem_arena = False
    sess = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    specs, kv = contract.inputs, contract.kv
    results: list[list[tuple[float, float]]] = []
    for c, (calls, start) in enumerate(chains):
        if isinstance(start, int):  # untouched zero pages: fresh states cost no memory until written
            carried = [np.zeros(state_shape(spec, 2, start), np.float32) for spec in contract.pasts]
        else:
            carried = [s.numpy() for s in start]
        errors = []
        for k, (ids, lengths, positions) in enumerate(calls):
            named = graph_feeds(
                specs,
                ids.numpy(),
                lengths.numpy(),
                dict(zip([s.name for s in contract.pasts], carried)),
                positions is None,
            )
            got = sess.run(None, {s.name: named[s.name] for s in specs})
            errors.append(_stored_errors(got, store, f"{c}.{k}", kv, lengths.numpy() + ids.shape[1]))
            carried = [np.ascontiguousarray(x) for x in got[1:]]
            del got
        results.append(errors)
    return results


def _stored_errors(
    got: Sequence[np.ndarray], store: Path, call: str, kv: Sequence[bool], lengths: np.ndarray
) -> tuple[float, float]:
    """_errors against the reference's outputs of `call` in `store`, each read from disk
    when it is compared (the logits a row at a time, with plain reads: a memory map would keep
    the pages it touched resident), so the check holds one output of the reference at a time."""
    worst = [0.0, 0.0]
    for j, x in enumerate(got):
        if j == 0:
            rows = _rows(store / f"{call}.0.npy")
            worst[0] = max(float(np.abs(x[r] - next(rows)).max()) for r in range(x.shape[0]))
        else:
            worst[1] = max(worst[1], _state_error(x, np.load(store / f"{call}.{j}.npy"), kv[j - 1], lengths))
    return worst[0], worst[1]


def _rows(path: Path) -> Iterator[np.ndarray]:
    """The rows (first axis) of a C-ordered .npy file, read one at a time."""
    with path.open("rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
        count = int(np.prod(shape[1:]))
        for _ in range(shape[0]):
            yield np.fromfile(f, dtype=dtype, count=count).reshape(shape[1:])


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the system (glibc keeps them otherwise), so the graph's
    session starts from what the reference left, not from its peak."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class _Stream:
    """One call's residual stream between layers: x, the pending block output r, the context."""

    x: torch.Tensor
    ctx: Any
    r: torch.Tensor | None = None


def _layer_major(weights: Any, chains: list[Chain], contract: GraphContract, store: Path) -> None:
    """Reference outputs of each chain of calls (each call after the first reads the states
    the one before wrote), computed layer by layer and written to `store` as they come:
    `{chain}.{call}.{j}.npy`, j = 0 the logits, then the call's presents in graph order."""
    from .fragments import layer_blocks, outer_model

    cfg = weights.cfg
    outer = outer_model(cfg)
    _load(outer, weights, "")
    blocks, shared = layer_blocks(cfg, list(range(cfg.num_layers)))
    _load_shared(shared, weights)
    starts = [zero_tensors(contract, 2, start) if isinstance(start, int) else start for _, start in chains]
    streams: list[list[_Stream]] = []  # per chain, per call
    with torch.no_grad():
        for calls, _ in chains:
            streams.append([_Stream(*outer.embed(ids, lengths)) for ids, lengths, _ in calls])
        written = [[1] * len(calls) for calls, _ in chains]  # next output index per call
        specs = contract.pasts
        for i in range(cfg.num_layers):
            block = blocks.pop(i)
            _load(block, weights, f"model.layers.{i}.")
            mine = [k for k, s in enumerate(specs) if s.layer == i]
            for c, start in enumerate(starts):
                states = [start[k] for k in mine]
                for k, cell in enumerate(streams[c]):
                    cell.x, cell.r, states = block(cell.x, cell.r, cell.ctx, states)
                    for state in states:
                        np.save(store / f"{c}.{k}.{written[c][k]}.npy", state.numpy())
                        written[c][k] += 1
            del block
        for c, (calls, _) in enumerate(chains):
            for k, ((_ids, _lengths, positions), cell) in enumerate(zip(calls, streams[c])):
                assert cell.r is not None
                np.save(store / f"{c}.{k}.0.npy", outer.head(cell.x, cell.r, positions).numpy())


def _load(module: torch.nn.Module, weights: Any, prefix: str) -> None:
    """Put the checkpoint's tensors into `module` (its names under `prefix`); a module shared
    with other layers (loaded once by _load_shared) is left as it is."""
    from .fragments import weights_of

    have = set(weights.names())
    state = {n: weights[prefix + n] for n in weights_of(module) if prefix + n in have}
    module.load_state_dict(state, strict=False, assign=True)
    if not prefix and weights.cfg.tie_word_embeddings:
        module.lm_head.weight = module.model.embed_tokens.weight  # type: ignore[union-attr]


def _load_shared(shared: torch.nn.ModuleDict, weights: Any) -> None:
    from .fragments import weights_of

    if len(shared):
        state = {n: weights["model.shared." + n] for n in weights_of(shared)}
        shared.load_state_dict(state, strict=True, assign=True)
