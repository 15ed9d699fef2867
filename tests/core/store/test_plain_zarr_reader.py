"""A snapshot read by a Python that cannot import gradvault: zarr-python and numpy only.

The reader runs in a subprocess started with ``-S`` (no site initialisation, so the
editable install's path hook is not loaded) and only the site-packages folder on its
path; it first proves that ``import gradvault`` fails there, then follows docs/FORMAT.md.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core.autodiff.tensor import wrap

READER = r"""
import hashlib, json, sys
try:
    import gradvault  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("gradvault is importable here; the test would prove nothing")
import zarr

store, snapshot_id = sys.argv[1], sys.argv[2]
node = zarr.open(store + "/snapshots/" + snapshot_id, mode="r")  # a group, or an array
table = node.attrs["gradvault"]["gradients"]
out = {}
for i, param_id in enumerate(table["param_id"]):
    name = table["array"][i]
    if name in ("packed", ""):  # "": the snapshot's node is the packed array
        packed = node if name == "" else node["packed"]
        off, n = table["offset"][i], table["nbytes"][i]
        array = packed[off : off + n].view(table["dtype"][i])
        array = array.reshape(tuple(table["shape"][i]))
    else:
        array = node[name][...]
    out[param_id] = [str(array.dtype), list(array.shape),
                     hashlib.sha256(array.tobytes()).hexdigest()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_zarr_python_alone_reads_a_snapshot(tmp_path: Path, compression: str | None) -> None:
    """Uncompressed, the snapshot is one chunk, and its node the packed array (format 4);
    with zstd, a group of the packed array and two arrays of their own."""
    rng = np.random.default_rng(0)
    grads = gv.GradientsParams()
    arrays = [
        rng.standard_normal((300, 200)).astype(np.float32),  # its own array
        rng.standard_normal((7, 3)).astype(np.float64),  # packed
        np.asarray(1.5, dtype=np.float16),  # 0-d, packed
        np.zeros((0, 5), dtype=np.float32),  # empty
        rng.integers(-5, 5, (4, 4)).astype(np.int64),
        rng.standard_normal(100_000).astype(np.float16),
    ]  # float16, own array
    for index, array in enumerate(arrays):
        grads.register(gv.ParamId(), wrap(array), name=f"p{index}")
    with gv.Recorder(tmp_path, compression=compression) as recorder:
        info = recorder.sync.snapshot(grads, run="plain", step=0)
    document = json.loads((tmp_path / "snapshots" / info.id / "zarr.json").read_bytes())
    assert document["node_type"] == ("array" if compression is None else "group")
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run(
        [sys.executable, "-S", "-c", READER, str(tmp_path), info.id],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": site_packages},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    expected = {
        str(pid): [
            str(grads.get(pid).dtype),
            list(grads.get(pid).shape),
            hashlib.sha256(grads.get(pid).numpy().tobytes()).hexdigest(),
        ]
        for pid in grads
    }
    assert read == expected


def test_zarr_python_alone_reads_a_shard_of_a_sharded_snapshot(tmp_path: Path) -> None:
    """A rank's shard is a snapshot group of its own: the same reader, pointed at it."""
    rng = np.random.default_rng(1)
    records = []
    for _ in range(2):
        grads = gv.GradientsParams()
        grads.register(gv.ParamId(), wrap(rng.standard_normal((300, 200)).astype(np.float32)))
        grads.register(gv.ParamId(), wrap(rng.standard_normal((7, 3)).astype(np.float64)))
        records.append(grads)
    snapshot_id = gv.new_snapshot_id()
    with gv.Recorder(tmp_path) as recorder:
        for rank, grads in enumerate(records):
            recorder.sync.snapshot_shard(
                grads, snapshot_id=snapshot_id, rank=rank, world_size=2, run="plain", step=0
            )
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run(
        [sys.executable, "-S", "-c", READER, str(tmp_path), f"{snapshot_id}/ranks/1"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": site_packages},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    grads = records[1]
    assert json.loads(result.stdout) == {
        str(pid): [
            str(grads.get(pid).dtype),
            list(grads.get(pid).shape),
            hashlib.sha256(grads.get(pid).numpy().tobytes()).hexdigest(),
        ]
        for pid in grads
    }
