"""The snapshot store: gradient snapshots in a Zarr v3 hierarchy, local or on S3.

``open_store(url_or_path)`` gives a :class:`SnapshotStore`; docs/FORMAT.md is the layout.
``SnapshotStore.backend`` is the :class:`StoreBackend` that all its I/O goes through.
"""

from ._backend import GC_MARKER_NAME, ShardWriter, SnapshotWriter, StoreBackend
from ._commit_order import CommitOrder, CommitTurn
from ._device_snapshot import DeviceGradient, DeviceSnapshot
from ._device_stream import CupyCopier, DeviceCopier, RingPool, RingStreamer
from ._ids import new_snapshot_id, parse_snapshot_id
from ._manifest import SnapshotInfo
from ._open import open_store
from ._retention import RetentionRules
from ._shards import ShardInfo, check_rank
from ._snapshot_store import SnapshotStore
from ._zarr_format import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_PACK_THRESHOLD,
    STORE_FORMAT_VERSION,
    parse_compression,
)

__all__ = [
    "CommitOrder",
    "CommitTurn",
    "CupyCopier",
    "DeviceCopier",
    "DeviceGradient",
    "DeviceSnapshot",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_PACK_THRESHOLD",
    "GC_MARKER_NAME",
    "STORE_FORMAT_VERSION",
    "RetentionRules",
    "RingPool",
    "RingStreamer",
    "ShardInfo",
    "ShardWriter",
    "SnapshotInfo",
    "SnapshotStore",
    "SnapshotWriter",
    "StoreBackend",
    "check_rank",
    "new_snapshot_id",
    "open_store",
    "parse_compression",
    "parse_snapshot_id",
]
