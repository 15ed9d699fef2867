"""gradvault.client: the service over HTTP, blocking (:class:`Client`) or asyncio
(:class:`AsyncClient`), and :class:`Snapshotter` for training loops. docs/CLIENT.md says
how to use them."""

from ._async import AsyncClient
from ._base import ProgressCallback, SnapshotSummary
from ._snapshotter import AsyncSnapshotter, Snapshotter, SnapshotterSummary, SnapshotterWarning
from ._sync import Client

__all__ = [
    "AsyncClient",
    "AsyncSnapshotter",
    "Client",
    "ProgressCallback",
    "SnapshotSummary",
    "Snapshotter",
    "SnapshotterSummary",
    "SnapshotterWarning",
]
