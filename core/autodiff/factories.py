"""Factories: ``tensor``, ``zeros``, ``ones``, ``full``, ``randn``, ``rand``, ``arange``, ...

Each takes ``dtype``, ``device`` and ``requires_grad``; what they make is a leaf.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DeviceError, DtypeMismatchError
from ..records.dtypes import check_device
from . import backend
from .tensor import (
    DEFAULT_FLOAT,
    DeviceLike,
    DTypeLike,
    Tensor,
    as_dtype,
    bool_,
    int64,
    wrap,
    wrap_shared,
)

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed the random factories (``randn``, ``rand``) and ``Dropout``."""
    global _generator
    _generator = np.random.default_rng(seed)
    cupy = sys.modules.get("cupy")  # seeded only when a cuda device has been used
    if cupy is not None:
        cupy.random.seed(seed)


def generator() -> np.random.Generator:
    """The NumPy generator behind the random factories."""
    return _generator


def _finish(data: Any, dtype: np.dtype | None, device: DeviceLike, requires_grad: bool) -> Tensor:
    dev = backend.device(device)
    check_device(data.dtype if dtype is None else dtype, dev)
    if dtype is not None and data.dtype != dtype:
        data = data.astype(dtype)
    if dev.type != "cpu":
        data = backend.to_device(data, dev)
    t = wrap(data)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(
    data: Any, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (lists of floats become float32)."""
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


#: DLPack's device types: host memory, and CUDA device memory
_DLPACK_CPU, _DLPACK_CUDA = 1, 2


def from_dlpack(array: Any) -> Tensor:
    """A leaf tensor on ``array``'s own memory, shared, not copied (``torch.from_dlpack``).

    ``array`` is anything that exports DLPack (a PyTorch tensor, a NumPy or CuPy array).
    Host memory becomes a cpu tensor, CUDA memory a ``cuda:N`` tensor (CuPy needed).
    Writes through either side are seen by the other, so a record taken of the tensor
    copies its bytes. DeviceError for memory of another kind, DtypeMismatchError for a
    dtype the array module cannot hold (bfloat16 in NumPy).
    """
    device_type, index = (int(n) for n in array.__dlpack_device__())
    if device_type == _DLPACK_CPU:
        module = np
    elif device_type == _DLPACK_CUDA:
        module = backend.array_module(backend.device(f"cuda:{index}"))
    else:
        raise DeviceError(
            f"{type(array).__name__} lives on DLPack device type {device_type}; "
            f"gradvault shares host ({_DLPACK_CPU}) and CUDA ({_DLPACK_CUDA}) memory only"
        )
    try:
        data = module.from_dlpack(array)
    except (BufferError, RuntimeError, TypeError) as error:
        dtype = getattr(array, "dtype", "?")
        raise DtypeMismatchError(
            f"{type(array).__name__} of dtype {dtype} cannot be shared with "
            f"{module.__name__}: {error}"
        ) from error
    return wrap_shared(data)


def _size(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], tuple | list):
        size = tuple(size[0])
    return tuple(int(n) for n in size)


def _filled(
    fill: Callable[[Any, tuple[int, ...], np.dtype], Any],
    size: tuple[Any, ...],
    dtype: DTypeLike,
    device: DeviceLike,
    requires_grad: bool,
) -> Tensor:
    dev = backend.device(device)
    dt = as_dtype(dtype) or DEFAULT_FLOAT
    check_device(dt, dev)
    xp = backend.array_module(dev)
    with backend.use_device(dev):
        data = fill(xp, _size(size), dt)
    return _finish(data, dt, dev, requires_grad)


def zeros(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """A tensor of zeros."""
    return _filled(lambda xp, s, d: xp.zeros(s, d), size, dtype, device, requires_grad)


def ones(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """A tensor of ones."""
    return _filled(lambda xp, s, d: xp.ones(s, d), size, dtype, device, requires_grad)


def full(
    size: Sequence[int],
    fill_value: Any,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """A tensor filled with ``fill_value``."""
    if dtype is None:
        dtype = (
            bool_
            if isinstance(fill_value, bool)
            else (int64 if isinstance(fill_value, int) else DEFAULT_FLOAT)
        )
    return _filled(
        lambda xp, s, d: xp.full(s, fill_value, d), (tuple(size),), dtype, device, requires_grad
    )


def _random(
    kind: str, size: tuple[Any, ...], dtype: DTypeLike, device: DeviceLike, requires_grad: bool
) -> Tensor:
    dt = as_dtype(dtype) or DEFAULT_FLOAT
    shape = _size(size)
    data = _generator.standard_normal(shape) if kind == "normal" else _generator.random(shape)
    return _finish(np.asarray(data, dtype=dt), dt, device, requires_grad)


def randn(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Samples of the standard normal distribution."""
    return _random("normal", size, dtype, device, requires_grad)


def rand(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Samples of the uniform distribution on [0, 1)."""
    return _random("uniform", size, dtype, device, requires_grad)


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Evenly spaced values in [start, end)."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        dtype = int64 if is_int else DEFAULT_FLOAT
    data = np.arange(start, end, step)
    return _finish(data, as_dtype(dtype), device, requires_grad)


def _like(
    fn: Callable[..., Tensor],
    other: Tensor,
    dtype: DTypeLike,
    device: DeviceLike,
    requires_grad: bool,
    *args: Any,
) -> Tensor:
    return fn(
        *args,
        dtype=dtype or other.dtype,
        device=device or other.device,
        requires_grad=requires_grad,
    )


def zeros_like(
    t: Tensor, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    return _like(zeros, t, dtype, device, requires_grad, t.shape)


def ones_like(
    t: Tensor, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    return _like(ones, t, dtype, device, requires_grad, t.shape)


def full_like(
    t: Tensor,
    fill_value: Any,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(full, t, dtype, device, requires_grad, t.shape, fill_value)


def randn_like(
    t: Tensor, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    return _like(randn, t, dtype, device, requires_grad, t.shape)


def rand_like(
    t: Tensor, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    return _like(rand, t, dtype, device, requires_grad, t.shape)
