"""Factories: ``tensor``, ``zeros``, ``ones``, ``full``, ``randn``, ``rand``, ``arange``, ...

Each takes ``dtype``, ``device`` and ``requires_grad``; what they make is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import backend
from .bfloat16 import check_device, is_floating
from .tensor import DEFAULT_FLOAT, DeviceLike, DTypeLike, Tensor, as_dtype, bool_, int64

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed the random factories (``randn``, ``rand``) and ``Dropout``."""
    global _generator
    _generator = np.random.default_rng(seed)
    if "cupy" in __import__("sys").modules:
        __import__("cupy").random.seed(seed)


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
    t = Tensor._make(data)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(
    data: Any, *, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (lists of floats become float32)."""
    dtype = as_dtype(dtype)
    if isinstance(data, Tensor):
        array = data._data.copy()
        if device is None:
            device = data.device
    elif isinstance(data, np.ndarray):
        array = data.copy()
    elif hasattr(data, "__cuda_array_interface__"):
        array = data.copy()
        if device is None:
            device = backend.device_of(data)
    else:
        array = np.array(data)
        if dtype is None and array.dtype == np.float64 and not isinstance(data, np.generic):
            array = array.astype(DEFAULT_FLOAT)
        elif dtype is None and array.dtype.kind in "iu":
            array = array.astype(int64)
    if array.dtype.kind not in "iub" and not is_floating(array.dtype):
        raise TypeError(f"can't make a tensor from data of dtype {array.dtype}")
    return _finish(array, dtype, device, requires_grad)


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
