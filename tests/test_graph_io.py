"""The shared pieces every writer and runner uses: graph feeds and the atomic directory writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridrt.graphs.contract import TensorSpec
from hybridrt.graphs.feeds import graph_feeds, position_ids
from hybridrt.graphs.files import atomic_directory

IDS = TensorSpec("input_ids", ("batch", "seq"), "int64", "input_ids")
MASK = TensorSpec("attention_mask", ("batch", "total_len"), "int64", "attention_mask")
POS = TensorSpec("position_ids", ("batch", "seq"), "int64", "position_ids")


def test_positions_skip_left_padding_and_continue_after_the_past() -> None:
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=np.int64)
    assert position_ids(mask, 2).tolist() == [[1, 2], [3, 4]]
    assert position_ids(mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_feeds_hold_positions_only_where_the_graph_declares_them() -> None:
    ids, mask = np.array([[7, 8]], dtype=np.int64), np.ones((1, 5), dtype=np.int64)
    state = {"past.0.conv": np.zeros((1, 4, 3), np.float32)}
    with_pos = graph_feeds([IDS, MASK, POS], ids, mask, state)
    assert list(with_pos) == ["input_ids", "attention_mask", "position_ids", "past.0.conv"]
    assert with_pos["position_ids"].tolist() == [[3, 4]]
    assert list(graph_feeds([IDS, MASK], ids, mask, state)) == ["input_ids", "attention_mask", "past.0.conv"]


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
