"""The one seam that picks the array module: NumPy for ``cpu``, CuPy for ``cuda:N``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..records.dtypes import check_device


@dataclass(frozen=True, order=True)
class Device:
    """A device: ``cpu`` or ``cuda:N``."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device({str(self)!r})"

    @property
    def backend(self) -> str:
        """``"numpy"`` or ``"cupy"``: the array library that holds this device's data."""
        return "numpy" if self.type == "cpu" else "cupy"


CPU = Device("cpu")


def device(spec: Device | str | None) -> Device:
    """Parse ``spec`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a Device or None for cpu)."""
    if spec is None:
        return CPU
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise DeviceError(f"device must be a string such as 'cpu' or 'cuda:0'; got {spec!r}")
    text = spec.strip().lower()
    if text == "cpu":
        return CPU
    if text == "cuda":
        return Device("cuda", 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return Device("cuda", int(text[5:]))
    raise DeviceError(f"unknown device {spec!r}; expected 'cpu', 'cuda' or 'cuda:N'")


class _CupyGate:
    """CuPy, imported when a cuda device is first asked for and checked for a usable device.

    CuPy imports without a driver; its first call then raises its own CUDARuntimeError.
    The gate asks for the device count once per CuPy module and turns any failure into
    DeviceError.
    """

    def __init__(self) -> None:
        self.checked: ModuleType | None = None

    def module(self) -> ModuleType:
        try:
            import cupy  # optional: imported only when a cuda device is asked for
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise DeviceError(
                "a cuda device needs CuPy; install the extra: pip install 'gradvault[cuda]'"
            ) from exc
        checked = self.checked
        if checked is not None and cupy is checked:
            return checked
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CuPy's CUDARuntimeError, whatever the driver says
            raise DeviceError(
                f"CuPy is installed but there is no usable CUDA device: {type(exc).__name__}: {exc}"
            ) from exc
        if count < 1:
            raise DeviceError("CuPy is installed but there is no usable CUDA device (0 found)")
        self.checked = cupy
        return cupy


_cupy = _CupyGate().module


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        _cupy()
    except DeviceError:
        return False
    return True


def array_module(dev: Device) -> ModuleType:
    """The array module (numpy or cupy) for ``dev``."""
    return np if dev.type == "cpu" else _cupy()


def device_of(array: Any) -> Device:
    """The device an array lives on."""
    if isinstance(array, np.ndarray | np.generic):
        return CPU
    index = getattr(getattr(array, "device", None), "id", 0)
    return Device("cuda", int(index))


def to_device(array: Any, dev: Device) -> Any:
    """``array`` on ``dev``: the same object when it is already there."""
    if device_of(array) == dev:
        return array
    if dev.type == "cpu":
        return array.get()
    check_device(array.dtype, dev)  # CuPy has no bfloat16
    cp = _cupy()
    with cp.cuda.Device(dev.index or 0):
        return cp.asarray(array)


def to_host(array: Any) -> np.ndarray:
    """A NumPy array with the contents of ``array`` (no copy for a NumPy array)."""
    return array if isinstance(array, np.ndarray) else array.get()


def use_device(dev: Device) -> Any:
    """A context manager that makes ``dev`` current for the array module (no-op on cpu)."""
    if dev.type == "cpu":
        return contextlib.nullcontext()
    return _cupy().cuda.Device(dev.index or 0)


def xp_of(array: Any) -> ModuleType:
    """The array module that owns ``array``."""
    return np if isinstance(array, np.ndarray | np.generic) else _cupy()


#: Host arrays of at least this many bytes that the engine makes for results (a matrix
#: product, a gradient's copy or sum) start at a multiple of PAGE_ALIGNMENT: the local store
#: writes such a gradient to disk with O_DIRECT straight from its memory, which needs an
#: aligned address, instead of copying it into an aligned buffer first. Smaller ones are
#: packed by copying anyway.
ALIGNED_MIN_BYTES = 64 << 10
PAGE_ALIGNMENT = 4096
#: Host arrays whose size is a multiple of HUGE_PAGE_ALIGNMENT (2 MiB, a transparent huge
#: page; NumPy asks the kernel for huge pages on allocations of 4 MiB or more) start at a
#: multiple of it: their memory is then whole huge pages, where a page-aligned array gets
#: them only for the 2 MiB stretches that happen to lie inside it. A direct write of 8 MiB
#: pins four pages instead of up to 2,048 (0.14 ms of CPU against 0.28 ms from page-aligned
#: memory, measured). The slack before the boundary is never touched, so it takes address
#: space, not memory. Other sizes stay page-aligned: their last, partial 2 MiB stretch
#: would be backed by a whole huge page (up to 2 MiB of memory more per array).
HUGE_PAGE_ALIGNMENT = 2 << 20


def empty(xp: ModuleType, shape: tuple[int, ...], dtype: Any) -> Any:
    """``xp.empty(shape, dtype)`` (C order); on the host, page-aligned when it is large, and
    at a huge page when its size is a whole number of them."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if xp is not np or nbytes < ALIGNED_MIN_BYTES:
        return xp.empty(shape, dtype)
    alignment = HUGE_PAGE_ALIGNMENT if nbytes % HUGE_PAGE_ALIGNMENT == 0 else PAGE_ALIGNMENT
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _plain_host(array: Any) -> bool:
    """A NumPy ndarray itself (no subclass), C-contiguous."""
    return type(array) is np.ndarray and array.flags.c_contiguous


def empty_like(array: Any) -> Any:
    """``xp.empty_like(array)``: a C-contiguous host array's is page-aligned when large
    (:func:`empty`); any other array's is its module's own (same device, same layout)."""
    if _plain_host(array):
        return empty(np, array.shape, array.dtype)
    return xp_of(array).empty_like(array)


def copy(array: Any) -> Any:
    """``array.copy(order="K")``: a C-contiguous host array's copy is page-aligned when
    large (:func:`empty`); any other array's is its module's own."""
    if _plain_host(array) and array.nbytes >= ALIGNED_MIN_BYTES:
        out = empty(np, array.shape, array.dtype)
        np.copyto(out, array)
        return out
    return array.copy(order="K")


def matmul(a: Any, b: Any) -> Any:
    """``a @ b``; on the host, a large result of two plain arrays of one native-order
    floating dtype, both at least 2-d, goes into a page-aligned array (:func:`empty`)."""
    xp = xp_of(a)
    if (
        type(a) is np.ndarray
        and type(b) is np.ndarray
        and a.ndim >= 2
        and b.ndim >= 2
        and a.dtype == b.dtype
        and a.dtype.kind in "fc"
        and a.dtype.isnative
        and a.shape[-1] == b.shape[-2]
    ):
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return xp.matmul(a, b)  # NumPy's own error
        shape = (*batch, a.shape[-2], b.shape[-1])
        if int(np.prod(shape, dtype=np.int64)) * a.dtype.itemsize >= ALIGNED_MIN_BYTES:
            return np.matmul(a, b, out=empty(np, shape, a.dtype))
    return xp.matmul(a, b)
