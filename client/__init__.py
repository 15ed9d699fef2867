"""gradvault.client: the service over HTTP, blocking (:class:`Client`) or asyncio
(:class:`AsyncClient`). docs/CLIENT.md says how to use them."""

from ._async import AsyncClient
from ._base import ProgressCallback, SnapshotSummary
from ._sync import Client

__all__ = ["AsyncClient", "Client", "ProgressCallback", "SnapshotSummary"]
