"""The streamed device-to-host path on ``cuda:0``: bytes intact, host memory bounded.

Skipped cleanly when CuPy is not installed or sees no CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradvault.core.store._device_stream import CupyCopier, RingStreamer

from ..cuda import require_cuda

pytestmark = pytest.mark.gpu

cupy = require_cuda()


@pytest.mark.parametrize("nbytes", [1, 4096, (64 << 20) + 13])
def test_streamed_bytes_equal_the_device_buffer(nbytes: int) -> None:
    device_array = cupy.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=cupy.uint8)
    expected = device_array.get()
    ring = RingStreamer(CupyCopier(0), slots=3, slot_bytes=8 << 20)
    got = np.empty(nbytes, np.uint8)
    position = 0
    for view in ring.stream(device_array, nbytes):
        got[position : position + len(view)] = np.frombuffer(view, np.uint8)
        position += len(view)
    assert position == nbytes
    np.testing.assert_array_equal(got, expected)
    assert ring.host_bytes == 3 * (8 << 20)


def test_the_stream_sees_writes_queued_before_it_on_the_current_stream() -> None:
    device_array = cupy.zeros(1 << 20, dtype=cupy.uint8)
    device_array += 7  # queued on the current stream; the side stream must wait for it
    ring = RingStreamer(CupyCopier(0), slots=2, slot_bytes=1 << 18)
    assert all(bytes(view) == b"\x07" * len(view) for view in ring.stream(device_array, 1 << 20))
