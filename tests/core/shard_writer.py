"""One rank of a multi-process training job, writing its shard of a sharded snapshot.

``python -m tests.core.shard_writer STORE_URL SNAPSHOT_ID RANK WORLD_SIZE [STALL_AT_CHUNK]``
writes :func:`rank_record` of RANK through a Recorder (S3 settings from the ``AWS_*``
environment) and prints one JSON line: the ShardInfo's ``rank``, ``committed`` and
``nbytes``. With STALL_AT_CHUNK it instead stops for good when it is about to encode that
chunk (counting from 1), after printing ``stalled``: a rank that dies mid-write is this
process killed then. The store writes one array at a time (``max_concurrency=1``), so
every array before the stalled one is wholly written.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np

import gradvault.core as gv
from gradvault.core.record import GradientRecordEntry, GradientsParamsRecord

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


def _stall_at(chunk: int) -> None:
    """Make the store stop for good before it encodes chunk number ``chunk``."""
    from gradvault.core.store import _write

    encode = _write.encode_chunk
    calls = 0

    def stalling(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == chunk:
            print("stalled", flush=True)
            threading.Event().wait()
        return encode(*args, **kwargs)

    _write.encode_chunk = stalling  # type: ignore[assignment]


def main() -> None:
    url, snapshot_id, rank, world_size = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    if len(sys.argv) > 5:
        _stall_at(int(sys.argv[5]))
    with gv.Recorder(url, **STORE_OPTIONS) as recorder:
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
