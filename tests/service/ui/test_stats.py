"""Stats from manifests and the run series built from them: the cases a chart must not hide."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.core import (
    GradientRecordEntry,
    GradientsParamsRecord,
    ParamId,
    StoreUnavailableError,
    open_store,
)
from gradvault.service.ui.bars import norm_chart, ratio_length
from gradvault.service.ui.stats import SnapshotStats, SnapshotStatsCache, run_series
from tests.service.spy import StoreSpy


def _record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(1), "w", np.ones(3, np.float32))]
    )


def _manifest(step: int, rows: list[tuple[str, float | str, int, int]]) -> dict[str, Any]:
    """A manifest's fields the stats read: ``rows`` of (name, l2_norm, nan_count, inf_count)."""
    return {
        "id": f"{step:026d}",
        "run": "r",
        "step": step,
        "created_at": "2026-12-02T21:00:00.000Z",
        "nbytes": 16,
        "gradients": {
            "param_id": [f"{i:016x}" for i in range(len(rows))],
            "name": [row[0] for row in rows],
            "stats": {
                "l2_norm": [row[1] for row in rows],
                "max_abs": [1.0 for _ in rows],
                "nan_count": [row[2] for row in rows],
                "inf_count": [row[3] for row in rows],
            },
        },
    }


def test_an_overflowed_norm_is_unhealthy_and_left_out_of_the_chart() -> None:
    stats = SnapshotStats.of_manifest(_manifest(3, [("w", "Infinity", 0, 0), ("b", 2.0, 0, 0)]))
    assert stats.l2_norms == (math.inf, 2.0)
    assert not stats.healthy and stats.nan_count == stats.inf_count == 0
    assert stats.largest == ("w", math.inf)
    series = run_series("r", [stats], max_points=10)
    assert series["l2_norm"] == [[None], [2.0]]
    assert series["nonfinite"] == [
        {"step": 3, "id": stats.id, "nan_count": 0, "inf_count": 0, "layers": ["w"]}
    ]


def test_layers_a_snapshot_lacks_are_gaps_and_zero_norms_cannot_be_drawn() -> None:
    first = SnapshotStats.of_manifest(_manifest(0, [("w", 1.0, 0, 0)]))
    second = SnapshotStats.of_manifest(_manifest(1, [("w", 0.0, 0, 0), ("new", 5.0, 0, 2)]))
    series = run_series("r", [second, first], max_points=10)  # any order in, step order out
    assert series["layers"] == ["w", "new"]
    assert series["steps"] == [0, 1]
    assert series["l2_norm"] == [[1.0, None], [None, 5.0]]
    assert [bad["layers"] for bad in series["nonfinite"]] == [["new"]]


def _manifest_of(step: int, rows: list[tuple[str, str, float]]) -> dict[str, Any]:
    """A manifest with ``rows`` of (param_id, name, l2_norm)."""
    manifest = _manifest(step, [(name, norm, 0, 0) for _, name, norm in rows])
    manifest["gradients"]["param_id"] = [param_id for param_id, _, _ in rows]
    return manifest


def test_gradients_with_the_same_name_are_separate_series() -> None:
    a, b, c = (f"{i:016x}" for i in (0xA, 0xB, 0xC))
    first = SnapshotStats.of_manifest(_manifest_of(0, [(a, "w", 1.0), (b, "w", 100.0)]))
    second = SnapshotStats.of_manifest(
        _manifest_of(1, [(a, "w", 2.0), (b, "w", 200.0), (c, "bias", 3.0)])
    )
    series = run_series("r", [first, second], max_points=10)
    assert series["l2_norm"] == [[1.0, 2.0], [100.0, 200.0], [None, 3.0]]
    assert series["layers"] == [f"w ({a})", f"w ({b})", "bias"]  # unique labels
    assert series["param_ids"] == [a, b, c]
    # bucketed, each series keeps its own largest norm
    assert run_series("r", [first, second], max_points=1)["l2_norm"] == [[2.0], [200.0], [3.0]]


def test_an_empty_run_has_no_points() -> None:
    series = run_series("r", [], max_points=10)
    assert (series["steps"], series["layers"], series["snapshots"]) == ([], [], 0)


def test_bars_are_logarithmic_and_flag_what_cannot_be_drawn() -> None:
    chart = norm_chart(
        ["a", "b", "c", "d"], [0.01, 1.0, 0.0, math.inf], [False, True, False, False]
    )
    assert (chart.low, chart.high) == (-2, 0)
    lengths = [bar.length for bar in chart.bars]
    assert lengths[:2] == [0.005, 1.0]  # the smallest still shows a sliver
    assert [bar.bad for bar in chart.bars] == [False, True, False, True]
    assert [bar.value for bar in chart.bars] == [0.01, 1.0, 0.0, None]
    assert (ratio_length(1000.0), ratio_length(0.001), ratio_length(1.0)) == (1.0, -1.0, 0.0)
    assert ratio_length(None) == ratio_length(math.inf) == 0.0


async def test_each_manifest_is_read_once_however_many_ask(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    try:
        ids = [(await store.write_snapshot(_record(), run="r", step=step)).id for step in range(40)]
        await store.delete(ids[7])
        spy = StoreSpy(store)
        cache = SnapshotStatsCache(spy)
        first, second = await asyncio.gather(cache.many(ids), cache.many(ids[::-1]))
        again = await cache.many(ids)
    finally:
        await store.close()
    assert [stats.id for stats in first] == ids[:7] + ids[8:]  # the deleted one left out
    assert [stats.id for stats in second] == (ids[:7] + ids[8:])[::-1]
    assert again == first
    assert spy.calls == ["info"] * len(ids) + ["info"]  # one read each; the gone one twice


async def test_a_store_error_reaches_every_request_that_waited(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    try:
        snapshot_id = (await store.write_snapshot(_record(), run="r", step=0)).id
        cache = SnapshotStatsCache(StoreSpy(store, fail_with=StoreUnavailableError("down")))
        results = await asyncio.gather(
            cache.many([snapshot_id]), cache.many([snapshot_id]), return_exceptions=True
        )
        assert [type(result) for result in results] == [StoreUnavailableError] * 2
        with pytest.raises(StoreUnavailableError, match="down"):  # tried again, not cached
            await cache.many([snapshot_id])
    finally:
        await store.close()
