"""The one seam through which the callback captures and puts back ``.grad``.

A snapshot is every parameter's ``.grad`` of the module, in its own dtype and bytes, keyed
by the ParamId of its name (``torch_adapter.param_id_of``); restoring sets each ``.grad``
back, checked against the parameters (name, shape, dtype) before anything changes. Both
go through gradvault's public core and client (``GradientsParams.from_torch`` and
``to_torch``, a store's Recorder or the service's Client). This is one process's
gradients: with several processes each rank would save its own, which is not done here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gradvault.core import GradientsParams

from .._target import SnapshotTarget


def snapshot_gradients(
    module: Any, target: SnapshotTarget, *, run: str, step: int, tags: Mapping[str, str]
) -> str:
    """Commit the ``.grad`` of ``module``'s parameters to ``target``; the snapshot's id.

    The training loop waits for the copy to host memory and for the commit.
    """
    record = GradientsParams.from_torch(module).try_to_record()
    return target.push(record, run=run, step=step, tags=tags)


def restore_gradients(module: Any, target: SnapshotTarget, snapshot_id: str) -> None:
    """Set the ``.grad`` of ``module``'s parameters to snapshot ``snapshot_id``'s gradients
    (checksums verified; names, shapes and dtypes checked before any ``.grad`` changes)."""
    device = _device_of(module)
    record = target.fetch(snapshot_id)
    GradientsParams.from_record(record, device).to_torch(module)


def _device_of(module: Any) -> str:
    for parameter in module.parameters():
        device = parameter.device
        return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    return "cpu"


__all__ = ["restore_gradients", "snapshot_gradients"]
