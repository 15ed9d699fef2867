"""Helpers shared by the op modules: wrapping scalars and arrays as tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...records.dtypes import is_floating
from .. import backend
from ..tensor import DEFAULT_FLOAT, Tensor, array_of, wrap


def as_tensor_like(value: Any, like: Tensor) -> Tensor:
    """``value`` as a tensor on ``like``'s device; Python scalars take ``like``'s dtype."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, bool | int | float):
        if is_floating(like.dtype) or (isinstance(value, int) and like.dtype.kind in "iu"):
            dtype = like.dtype
        elif isinstance(value, bool):
            dtype = np.dtype(bool)
        elif isinstance(value, int):
            dtype = np.dtype("int64")
        else:
            dtype = DEFAULT_FLOAT
        xp = backend.xp_of(array_of(like))
        return wrap(xp.asarray(value, dtype=dtype))
    array = np.asarray(value)
    return wrap(backend.to_device(array, like.device))


def constant(data: Any) -> Tensor:
    """A tensor outside the graph (masks, indices)."""
    return wrap(data)


def xp(t: Tensor) -> Any:
    return backend.xp_of(array_of(t))


def normalize_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``dim`` (None, an int or a sequence) as sorted non-negative axes; None means all."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise IndexError(f"dimension {d} is out of range for a tensor of {ndim} dims")
        out.append(d % max(ndim, 1))
    return tuple(sorted(set(out)))
