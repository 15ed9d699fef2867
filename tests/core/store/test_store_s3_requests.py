"""The S3 backend makes every request with obstore's blocking functions.

A coroutine of obstore hands its result to Python from a thread of obstore's own runtime;
one still doing so when the process exits aborts it (core/store/_s3.py's docstring). Here
each of obstore's coroutine functions is replaced by one that fails the test, and a
store on the S3 server goes through every kind of request: writes (whole and sharded),
listings, reads, a delete and gc.
"""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import obstore
import pytest

import gradvault.core as gv
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store
from tests.conftest import S3_BUCKET, S3_CREDENTIALS


def _record() -> GradientsParamsRecord:
    rng = np.random.default_rng(3)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                gv.ParamId(index + 1), f"layer{index}", rng.standard_normal(size).astype(np.float32)
            )
            for index, size in enumerate((10, 3000, 5000))
        ]
    )


def _open(s3_endpoint: str) -> SnapshotStore:
    """A store at a fresh prefix of the session's S3 server."""
    url = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/store"
    options = {"endpoint": s3_endpoint, "allow_http": True, **S3_CREDENTIALS}
    return open_store(url, chunk_bytes=4096, pack_threshold=1024, **options)


@pytest.fixture
def no_obstore_coroutines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``obstore.*_async`` function replaced by one that records its name and fails."""
    called: list[str] = []

    def refuse(name: str):
        def refused(*args: object, **kwargs: object) -> None:
            called.append(name)
            raise AssertionError(f"obstore.{name} was called")

        return refused

    names = [name for name in dir(obstore) if name.endswith("_async")]
    assert {"put_async", "get_async", "head_async", "delete_async"} <= set(names)
    for name in names:
        monkeypatch.setattr(obstore, name, refuse(name))
    return called


async def test_every_request_is_a_blocking_call(
    s3_endpoint: str, no_obstore_coroutines: list[str]
) -> None:
    store = _open(s3_endpoint)
    record = _record()
    try:
        info = await store.write_snapshot(record, run="r", step=1)
        sharded = gv.new_snapshot_id()
        for rank in range(2):
            await store.write_shard(
                record, snapshot_id=sharded, rank=rank, world_size=2, run="r", step=2
            )
        assert sorted(i.id for i in await store.list()) == sorted([info.id, sharded])
        assert await store.read_snapshot(info.id) == record
        assert await store.read_snapshot(sharded, rank=1) == record
        assert (await store.info(info.id))["num_params"] == len(record)
        await store.delete(info.id)
        await store.gc(grace_seconds=0)
        assert [i.id for i in await store.list()] == [sharded]
    finally:
        await store.close()
    assert no_obstore_coroutines == []


async def test_a_cancelled_write_leaves_no_request_running(s3_endpoint: str) -> None:
    """Cancelled mid-write, the store has finished its requests when the cancel returns:
    a later listing sees everything that was written (nothing lands afterwards)."""
    store = _open(s3_endpoint)
    backend = store.backend
    started = asyncio.Event()
    put = backend.put

    async def put_and_signal(key: str, body: bytes | memoryview, **kwargs: object) -> None:
        started.set()
        await put(key, body, **kwargs)  # type: ignore[arg-type]

    backend.put = put_and_signal  # type: ignore[method-assign]
    try:
        write = asyncio.ensure_future(store.write_snapshot(_record(), run="r", step=1))
        await started.wait()
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        backend.put = put  # type: ignore[method-assign]
        before = await backend.list_objects("snapshots/")
        await asyncio.sleep(0.5)
        assert await backend.list_objects("snapshots/") == before
        assert await store.list() == []
    finally:
        await store.close()
