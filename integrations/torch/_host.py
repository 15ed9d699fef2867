"""Gradients between torch tensors and the host arrays a record holds, every bit kept.

bfloat16 crosses as its 16-bit patterns (``torch.int16`` viewed as ``ml_dtypes``'
bfloat16), as the core's torch adapter shares it: NumPy has no bfloat16 of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradvault.core.records.dtypes import BFLOAT16_NAME, bfloat16


def host_copy(tensor: Any) -> np.ndarray:
    """A host copy of ``tensor`` (any device): nothing training does later changes it."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).to("cpu", copy=True).numpy().view(bfloat16)
    return tensor.to("cpu", copy=True).numpy()


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian NumPy dtype a snapshot's dtype name stands for."""
    if name == BFLOAT16_NAME:
        return bfloat16
    dtype = np.dtype(name)
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def dtype_name(dtype: Any) -> str:
    """A torch dtype as a snapshot names it (``torch.float32`` -> ``float32``)."""
    return str(dtype).removeprefix("torch.")


def to_torch(array: np.ndarray) -> Any:
    """A torch tensor on ``array``'s (writable, little-endian, C-order) memory."""
    if array.dtype == bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
