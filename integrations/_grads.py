"""The one seam through which a callback captures and puts back ``.grad``: Lightning's
always, the Trainer integration's when several processes train together.

A store target goes through :mod:`gradvault.integrations.torch`: ``snapshot`` and
``restore`` are collective over the default process group (each rank's ``.grad`` one
shard of one snapshot), a single process without one. A service target (a single process
only: the callbacks refuse a service with several processes, not yet wired to shard
uploads here) goes through the client: the gradients' record
pushed whole, fetched back with its checksums verified. Either way every ``.grad`` keeps
its dtype and bytes, and restoring checks names, shapes and dtypes before any ``.grad``
changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gradvault.core import GradientsParams
from gradvault.integrations import torch as torch_integration

from ._target import SnapshotTarget


def snapshot_gradients(
    module: Any, target: SnapshotTarget, *, run: str, step: int, tags: Mapping[str, str]
) -> str:
    """Commit the ``.grad`` of ``module``'s parameters to ``target``; the snapshot's id.

    The training loop waits for the copy to host memory and for the commit.
    """
    if target.is_service:
        record = GradientsParams.from_torch(module).try_to_record()
        return target.push(record, run=run, step=step, tags=tags)
    info = torch_integration.snapshot(
        module,
        target.location,
        run=run,
        step=step,
        tags=tags,
        store_options=target.recorder_options,
    )
    return info.id


def restore_gradients(module: Any, target: SnapshotTarget, snapshot_id: str) -> None:
    """Set the ``.grad`` of ``module``'s parameters to snapshot ``snapshot_id``'s gradients
    (checksums verified; names, shapes and dtypes checked before any ``.grad`` changes)."""
    if target.is_service:
        record = target.fetch(snapshot_id)
        GradientsParams.from_record(record, _device_of(module)).to_torch(module)
        return
    torch_integration.restore(
        module, target.location, snapshot_id, store_options=target.store_options
    )


def _device_of(module: Any) -> str:
    for parameter in module.parameters():
        device = parameter.device
        return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    return "cpu"


__all__ = ["restore_gradients", "snapshot_gradients"]
