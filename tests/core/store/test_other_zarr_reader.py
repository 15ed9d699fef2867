"""A second Zarr v3 implementation (tensorstore) reads snapshots: the format is standard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core.autodiff.tensor import wrap

ts = pytest.importorskip("tensorstore")


def _open(path: Path):
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_tensorstore_reads_own_and_packed_gradients(
    tmp_path: Path, compression: str | None
) -> None:
    rng = np.random.default_rng(1)
    grads = gv.GradientsParams()
    arrays = [
        rng.standard_normal((300, 200)).astype(np.float32),  # several chunks
        rng.standard_normal(100_000).astype(np.float16),
        rng.standard_normal((7, 3)).astype(np.float64),  # packed
        np.asarray(2.5, dtype=np.float32),
    ]  # 0-d, packed
    for index, array in enumerate(arrays):
        grads.register(gv.ParamId(), wrap(array), name=f"p{index}")
    with gv.Recorder(tmp_path, compression=compression, chunk_bytes=1 << 16) as recorder:
        info = recorder.sync.snapshot(grads, run="other", step=0)
        manifest = recorder.sync.info(info.id)
    group = tmp_path / "snapshots" / info.id
    table = manifest["gradients"]
    packed = None
    for i, pid in enumerate(table["param_id"]):
        expected = grads.get(pid).numpy()
        if table["array"][i] == "packed":
            if packed is None:
                packed = _open(group / "packed").read().result()
            offset, nbytes = table["offset"][i], table["nbytes"][i]
            found = packed[offset : offset + nbytes].view(table["dtype"][i])
            found = found.reshape(tuple(table["shape"][i]))
        else:
            found = _open(group / table["array"][i]).read().result()
        assert found.dtype == expected.dtype and found.shape == expected.shape
        assert found.tobytes() == expected.tobytes()


def test_tensorstore_reads_a_snapshot_of_one_packed_chunk(tmp_path: Path) -> None:
    """A snapshot no longer than a chunk is one chunk of the packed array, its large
    gradients included, and the packed array is the snapshot's node (format 4):
    tensorstore opens the snapshot's folder as the array and reads each gradient as a
    byte range of it."""
    rng = np.random.default_rng(2)
    grads = gv.GradientsParams()
    arrays = [
        rng.standard_normal((256, 512)).astype(np.float32),  # 512 KiB, over pack_threshold
        rng.standard_normal(512).astype(np.float32),
        rng.standard_normal((10, 3)).astype(np.float64),
        rng.standard_normal((64, 1024)).astype(np.float16),
    ]
    for index, array in enumerate(arrays):
        grads.register(gv.ParamId(), wrap(array), name=f"p{index}")
    with gv.Recorder(tmp_path) as recorder:
        info = recorder.sync.snapshot(grads, run="other", step=0)
        manifest = recorder.sync.info(info.id)
    group = tmp_path / "snapshots" / info.id
    table = manifest["gradients"]
    assert set(table["array"]) == {""}  # the snapshot's node itself
    packed = _open(group).read().result()
    for i, pid in enumerate(table["param_id"]):
        expected = grads.get(pid).numpy()
        offset, nbytes = table["offset"][i], table["nbytes"][i]
        found = packed[offset : offset + nbytes].view(table["dtype"][i])
        found = found.reshape(tuple(table["shape"][i]))
        assert found.dtype == expected.dtype and found.shape == expected.shape
        assert found.tobytes() == expected.tobytes()
