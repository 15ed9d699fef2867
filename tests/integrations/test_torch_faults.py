"""Faults under the torch integration: a rank SIGKILLed mid-snapshot leaves nothing
visible, the other rank fails with DistributedSnapshotError instead of hanging, and gc
collects the shards; a rank that never reaches the call does not hang the others
beyond the call's timeout."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

from gradvault.core import Recorder  # noqa: E402
from tests.integrations import torch_ranks  # noqa: E402

TIMEOUT = 5


def outcome(folder: Path, rank: int) -> str:
    return (folder / f"outcome.{rank}").read_text()


def test_a_rank_killed_mid_snapshot_leaves_nothing_and_gc_collects(tmp_path: Path) -> None:
    store = tmp_path / "store"
    launch = torch_ranks.start(
        tmp_path / "run", 2, "kill_mid_snapshot", store=str(store), timeout=TIMEOUT
    )
    codes = launch.join()
    assert codes == [0, -signal.SIGKILL], launch.output()
    assert outcome(launch.folder, 0).startswith("DistributedSnapshotError: rank 0 of 2")
    assert not (launch.folder / "outcome.1").exists()
    with Recorder(store) as recorder:
        assert recorder.sync.list() == []
        leftovers = sorted(path.name for path in (store / ".staging").iterdir())
        assert len(leftovers) == 2  # rank 0's published shard, rank 1's private folder
        collected = recorder.sync.gc(grace_seconds=0)
        assert collected
        assert list((store / ".staging").iterdir()) == []
        assert recorder.sync.list() == []


def test_a_rank_that_never_calls_fails_the_others_after_the_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    launch = torch_ranks.start(
        tmp_path / "run", 2, "absent_rank", store=str(store), timeout=TIMEOUT
    )
    assert launch.join() == [0, 0], launch.output()
    found = outcome(launch.folder, 0)
    assert found.startswith("DistributedSnapshotError: rank 0 of 2: not every rank reached")
    assert "Ranks 1 failed to pass monitoredBarrier in 5000 ms" in found
    assert not store.exists() or Recorder(store).sync.list() == []


def test_a_rank_that_exited_fails_the_others(tmp_path: Path) -> None:
    launch = torch_ranks.start(
        tmp_path / "run",
        2,
        "absent_rank",
        store=str(tmp_path / "store"),
        timeout=TIMEOUT,
        exit=True,
    )
    assert launch.join() == [0, 0], launch.output()
    assert outcome(launch.folder, 0).startswith("DistributedSnapshotError: rank 0 of 2")


def test_a_write_that_never_ends_fails_every_rank_within_the_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    launch = torch_ranks.start(
        tmp_path / "run", 2, "stuck_write", store=str(store), timeout=TIMEOUT
    )
    assert launch.join() == [0, 0], launch.output()
    stuck = "DistributedSnapshotError: rank 1: its shard of snapshot"
    assert outcome(launch.folder, 1).startswith(stuck)
    # rank 0 hears of it from rank 1, or its own wait for rank 1 ends first: both bounded
    found = outcome(launch.folder, 0)
    assert found.startswith("DistributedSnapshotError: ")
    assert f"(rank 1: {stuck}" in found or "Ranks 1 failed to pass monitoredBarrier" in found
    with Recorder(store) as recorder:
        assert recorder.sync.list() == []


def test_a_rank_whose_part_fails_makes_every_rank_raise(tmp_path: Path) -> None:
    store = tmp_path / "store"
    launch = torch_ranks.start(
        tmp_path / "run", 2, "one_rank_fails", store=str(store), timeout=TIMEOUT
    )
    assert launch.join() == [0, 0], launch.output()
    assert outcome(launch.folder, 1).startswith("InvalidFieldError: ")
    assert outcome(launch.folder, 0).startswith(
        "DistributedSnapshotError: the snapshot's start failed on 1 of 2 ranks "
        "(rank 1: InvalidFieldError: "
    )
    assert not store.exists() or Recorder(store).sync.list() == []
