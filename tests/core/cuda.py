"""The gate of the gpu test modules: CuPy and a CUDA device, or a clean skip."""

from __future__ import annotations

from types import ModuleType

import pytest


def require_cuda() -> ModuleType:
    """CuPy, when it imports and sees a device; otherwise the calling module is skipped."""
    cupy = pytest.importorskip("cupy")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # a driver without a device raises instead of returning 0
        devices = 0
    if devices == 0:
        pytest.skip("no CUDA device", allow_module_level=True)
    return cupy
