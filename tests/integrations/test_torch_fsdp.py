"""FSDP2 (``fully_shard``, DTensor gradients ``Shard(0)``) under the torch integration: a
snapshot mid-window, its restore on the same world size bit for bit (and the rest of the
run equal to the one never interrupted), and on 2 ranks from 4, 4 from 2 and 1 from 4,
each rank's gradient the full gradient sliced."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

import torch  # noqa: E402 - after the skip

from gradvault.core import Recorder  # noqa: E402
from gradvault.integrations import torch as gv_torch  # noqa: E402
from tests.integrations import torch_loops, torch_ranks  # noqa: E402
from tests.integrations.test_torch_ddp import assert_same_outcome  # noqa: E402


def rank_results(folder: Path, world_size: int) -> list[dict]:
    return [torch.load(folder / f"result.{rank}.pt") for rank in range(world_size)]


def assert_resumed_exactly(folder: Path, world_size: int) -> None:
    for found in rank_results(folder, world_size):
        assert found["world_size"] == world_size
        for name, captured in found["captured"].items():  # bit for bit, this rank's shard
            assert torch.equal(found["restored"][name], captured), name
            assert found["restored"][name].dtype == captured.dtype
        assert_same_outcome(found["reference"], found["resumed"])


def assert_sliced(folder: Path, world_size: int, full_gradients: dict) -> None:
    seen_rows = {name: 0 for name in full_gradients}
    for found in rank_results(folder, world_size):
        for name, restored in found["other"].items():
            assert restored["placements"] == ["S(0)"]  # str(Shard(0))
            offset, rows = restored["offset"], restored["local"].shape[0]
            assert torch.equal(restored["local"], full_gradients[name][offset : offset + rows])
            seen_rows[name] += rows
    assert seen_rows == {name: grad.shape[0] for name, grad in full_gradients.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2-rank run, then a 4-rank run that also restores the 2-rank snapshot, then 2
    ranks that restore the 4-rank one."""
    root = tmp_path_factory.mktemp("fsdp")
    store = str(root / "store")
    two, four, two_from_four = root / "two", root / "four", root / "two-from-four"
    torch_ranks.run(two, 2, "fsdp", store=store, refuse_plain=True)
    two_id = (two / "snapshot_id").read_text()
    torch_ranks.run(four, 4, "fsdp", store=store, other=two_id)
    four_id = (four / "snapshot_id").read_text()
    torch_ranks.run(two_from_four, 2, "fsdp", store=store, train=False, other=four_id)
    return {"store": Path(store), "two": two, "four": four, "two_from_four": two_from_four}


def test_restore_on_the_same_world_size_is_bit_identical(runs: dict[str, Path]) -> None:
    assert_resumed_exactly(runs["two"], 2)
    assert_resumed_exactly(runs["four"], 4)


def test_four_ranks_from_two_and_two_from_four(runs: dict[str, Path]) -> None:
    assert_sliced(runs["four"], 4, torch.load(runs["two"] / "full.pt"))
    assert_sliced(runs["two_from_four"], 2, torch.load(runs["four"] / "full.pt"))


def test_one_process_from_four_gets_the_full_gradients(runs: dict[str, Path]) -> None:
    full = torch.load(runs["four"] / "full.pt")
    model = torch_loops.Net()
    gv_torch.restore(model, runs["store"], (runs["four"] / "snapshot_id").read_text())
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, full[name]), name


def test_each_rank_writes_its_rows_with_their_place(runs: dict[str, Path]) -> None:
    snapshot_id = (runs["four"] / "snapshot_id").read_text()
    with Recorder(runs["store"]) as recorder:
        assert recorder.sync.info(snapshot_id)["world_size"] == 4
        offsets = []
        for rank in range(4):
            shard = recorder.sync.fetch(snapshot_id, rank=rank)
            layout = shard.metadata["torch"]
            assert layout["sharded"] == [True] * 4
            by_name = dict(zip(layout["name"], layout["offset"], strict=True))
            offsets.append(by_name["hidden.weight"])
            assert dict(zip(layout["name"], layout["global_shape"], strict=True)) == {
                "hidden.weight": [10, 6],
                "hidden.bias": [10],
                "out.weight": [3, 10],
                "out.bias": [3],
            }
            (out_weight,) = [entry for entry in shard if entry.name == "out.weight"]
            assert out_weight.shape == ((1, 10) if rank < 3 else (0, 10))  # rank 3: no row
        assert offsets == [0, 3, 6, 9]  # torch.chunk's rule: 3, 3, 3, 1 rows


def test_per_rank_gradients_are_refused_onto_dtensors(runs: dict[str, Path]) -> None:
    for found in rank_results(runs["two"], 2):
        assert "onto a sharded (DTensor) parameter there is no exact answer" in found["refused"]
        assert found["unchanged"]
