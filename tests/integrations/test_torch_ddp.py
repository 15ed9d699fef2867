"""DDP under the torch integration: a SIGTERM to every rank mid-window, a snapshot, a resume
in fresh processes, and the end of training bit for bit that of a run never stopped."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

import torch  # noqa: E402 - after the skip

from gradvault.core import Recorder  # noqa: E402
from gradvault.integrations import torch as gv_torch  # noqa: E402
from tests.integrations import torch_loops, torch_ranks  # noqa: E402

WORLD_SIZE = 2


def results(folder: Path) -> list[dict]:
    return [torch.load(folder / f"result.{rank}.pt") for rank in range(WORLD_SIZE)]


def assert_same_outcome(expected: dict, found: dict) -> None:
    assert expected["params"].keys() == found["params"].keys()
    for name, value in expected["params"].items():
        assert torch.equal(value, found["params"][name]), name
    assert expected["optimizer"].keys() == found["optimizer"].keys()
    for index, slots in expected["optimizer"].items():
        for slot, value in slots.items():
            assert torch.equal(value, found["optimizer"][index][slot]), (index, slot)
    assert expected["losses"] == found["losses"]


def test_sigterm_mid_window_then_resume_is_bit_identical(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    reference = tmp_path / "reference"
    torch_ranks.run(reference, WORLD_SIZE, "ddp", store=store)

    stopped = tmp_path / "stopped"
    launch = torch_ranks.start(stopped, WORLD_SIZE, "ddp", store=store, pause_at=[1, 1])
    pids = launch.pids()
    launch.wait_for("ready", WORLD_SIZE)  # every rank has run micro-batch 2 of step 2's window
    for pid in pids:  # as a scheduler does: every rank gets it
        os.kill(pid, signal.SIGTERM)
    codes = launch.join()
    assert codes == [0, 0], launch.output()
    states = [torch.load(stopped / f"state.{rank}.pt") for rank in range(WORLD_SIZE)]
    assert [state["next"] for state in states] == [[1, 2], [1, 2]]
    snapshot_id = states[0]["snapshot_id"]
    assert states[1]["snapshot_id"] == snapshot_id
    # mid-window, each rank's accumulation is its own (no_sync): not one of them reduced
    grads = [state["grads"] for state in states]
    assert any(not torch.equal(grads[0][name], grads[1][name]) for name in grads[0])

    with Recorder(store) as recorder:
        (listed,) = recorder.sync.list()
        assert (listed.id, listed.world_size, listed.run, listed.step) == (snapshot_id, 2, "ddp", 1)
        for rank in range(WORLD_SIZE):  # each rank's shard is its own .grad, bit for bit
            shard = recorder.sync.fetch(snapshot_id, rank=rank)
            assert {entry.name for entry in shard} == set(grads[rank])
            for entry in shard:
                assert entry.array.tobytes() == grads[rank][entry.name].numpy().tobytes()
            assert shard.metadata["torch"]["sharded"] == [False] * len(grads[rank])

    torch_ranks.run(stopped, WORLD_SIZE, "ddp", store=store, resume=True)
    for expected, found in zip(results(reference), results(stopped), strict=True):
        assert_same_outcome(expected, found)

    # each rank's unreduced sum has no exact answer on one process: refused, nothing set
    model = torch_loops.Net()
    with pytest.raises(
        gv_torch.UnsupportedSetupError,
        match="onto 1 rank there is no exact answer: restore it on 2 ranks",
    ):
        gv_torch.restore(model, store, snapshot_id)
    assert all(param.grad is None for param in model.parameters())
