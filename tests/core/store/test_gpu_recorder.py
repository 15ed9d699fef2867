"""Records, copy-on-write capture and the recorder with gradients on ``cuda:0``.

Skipped cleanly when CuPy is not installed or sees no CUDA device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams

from ..cuda import require_cuda

pytestmark = pytest.mark.gpu

require_cuda()

DEVICE = "cuda:0"


def _model_with_grads() -> gv.MLP:
    gv.manual_seed(0)
    model = gv.MLP(16, [64, 64], 4).to(DEVICE)
    x = gv.randn(8, 16, device=DEVICE)
    y = gv.tensor(np.arange(8) % 4, device=DEVICE)
    gv.cross_entropy(model(x), y).backward()
    return model


def _host_bytes(grads: GradientsParams) -> dict[gv.ParamId, bytes]:
    return {pid: grads.get(pid).cpu().numpy().tobytes() for pid in grads}


def test_record_round_trip_on_the_device_is_bit_identical() -> None:
    model = _model_with_grads()
    grads = GradientsParams.from_module_grad(model)
    record = grads.try_to_record(backend="cupy")
    assert record.metadata["device"] == DEVICE
    restored = GradientsParams.from_record(record, DEVICE)
    assert all(restored.get(pid).device == gv.device(DEVICE) for pid in restored)
    assert _host_bytes(restored) == _host_bytes(grads)
    with pytest.raises(gv.BackendMismatchError):
        grads.try_to_record(backend="numpy")


def test_device_capture_is_a_point_in_time(tmp_path: Path) -> None:
    model = _model_with_grads()
    grads = GradientsParams.from_module_grad(model)
    expected = _host_bytes(grads)
    with gv.Recorder(tmp_path) as recorder:
        handle = recorder.start_snapshot(grads, run="gpu", step=0)
        x = gv.randn(8, 16, device=DEVICE)
        gv.cross_entropy(model(x), gv.tensor(np.arange(8) % 4, device=DEVICE)).backward()
        gv.SGD(momentum=0.9).step(0.1, model, grads)
        model.zero_grad(set_to_none=False)
        info = handle.result()
        restored = recorder.sync.restore(info.id, DEVICE)
    assert _host_bytes(restored) == expected


def test_a_recorded_snapshot_streamed_from_the_device_restores_bit_identical(
    tmp_path: Path,
) -> None:
    """Large cuda gradients are streamed to the store chunk by chunk (several chunks
    each, edge chunks included); small ones are packed. The snapshot restores bit for
    bit, and its manifest is the one a host record of the same gradients gets."""
    gv.manual_seed(3)
    shapes = {"big.weight": (1000, 300), "edge.weight": (3, 70, 1000), "bias": (16,)}
    grads = GradientsParams()
    for name, shape in shapes.items():
        grads.register(gv.ParamId(), gv.randn(*shape, device=DEVICE), name=name)
    half = gv.randn(257, 129, device=DEVICE).to(gv.float16)
    grads.register(gv.ParamId(), half, name="half.weight")
    expected = _host_bytes(grads)
    with gv.Recorder(tmp_path / "streamed", chunk_bytes=1 << 18) as recorder:
        info = recorder.sync.snapshot(grads, run="gpu", step=0)
        restored = recorder.sync.restore(info.id, DEVICE)
        streamed_manifest = recorder.sync.info(info.id)
    assert _host_bytes(restored) == expected
    host_record = grads.try_to_record(backend="cupy")  # read to host whole
    with gv.Recorder(tmp_path / "host", chunk_bytes=1 << 18) as recorder:
        host_info = recorder.sync.snapshot(host_record, run="gpu", step=0)
        host_manifest = recorder.sync.info(host_info.id)
    # the manifest's checksum of itself covers its id and time, which differ; each was
    # checked against its own manifest when info() read it
    for manifest in (streamed_manifest, host_manifest):
        for key in ("id", "created_at", "manifest_checksum"):
            manifest.pop(key)
    assert streamed_manifest == host_manifest
