"""``gradvault ls``, ``show`` and ``pull`` on a sharded snapshot (written by three ranks with
``Recorder.snapshot_shard``), over a service (local and S3 stores) and on a store itself:
the world size and each rank's size and health, ``--rank`` for one rank's shard, and a
snapshot written whole printed as it always was."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import open_store
from gradvault.core.records.safetensors_file import record_from_safetensors
from gradvault.service import Settings, create_app
from tests.service.conftest import UvicornThread, make_record
from tests.sharded_writes import PARAMS, rank_nbytes, rank_record, write_sharded

COMMAND_TIMEOUT_SECONDS = 180
READ_TOKEN = "sharded-cli-read-token"


def gradvault(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m gradvault ARGS`` as a user runs it (no GRADVAULT_* from this process)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    return subprocess.run(
        [sys.executable, "-m", "gradvault", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        check=False,
    )


def _rank_record_with_nan_on_rank_1(rank: int):
    return rank_record(rank, nonfinite=rank == 1)


def _write(store_url: str, connection_options: dict) -> tuple[str, str]:
    """A sharded snapshot (step 7, a NaN and an Inf on rank 1), then one written whole
    (step 8): their ids."""
    sharded = write_sharded(
        store_url,
        world_size=3,
        run="ddp",
        step=7,
        tags={"job": "a"},
        record_of=_rank_record_with_nan_on_rank_1,
        **connection_options,
    )

    async def whole() -> str:
        store = open_store(store_url, **connection_options)
        try:
            return (await store.write_snapshot(make_record(1), run="ddp", step=8)).id
        finally:
            await store.close()

    return sharded, asyncio.run(whole())


@pytest.fixture
def where(store_kind: str, store_url: str, connection_options: dict) -> Iterator[list[str]]:
    """The snapshots of ``_write`` and the flags that reach them: a service over the store
    (local or S3), read with a read token."""
    settings = Settings(
        store=store_url,
        store_options=dict(connection_options),
        index_refresh_seconds=0,
        tokens=f"{READ_TOKEN}:read",
    )
    server = UvicornThread(create_app(settings))
    server.start()
    try:
        yield ["--url", server.base_url, "--token", READ_TOKEN]
    finally:
        server.stop()


def _sizes(*ranks: int) -> str:
    return ", ".join(f"{rank_nbytes(r)} B" for r in ranks)


def test_ls_and_show_print_the_world_size_and_each_rank(where, store_url, connection_options):
    sharded, whole = _write(store_url, connection_options)

    listed = gradvault("ls", *where)
    assert listed.returncode == 0, listed.stderr
    header, first, second = listed.stdout.splitlines()
    assert header.split() == [
        *("ID", "RUN", "STEP", "TIME", "(UTC)", "SIZE", "PARAMS", "RANKS", "NaN/Inf"),
    ]
    assert first.startswith(whole) and first.split()[-2:] == ["-", "none"]
    assert second.startswith(sharded)
    assert f"3: {_sizes(0, 1, 2)}  1 NaN, 1 Inf" in second

    as_json = gradvault("ls", *where, "--json")
    assert as_json.returncode == 0, as_json.stderr
    plain, with_ranks = json.loads(as_json.stdout)
    assert list(plain) == [
        *("id", "run", "step", "created_at", "nbytes", "num_params", "world_size"),
        *("nan_count", "inf_count"),
    ]
    assert plain["world_size"] is None
    assert (with_ranks["world_size"], with_ranks["num_params"]) == (3, 6)
    assert (with_ranks["nan_count"], with_ranks["inf_count"]) == (1, 1)
    assert [
        (s["rank"], s["nbytes"], s["num_params"], s["device"]) for s in with_ranks["shards"]
    ] == [(r, rank_nbytes(r), 2, "cpu") for r in range(3)]

    shown = gradvault("show", *where, sharded)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "ranks        3" in lines and "NaN/Inf      1 NaN, 1 Inf" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["RANK", "DEVICE", "BACKEND", "SIZE", "PARAMS", "NaN/Inf"]
    assert [row.split()[:5] for row in table[1:]] == [
        [str(r), "cpu", "numpy", str(rank_nbytes(r)), "B"] for r in range(3)
    ]
    assert table[2].endswith("1 NaN, 1 Inf") and table[1].endswith("none")

    one_rank = gradvault("show", *where, sharded, "--rank", "1")
    assert one_rank.returncode == 0, one_rank.stderr
    assert "rank         1 of 3" in one_rank.stdout.splitlines()
    assert f"{PARAMS[0][1]}  {PARAMS[0][0]}  float32  3x5" in one_rank.stdout

    detail = json.loads(gradvault("show", *where, sharded, "--rank", "2", "--json").stdout)
    assert (detail["rank"], detail["world_size"], detail["nbytes"]) == (2, 3, rank_nbytes(2))
    assert [g["shape"] for g in detail["gradients"]] == [[3, 6], [5]]


def test_pull_takes_one_rank_s_shard_and_asks_for_rank(
    where, store_url, connection_options, tmp_path: Path
):
    sharded, whole = _write(store_url, connection_options)
    for suffix in (".safetensors", ".npz"):
        path = tmp_path / f"rank2{suffix}"
        pulled = gradvault("pull", *where, sharded, "--rank", "2", "-o", str(path))
        assert pulled.returncode == 0, pulled.stderr
        assert "(run ddp, step 7, rank 2 of 3), 2 gradients" in pulled.stdout
        expected = rank_record(2)
        if suffix == ".npz":
            with np.load(path) as arrays:
                for entry in expected:
                    np.testing.assert_array_equal(arrays[str(entry.param_id)], entry.array)
        else:
            record = record_from_safetensors(path.read_bytes())
            assert record.metadata["snapshot"]["rank"] == 2
            for got, want in zip(record, expected, strict=True):
                np.testing.assert_array_equal(got.array, want.array)

    target = tmp_path / "whole.safetensors"
    for args, expected_error in (
        ((sharded,), "is sharded over 3 ranks: give --rank (0..2) to pull one rank's shard"),
        ((sharded, "--rank", "3"), "give --rank (0..2) to pull one rank's shard; got --rank 3"),
        ((whole, "--rank", "0"), f"snapshot {whole} was written whole; --rank is for sharded"),
    ):
        refused = gradvault("pull", *where, *args, "-o", str(target))
        assert refused.returncode == 2, refused.stderr
        assert expected_error in refused.stderr
        assert not target.exists()


@pytest.mark.parametrize("store_kind", ["local"])
def test_a_store_and_a_service_print_the_same(where, store_url, connection_options):
    sharded, whole = _write(store_url, connection_options)
    store = ["--store", store_url]
    for args in (
        ("ls", "--json"),
        ("ls",),
        ("show", sharded, "--json"),
        ("show", sharded),
        ("show", sharded, "--rank", "1", "--json"),
        ("show", whole, "--json"),
    ):
        over_service, on_store = gradvault(*args, *where), gradvault(*args, *store)
        assert over_service.returncode == on_store.returncode == 0, (args, on_store.stderr)
        assert over_service.stdout == on_store.stdout, args


@pytest.mark.parametrize("store_kind", ["local"])
def test_ls_without_a_sharded_snapshot_has_no_ranks_column(where, store_url):
    async def whole() -> None:
        store = open_store(store_url)
        try:
            await store.write_snapshot(make_record(1), run="ddp", step=8)
        finally:
            await store.close()

    asyncio.run(whole())
    for args in (where, ["--store", store_url]):
        listed = gradvault("ls", *args)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[0].split() == [
            *("ID", "RUN", "STEP", "TIME", "(UTC)", "SIZE", "PARAMS", "NaN/Inf"),
        ]
