"""Store format 2: a manifest's checksum of itself is the one docs/FORMAT.md defines.

(Edits refused: tests/core/store/test_store_hostile.py, test_store_shards.py; format 1
read: test_format_fixtures.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import open_store

from ..store_files import manifest_checksum


async def test_a_written_manifest_hashes_as_the_format_defines_it(tmp_path: Path) -> None:
    """Floats of both notations, non-ASCII text and escapes: the stored checksum is the one
    computed apart from gradvault, from the parsed document."""
    rng = np.random.default_rng(5)
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(), "層.weight", rng.standard_normal(7)),
            GradientRecordEntry.from_array(ParamId(), "tiny", np.full(3, 1e-7, np.float32)),
        ],
        metadata={"lr": 1e-7, "decay": 0.00001, "big": 1e16, "note": 'é/"\\\t\u2028'},
    )
    async with open_store(tmp_path / "store") as store:
        info = await store.write_snapshot(record, run="r", step=0)
    raw = (tmp_path / "store" / "snapshots" / info.id / "zarr.json").read_bytes()
    manifest = json.loads(raw)["attributes"]["gradvault"]
    assert manifest["format_version"] == 4
    assert manifest["manifest_checksum"] == manifest_checksum(manifest)
