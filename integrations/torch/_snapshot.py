"""Collective snapshots: each rank writes its parameters' gradients as one shard.

``start_snapshot`` copies this rank's gradients to host memory (the capture), agrees on
the snapshot id with the other ranks (rank 0 draws it) and writes the shard in the
background, to a store or as an upload to the service; ``SnapshotStarted.result()``
waits for every rank's shard and returns the committed snapshot's info on every rank.
Both are collective: every rank of the group calls them, in the same order as its other
collectives.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from gradvault.client import Target
from gradvault.core import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.errors import DistributedSnapshotError, UnsupportedSetupError
from gradvault.core.records.record_rules import check_snapshot_fields
from gradvault.core.store import ShardSummary, SnapshotInfo, new_snapshot_id

from ._host import host_copy
from ._layout import METADATA_KEY, Placement, layout_metadata, named_parameters
from ._ranks import DEFAULT_TIMEOUT_SECONDS, Ranks
from ._shard_writes import ShardWrite
from ._target import call_target


class SnapshotStarted:
    """A collective snapshot captured on this rank and being written.

    ``id`` is the snapshot's id (the same on every rank). ``result()`` is collective:
    every rank calls it, before its next snapshot, and gets the committed snapshot's
    ``SnapshotInfo``; if any rank's shard failed, or a rank is missing, it raises on every
    rank and nothing is visible.
    """

    def __init__(self, ranks: Ranks, write: ShardWrite, snapshot_id: str) -> None:
        self._ranks = ranks
        self._write = write
        self.id = snapshot_id
        self._outcome: SnapshotInfo | BaseException | None = None

    def done(self) -> bool:
        """Whether this rank's shard is written (or failed); says nothing of the others."""
        return self._write.done()

    def result(self) -> SnapshotInfo:
        """The committed snapshot's info, once every rank's shard is written (collective)."""
        if isinstance(self._outcome, SnapshotInfo):
            return self._outcome
        if self._outcome is not None:
            raise self._outcome
        try:
            self._outcome = self._commit()
        except BaseException as error:
            self._outcome = error
            raise
        return self._outcome

    def _commit(self) -> SnapshotInfo:
        error: BaseException | None = None
        committed = None
        try:
            # bounded too: a write stuck on its store must not keep the others waiting
            snapshot = self._write.committed(timeout=self._ranks.timeout)
            if snapshot is not None:
                committed = dataclasses.asdict(snapshot)
        except concurrent.futures.TimeoutError:
            error = DistributedSnapshotError(
                f"rank {self._ranks.rank}: its shard of snapshot {self.id} was not written "
                f"within {self._ranks.timeout:g} s"
            )
        except Exception as failure:
            error = failure
        self._write.close()  # a stuck write's thread is left to it, not waited for
        statuses = self._ranks.agree("the snapshot's commit", error, committed=committed)
        found = [status["committed"] for status in statuses if status["committed"]]
        if not found:  # a store that keeps its protocol never gets here
            raise DistributedSnapshotError(
                f"every rank wrote its shard of snapshot {self.id}, and none saw it commit"
            )
        shards = tuple(ShardSummary(**shard) for shard in found[0]["shards"])
        return SnapshotInfo(**{**found[0], "shards": shards})


def start_snapshot(
    module: Any,
    target: Target | str | os.PathLike[str],
    *,
    run: str,
    step: int,
    tags: Mapping[str, str] | None = None,
    group: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    token: str | None = None,
    store_options: Mapping[str, Any] | None = None,
) -> SnapshotStarted:
    """Capture ``module``'s gradients on every rank of ``group`` and write them as one
    snapshot in the background; returns once this rank's capture is done (collective).

    ``module`` is a ``torch.nn.Module`` (a DDP wrapper, or a model whose parameters FSDP2
    made DTensors); each rank writes what its parameters' ``.grad`` hold as its shard.
    ``target`` is a store (a folder every rank sees, ``file://``, ``s3://``), opened with
    ``store_options``, or a service URL (``http://``, ``https://``) to which each rank
    uploads its shard with ``token`` (None: ``$GRADVAULT_TOKEN``), which must have write
    access. ``group`` defaults to the default process group (a single process without
    one). A rank that does not reach a step of the call within ``timeout`` seconds makes
    the others raise DistributedSnapshotError.
    """
    ranks = Ranks.of(group, timeout)
    error: BaseException | None = None
    write: ShardWrite | None = None
    record = snapshot_id = None
    try:
        where, options = call_target(target, token, store_options)
        run, step, plain_tags = check_snapshot_fields(run, step, tags)
        record = capture(module)
        write = ShardWrite.to(where, options)
        snapshot_id = new_snapshot_id() if ranks.rank == 0 else None
    except Exception as failure:
        error = failure
    try:
        statuses = ranks.agree("the snapshot's start", error, snapshot_id=snapshot_id)
    except BaseException:
        if write is not None:
            write.close()
        raise
    assert write is not None and record is not None  # no rank failed
    snapshot_id = statuses[0]["snapshot_id"]
    write.start(
        record,
        snapshot_id=snapshot_id,
        rank=ranks.rank,
        world_size=ranks.world_size,
        run=run,
        step=step,
        tags=plain_tags,
    )
    return SnapshotStarted(ranks, write, snapshot_id)


def snapshot(
    module: Any,
    target: Target | str | os.PathLike[str],
    *,
    run: str,
    step: int,
    tags: Mapping[str, str] | None = None,
    group: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    token: str | None = None,
    store_options: Mapping[str, Any] | None = None,
) -> SnapshotInfo:
    """``start_snapshot(...).result()``: returns on every rank once the snapshot is committed."""
    return start_snapshot(
        module,
        target,
        run=run,
        step=step,
        tags=tags,
        group=group,
        timeout=timeout,
        token=token,
        store_options=store_options,
    ).result()


def capture(module: Any) -> GradientsParamsRecord:
    """A record of host copies of this rank's gradients (a DTensor's local shard), with
    their placements in its ``"torch"`` metadata."""
    placements: list[Placement] = []
    entries: list[GradientRecordEntry] = []
    devices: set[str] = set()
    for name, param in named_parameters(module):
        grad = param.grad
        if grad is None:
            continue
        placement = Placement.of(name, grad)
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        if local.layout != torch.strided:
            raise UnsupportedSetupError(
                f"the gradient of {name!r} has layout {local.layout}; gradvault snapshots "
                "dense (torch.strided) gradients"
            )
        devices.add(str(local.device))
        placements.append(placement)
        entries.append(GradientRecordEntry.from_array(placement.param_id, name, host_copy(local)))
    metadata = {
        "device": ",".join(sorted(devices)) or "cpu",
        METADATA_KEY: layout_metadata(placements),
    }
    return GradientsParamsRecord.from_checked_entries(entries, metadata=metadata)
