"""A separate process that writes seeded snapshots and applies retention after each commit.

``python -m tests.core.store_churn STORE_URL WRITER_NAME COUNT`` prints ``ready`` once
imported, then for each of COUNT snapshots either ``committed <id> <seed>`` followed by
one ``retained-deleted <id>`` line per snapshot its retention pass deleted, or
``failed <error type> <message>``. S3 connection settings come from the environment.
"""

from __future__ import annotations

import asyncio
import random
import sys

from gradvault.core.errors import GradvaultError
from gradvault.core.store import SnapshotStore, open_store

from .snapshot_writer import seeded_grads

#: Small chunks and a small pack threshold: many files per snapshot, so many steps to race.
CHUNK_BYTES = 64 * 1024
#: 1 MiB and a few small gradients: 16 chunk files of the largest
SHAPES = [(256, 1024), (1024,), (64, 64), (3,)]
PACK_THRESHOLD = 2048
KEEP_LAST = 3


def stall_before_commits(store: SnapshotStore, rng: random.Random) -> None:
    """Make some writes pause between their last array and their commit.

    A writer stalled there is what gc with a short grace period takes for a leftover: the
    race this run is about. Without stalls, a write is rarely idle at that point.
    """
    backend = store.backend
    begin = backend.begin

    async def begin_with_stall(snapshot_id: str, **options: bool):
        writer = await begin(snapshot_id, **options)
        commit = writer.commit

        async def stalled_commit(document: bytes) -> None:
            if rng.random() < 0.15:
                await asyncio.sleep(rng.uniform(0.0, 1.0))
            await commit(document)

        writer.commit = stalled_commit
        return writer

    backend.begin = begin_with_stall


async def churn(url: str, name: str, count: int) -> None:
    async with open_store(url, chunk_bytes=CHUNK_BYTES, pack_threshold=PACK_THRESHOLD) as store:
        stall_before_commits(store, random.Random(name))
        for step in range(count):
            seed = hash((name, step)) % (2**31)
            record = seeded_grads(seed, SHAPES).try_to_record()
            try:
                info = await store.write_snapshot(
                    record, run=name, step=step, tags={"seed": str(seed)}
                )
            except GradvaultError as error:
                message = str(error).replace("\n", " ")
                print(f"failed {type(error).__name__} {message}", flush=True)
                continue
            print(f"committed {info.id} {seed}", flush=True)
            for snapshot_id in await store.apply_retention(KEEP_LAST, run=name, keep=[info.id]):
                print(f"retained-deleted {snapshot_id}", flush=True)


def main() -> None:
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)
    asyncio.run(churn(url, name, count))


if __name__ == "__main__":
    main()
