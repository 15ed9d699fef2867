"""gradvault.integrations.torch: snapshots of the gradients of any PyTorch training loop,
on one process or many (DDP, FSDP2), and their restore, on the same or another world size.

::

    from gradvault.integrations import torch as gv_torch

    info = gv_torch.snapshot(model, "s3://bucket/run", run="r", step=step)  # every rank
    gv_torch.restore(model, "s3://bucket/run", info.id)                      # every rank

Both calls are collective over ``group`` (the default process group, or this process
alone without one); each rank writes its parameters' ``.grad`` (a DTensor's local shard)
as one shard of one snapshot, to a store or, given a service URL (and ``token=`` or
``$GRADVAULT_TOKEN``), as an upload to the service. docs/INTEGRATIONS.md ("Any PyTorch
loop") says what each rank writes, what restores on another world size, what is refused,
and the timeouts.
"""

from gradvault.core.errors import DistributedSnapshotError, UnsupportedSetupError

from ._ranks import DEFAULT_TIMEOUT_SECONDS
from ._restore import restore
from ._snapshot import SnapshotStarted, snapshot, start_snapshot

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "DistributedSnapshotError",
    "SnapshotStarted",
    "UnsupportedSetupError",
    "restore",
    "snapshot",
    "start_snapshot",
]
