"""The benchmark scripts' measurements on tiny exports: benchmarks/bench_peers.py's alternated
prompt and long-context rounds, benchmarks/profile_step.py's prompt profile, benchmarks/bench_layouts.py's
prompt-sized products. Their figures are speeds on a shared machine, so these tests check what
the scripts compute from them (keys, ratios, tables), never the speeds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_layouts  # noqa: E402
import bench_peers  # noqa: E402
import profile_step  # noqa: E402

LONG = 160  # within the tiny models' 512 positions, with the 128 new tokens after it


@pytest.fixture
def long_prompt(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(bench_peers, "LONG", LONG)
    monkeypatch.setenv("HYBRIDRT_BENCH_LONG", str(LONG))  # the children read it at import
    monkeypatch.chdir(BENCHMARKS.parent)  # bench_peers.child imports benchmarks/bench_peers
    return LONG


def test_prefill_rounds_pair_each_mode_with_its_peer_round_by_round(jamba_onnx: Path, long_prompt: int) -> None:
    # Two real processes a round: the tiny Jamba as "hybridrt int4" and again as its "llama.cpp
    # q4_0" partner, so the ratios are computed from two measured runs of the same graph.
    entries = [
        ("jamba", "hybridrt", "int4 mse", f"hybridrt:{jamba_onnx}"),
        ("jamba", "llama.cpp", "q4_0", f"hybridrt:{jamba_onnx}"),
    ]
    rows = bench_peers.alternate_prefill(entries, rounds=2, threads=1)
    ours, peer = rows
    keys = ("prefill_128_ms", f"prefill_{long_prompt}_ms")
    for row in rows:
        assert len(row["runs"]) == 2
        for k in keys:
            assert row[k] > 0 and row[k] == np.median([r[k] for r in row["runs"]])
    for k in keys:
        want = [p[k] / o[k] for p, o in zip(peer["runs"], ours["runs"], strict=True)]
        assert ours[k.replace("_ms", "_speed")] == pytest.approx(want)
    assert "prefill_128_speed" not in peer  # a peer is not its own partner
    table = bench_peers.prefill_table(rows)
    assert f"prefill {long_prompt} ms" in table and "| jamba | hybridrt | int4 mse |" in table
    assert f"{np.median(ours['prefill_128_speed']):.2f}x" in table


def test_partner_formats() -> None:
    assert bench_peers.partner("int8-dynamic") == "q8_0"
    assert bench_peers.partner("int8-weight") == "q8_0"
    assert bench_peers.partner("int4 mse (the default)") == "q4_0"


def test_context_rounds_ratio_is_taken_within_each_process(llama_kv8: Path, long_prompt: int) -> None:
    rows = bench_peers.alternate_context([("llama", "hybridrt", "int8 KV", f"hybridrt:{llama_kv8}")], 1, 1)
    (row,) = rows
    (run,) = row["runs"]
    assert run["long_over_short"] == pytest.approx(run[f"decode_{long_prompt}_tok_s"] / run["decode_tok_s"])
    assert row["decode_tok_s"] > 0 and row[f"decode_{long_prompt}_tok_s"] > 0
    assert f"after {long_prompt}" in bench_peers.context_table(rows)


def test_a_failed_entry_is_reported_not_tabled(tmp_path: Path, long_prompt: int, capsys: pytest.CaptureFixture) -> None:
    rows = bench_peers.alternate_prefill([("m", "hybridrt", "int4", f"hybridrt:{tmp_path}")], 1, 1)
    assert rows == []
    assert "m hybridrt int4:" in capsys.readouterr().err


def test_profile_of_the_prompt_calls(jamba_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = [str(jamba_onnx), "--threads", "1", "--prompt-tokens", "200", "--prompt", "--json", str(out)]
    assert profile_step.main(args) == 0
    (figures,) = json.loads(out.read_text()).values()
    # 200 tokens run as calls of 128 and 72: the per-call kernels include the model's products.
    assert figures["step_ms"] > 0 and figures["kernel_ms"] > 0
    assert any(op.startswith("MatMul") or op == "Gemm" for op in figures["per_op_ms"])
    assert figures["graph_nodes"] > 0


@pytest.mark.parametrize("layout", ["float", "dqmm", "nbits-4-32-nz"])
def test_layouts_build_prompt_sized_products(layout: str) -> None:
    import onnxruntime as ort

    model, nbytes = bench_layouts.build(layout, 1, 4, np.random.default_rng(0), rows=5)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.ones(i.shape, np.float32) for i in session.get_inputs()}
    outputs = session.run(None, feeds)
    assert [o.shape for o in outputs] == [(1, 5, n) for _, n in bench_layouts.SHAPES]
    assert nbytes > 0


def test_prefix_cache_workloads_report_what_the_server_reused(default_onnx: Path, tmp_path: Path) -> None:
    """benchmarks/bench_prefix_cache.py's workloads against a real server: the turns' cached tokens
    are the server's own figures, and the report tables and plots every workload."""
    import bench_prefix_cache as bench
    from serving import running

    import hybridrt

    words = bench.Words(default_onnx / "tokenizer.json")
    with running(hybridrt.load(default_onnx), api_key=None, model_name="m") as server:
        record = {
            "one_stream": bench.one_stream(server.url, words),
            "completions_conversation": bench.conversation(server.url, words, chat=False, turns=3),
            "chat_conversation": bench.conversation(server.url, words, chat=True, turns=3),
            "agent": bench.agent(server.url, words, steps=3),
            "shared_system_prompt": bench.shared_system_prompt(server.url, words, system_tokens=600, requests=3),
            "concurrent_repeats": bench.concurrent_repeats(server.url, words, streams=3),
        }
    conv = record["completions_conversation"]
    assert conv["cached"][0] == 0 and all(c > 0 for c in conv["cached"][1:])
    assert all(c < p for c, p in zip(conv["cached"], conv["prompt_tokens"]))
    assert record["shared_system_prompt"]["cached"][2] >= 600  # the branch point the second one stored
    assert all(c and c > 0 for c in record["concurrent_repeats"]["cached_second_round"])
    assert record["one_stream"]["decode_tok_s"] > 0
    out = tmp_path / "prefix_cache"
    bench.report({"rounds": [{"hybridrt": record}]}, out)
    table = out.with_suffix(".md").read_text()
    assert "| completions conversation: cached tokens | 0, " in table
    assert out.with_suffix(".png").stat().st_size > 0

    # Two rounds beside a peer twice as slow, then twice as fast: the medians' table counts, turn
    # by turn, the rounds in which the first server was at or below the other.
    def peer(scale: float) -> dict:
        turns = ("completions_conversation", "chat_conversation", "agent")
        return {w: {**r, "ttft_ms": [t * scale for t in r["ttft_ms"]]} if w in turns else r for w, r in record.items()}

    bench.report({"rounds": [{"hybridrt": record, "peer": peer(2.0)}, {"hybridrt": record, "peer": peer(0.5)}]}, out)
    row = next(
        line
        for line in out.with_suffix(".md").read_text().splitlines()
        if line.startswith("| agent, 10 steps: TTFT by turn")
    )
    assert row.endswith("| 0.80, 0.80, 0.80 | 1, 1, 1 |")  # the peer's median: 1.25x


def test_prefix_cache_turns_in_step_alternate_who_goes_first(
    default_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--pace turns: each turn's request goes to both servers, who goes first alternating by turn,
    with the same texts for each (two servers of one model: the same replies, so the same prompts
    and the same reuse), and the figures are those the workload gives on one server alone."""
    import bench_prefix_cache as bench
    from serving import running

    import hybridrt

    sent: list[str] = []
    real = bench.request
    monkeypatch.setattr(bench, "request", lambda url, route, body: sent.append(url) or real(url, route, body))
    words = bench.Words(default_onnx / "tokenizer.json")
    with (
        running(hybridrt.load(default_onnx), api_key=None, model_name="m") as a,
        running(hybridrt.load(default_onnx), api_key=None, model_name="m") as b,
    ):
        both = bench.in_step({"a": a.url, "b": b.url}, lambda w: bench.agent_turns(w, steps=3), words, 1, 0.0)
        after = words.at
    assert sent == [b.url, a.url, a.url, b.url, b.url, a.url]
    assert set(both) == {"a", "b"} and both["a"]["cached"] == both["b"]["cached"]
    assert both["a"]["cached"][0] == 0 and all(c > 0 for c in both["a"]["cached"][1:])
    assert all(t > 0 for r in both.values() for t in r["ttft_ms"])

    words.at = 0
    with running(hybridrt.load(default_onnx), api_key=None, model_name="m") as c:
        alone = bench.agent(c.url, words, steps=3)
    assert alone["cached"] == both["a"]["cached"] and words.at == after
