"""gradvault.client: the service over HTTP, blocking (:class:`Client`) or asyncio
(:class:`AsyncClient`), :class:`Snapshotter` for training loops, and :class:`Target`, a
service or a store named by URL or path. docs/CLIENT.md says how to use them.

:class:`Target` imports without httpx (the ``client`` extra), so a store can be named
where only the core is installed; the other names import httpx when first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._target import Target

if TYPE_CHECKING:
    from ._async import AsyncClient
    from ._base import ProgressCallback, SnapshotSummary
    from ._snapshotter import (
        AsyncSnapshotter,
        Snapshotter,
        SnapshotterSummary,
        SnapshotterWarning,
    )
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
    "Target",
]

#: Where each name that needs httpx is defined, imported on first use.
_MODULE_OF = {
    "AsyncClient": "._async",
    "AsyncSnapshotter": "._snapshotter",
    "Client": "._sync",
    "ProgressCallback": "._base",
    "SnapshotSummary": "._base",
    "Snapshotter": "._snapshotter",
    "SnapshotterSummary": "._snapshotter",
    "SnapshotterWarning": "._snapshotter",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'gradvault.client' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
