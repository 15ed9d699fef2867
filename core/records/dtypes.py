"""The dtypes gradvault names itself: bfloat16, its name, and what "floating" means.

NumPy has no bfloat16; ``ml_dtypes`` gives one (``np.dtype(ml_dtypes.bfloat16)``). Its
dtype reports kind ``'V'`` and ``str`` ``'<V2'``, so gradvault always names it
(``"bfloat16"``), never goes by ``dtype.kind`` or ``dtype.str`` for it, and asks
:func:`is_floating` instead of ``kind == "f"``. Records, the store and the autodiff engine
all take these facts from here.

CuPy has no bfloat16: a bf16 tensor or array never goes to a cuda device
(:func:`check_device` raises ``DtypeMismatchError``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..errors import DtypeMismatchError

#: The bfloat16 dtype (``ml_dtypes.bfloat16``): 1 sign, 8 exponent and 7 mantissa bits.
bfloat16: np.dtype = np.dtype(ml_dtypes.bfloat16)

#: Its name everywhere gradvault writes one (records, manifests, ``zarr.json``).
BFLOAT16_NAME = "bfloat16"

#: What an op on bf16 tensors computes in.
COMPUTE_DTYPE: np.dtype = np.dtype("float32")


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating dtype: NumPy's kind ``'f'``, or bfloat16."""
    return dtype.kind == "f" or dtype == bfloat16


def check_device(dtype: Any, device: Any) -> None:
    """DtypeMismatchError if ``dtype`` is bfloat16 and ``device`` is not the cpu."""
    if dtype == bfloat16 and str(device) != "cpu":
        raise DtypeMismatchError(
            f"bfloat16 tensors live on the cpu only: CuPy has no bfloat16 dtype, so one "
            f"cannot go to {device}; convert it first (.float() keeps every value exactly)"
        )
