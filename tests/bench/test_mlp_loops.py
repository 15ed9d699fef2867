"""The training loops of ``bench/mlp_step.py`` time only the steps: gradvault's loop snapshots
into a store that already holds a snapshot committed before the clock starts, and every
snapshot it starts is durable once it returns; the floor loops commit one snapshot a step."""

from __future__ import annotations

import asyncio
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


@pytest.mark.parametrize("layout", [True, False])
def test_a_floor_loop_commits_one_snapshot_a_step(tmp_path: Path, layout: bool) -> None:
    assert mlp_step.floor_loop(tmp_path, layout=layout) > 0
    (floor,) = tmp_path.glob("floor-*")
    assert sorted(path.name for path in (floor / "snapshots").iterdir()) == ["0", "1", "2", "3"]
    if layout:
        assert all((floor / "snapshots" / str(i) / "zarr.json").is_file() for i in range(4))
        assert not list((floor / "staging").iterdir())
