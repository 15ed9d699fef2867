"""The snapshot store: gradient snapshots in a Zarr v3 hierarchy, local or on S3.

``open_store(url_or_path)`` gives a :class:`SnapshotStore`; docs/FORMAT.md is the layout.
``SnapshotStore.backend`` is the :class:`StoreBackend` that all its I/O goes through.
The Recorder (``recorder.py``) lives here too; the commit order it keeps and the
device-streaming machinery it hands gradients on a CUDA device to (``_commit_order.py``,
``_device_snapshot.py``, ``_device_stream.py``) are the package's own.
"""

from ._backend import GC_MARKER_NAME, ShardWriter, SnapshotWriter, StoreBackend
from ._ids import new_snapshot_id, parse_snapshot_id
from ._manifest import ShardSummary, SnapshotInfo
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
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_PACK_THRESHOLD",
    "GC_MARKER_NAME",
    "STORE_FORMAT_VERSION",
    "RetentionRules",
    "ShardInfo",
    "ShardSummary",
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
