"""The shared pieces every writer and runner uses: graph feeds and the atomic directory writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridrt.graphs.contract import TensorSpec
from hybridrt.graphs.feeds import graph_feeds, state_shape, zero_states
from hybridrt.graphs.files import atomic_directory

IDS = TensorSpec("input_ids", ("batch", "seq"), "int64", "input_ids")
LENGTHS = TensorSpec("past_lengths", ("batch",), "int64", "past_lengths")
LOGITS = TensorSpec("logit_positions", ("n_logits",), "int64", "logit_positions")
KEY = TensorSpec("past.0.key", ("batch", 2, "capacity", 8), "float32", "key", 0)
CONV = TensorSpec("past.1.conv", ("batch", 4, 3), "float32", "conv", 1)


def test_feeds_hold_past_lengths_only_where_the_graph_declares_them() -> None:
    ids = np.array([[7, 8], [5, 6]], dtype=np.int64)
    state = {"past.1.conv": np.zeros((2, 4, 3), np.float32)}
    with_kv = graph_feeds([IDS, LENGTHS, LOGITS], ids, np.array([3, 9]), state)
    assert list(with_kv) == ["input_ids", "logit_positions", "past_lengths", "past.1.conv"]
    assert with_kv["past_lengths"].tolist() == [3, 9]
    assert graph_feeds([IDS, LENGTHS, LOGITS], ids, 4, state)["past_lengths"].tolist() == [4, 4]
    assert list(graph_feeds([IDS, LOGITS], ids, 0, state)) == ["input_ids", "logit_positions", "past.1.conv"]


def test_logit_positions_are_the_last_or_every_position() -> None:
    ids = np.zeros((1, 5), dtype=np.int64)
    assert graph_feeds([IDS, LOGITS], ids, 0, {})["logit_positions"].tolist() == [4]
    assert graph_feeds([IDS, LOGITS], ids, 0, {}, all_logits=True)["logit_positions"].tolist() == [0, 1, 2, 3, 4]


def test_kv_buffers_take_the_capacity_and_other_states_their_fixed_size() -> None:
    assert KEY.is_kv and KEY.kv_axis == 2 and not CONV.is_kv
    assert state_shape(KEY, 3, 40) == (3, 2, 40, 8) and state_shape(CONV, 3, 40) == (3, 4, 3)
    zeros = zero_states([KEY, CONV], 2, 16)
    assert zeros["past.0.key"].shape == (2, 2, 16, 8) and not zeros["past.0.key"].any()


def test_atomic_directory_leaves_the_old_directory_on_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(out) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("half written")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["old.txt"]


def test_atomic_directory_replaces_the_old_directory_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_directory(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["new.txt"]
    assert out.stat().st_mode & 0o777 != 0o700  # mkdtemp's private mode does not leak out
