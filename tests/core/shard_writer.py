"""One rank of a multi-process training job, writing its shard of a sharded snapshot.

``python -m tests.core.shard_writer STORE_URL SNAPSHOT_ID RANK WORLD_SIZE [STALL_AT_CHUNK]``
writes :func:`rank_record` of RANK through a Recorder (S3 settings from the ``AWS_*``
environment) and prints one JSON line: the ShardInfo's ``rank``, ``committed`` and
``nbytes``. With STALL_AT_CHUNK it instead stops for good when it is about to write that
chunk (counting from 1), after printing ``stalled``: a rank that dies mid-write is this
process killed then. The store writes one array at a time (``max_concurrency=1``), so
every array before the stalled one is wholly written.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

import gradvault.core as gv
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import ShardWriter, SnapshotStore

#: Store options of every rank: 4 KiB chunks, gradients of 1 KiB or more in arrays of their own.
STORE_OPTIONS = {"chunk_bytes": 4096, "pack_threshold": 1024, "max_concurrency": 1}
#: Each rank's gradients: three own arrays of 4 chunks each, then two packed ones.
SHAPES = [(4, 1024), (4, 1024), (16, 256), (10,), (3, 3)]
RUN, STEP = "ddp", 7


def rank_record(rank: int) -> GradientsParamsRecord:
    """The gradients rank ``rank`` writes: its own ParamIds (a partition of the model) and
    values, both following the rank."""
    rng = np.random.default_rng(1000 + rank)
    entries = []
    for index, shape in enumerate(SHAPES):
        array = rng.standard_normal(shape).astype(np.float32)
        pid = gv.ParamId(int(rng.integers(1, 2**63)))
        entries.append(GradientRecordEntry.from_array(pid, f"rank{rank}.layer{index}", array))
    return GradientsParamsRecord(entries)


def stall_at(store: SnapshotStore, chunk: int) -> None:
    """Make ``store`` stop for good when it is about to write chunk number ``chunk`` of
    its shard (counting from 1), after printing ``stalled``.

    The stall is in the chunk stream the store hands its backend's shard writer, so the
    writer holds its earlier chunks written and the later ones never started.
    """
    backend = store.backend
    begin_shard = backend.begin_shard
    taken = 0

    def stalling(chunks: Iterator[Any]) -> Iterator[Any]:
        nonlocal taken
        for item in chunks:
            taken += 1
            if taken == chunk:
                print("stalled", flush=True)
                threading.Event().wait()
            yield item

    async def begin_stalling_shard(snapshot_id: str, rank: int) -> ShardWriter:
        writer = await begin_shard(snapshot_id, rank)
        write_array = writer.write_array

        async def write_array_stalling(name: str, metadata: bytes, chunks: Iterator) -> None:
            await write_array(name, metadata, stalling(chunks))

        writer.write_array = write_array_stalling  # type: ignore[method-assign]
        return writer

    backend.begin_shard = begin_stalling_shard  # type: ignore[method-assign]


def main() -> None:
    url, snapshot_id, rank, world_size = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    with gv.Recorder(url, **STORE_OPTIONS) as recorder:
        if len(sys.argv) > 5:
            stall_at(recorder.store, int(sys.argv[5]))
        shard = recorder.sync.snapshot_shard(
            rank_record(rank),
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=world_size,
            run=RUN,
            step=STEP,
        )
    print(json.dumps({"rank": shard.rank, "committed": shard.committed, "nbytes": shard.nbytes}))


if __name__ == "__main__":
    main()
