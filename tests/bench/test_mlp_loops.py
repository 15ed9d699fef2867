"""The training loops of ``bench/mlp_step.py`` time only the steps: gradvault's loop snapshots
into a store that already holds a snapshot committed before the clock starts, and every
snapshot it starts is durable once it returns; the floor loops commit one snapshot a step."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import gradvault.core as gv
from bench import mlp_step


@pytest.fixture(autouse=True)
def short_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlp_step, "LOOP_STEPS", 4)


async def snapshots_of(store_folder: Path) -> list[tuple[str, int]]:
    async with gv.open_store(store_folder) as store:
        return sorted((info.run, info.step) for info in await store.list())


@pytest.mark.parametrize(("every", "steps"), [(1, [0, 1, 2, 3]), (2, [0, 2]), (None, [])])
def test_a_loop_snapshots_into_a_store_made_before_its_clock(
    tmp_path: Path, every: int | None, steps: list[int]
) -> None:
    assert mlp_step.training_loop(every, tmp_path) > 0
    (store_folder,) = tmp_path.iterdir()
    found = asyncio.run(snapshots_of(store_folder))
    assert found == sorted([("warm-up", 0)] + [("bench", step) for step in steps])


@pytest.mark.parametrize("floor", mlp_step.FLOORS)
def test_a_floor_loop_commits_one_snapshot_a_step(tmp_path: Path, floor: str) -> None:
    assert mlp_step.floor_loop(tmp_path, floor) > 0
    (folder,) = tmp_path.glob("floor-*")
    assert sorted(path.name for path in (folder / "snapshots").iterdir()) == ["0", "1", "2", "3"]
    if floor == "layout":
        assert all((folder / "snapshots" / str(i) / "zarr.json").is_file() for i in range(4))
        assert not list((folder / "staging").iterdir())
    else:
        assert all((folder / "snapshots" / str(i)).is_file() for i in range(4))


def test_the_durable_floor_fsyncs_the_folder_after_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the durable floor fsyncs the folder that holds the new files, once a file,
    after the file's own fsync."""
    fsynced: dict[str, list[str]] = {}
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        fsynced.setdefault(current, []).append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    for current in ("durable bytes", "bytes"):
        mlp_step.floor_loop(tmp_path / current.replace(" ", "-"), current)
    for floor, folders in (("durable bytes", 4), ("bytes", 0)):
        paths = fsynced[floor]
        assert sum(path.endswith("/snapshots") for path in paths) == folders
        files = [path for path in paths if not path.endswith("/snapshots")]
        assert [Path(path).name for path in files] == ["0", "1", "2", "3"]
    durable = fsynced["durable bytes"]
    assert all(durable[i + 1].endswith("/snapshots") for i in range(0, 8, 2))
