"""bfloat16: the dtype, its name, and the rule that bf16 ops compute in float32 and round.

NumPy has no bfloat16; ``ml_dtypes`` gives one (``np.dtype(ml_dtypes.bfloat16)``). Its
dtype reports kind ``'V'`` and ``str`` ``'<V2'``, so gradvault always names it
(``"bfloat16"``), never goes by ``dtype.kind`` or ``dtype.str`` for it, and asks
:func:`is_floating` instead of ``kind == "f"``.

NumPy arithmetic on ml_dtypes' bfloat16 rounds every intermediate to 8 bits of precision
(a sum of 1000 ones is 256), so no op computes in it: as PyTorch's CPU kernels do, an op on
bf16 tensors widens them to float32 (exactly), computes, and rounds the result to bf16
once, to nearest even. :func:`widened` and :func:`rounded` are the two halves;
``Function.apply`` (core/function.py) and ``Node.apply`` (core/graph.py) call them for
forward and backward. Ops that only move data (views, copies, casts, indexing) run on
the bf16 bits as they are, so that they stay views and keep every bit (NaN payloads
included).

CuPy has no bfloat16: a bf16 tensor or array never goes to a cuda device
(:func:`check_device` raises ``DtypeMismatchError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from .errors import DtypeMismatchError

if TYPE_CHECKING:
    from .tensor import Tensor

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


def widened(t: Tensor) -> Tensor:
    """A float32 stand-in for the bf16 tensor ``t``, for an op's forward to compute with.

    The values are exact (every bf16 is a float32). It is ``t``'s cast in the graph (when
    ``t`` requires grad), so that a backward rule using a saved stand-in with
    ``create_graph=True`` reaches ``t``; and it shares ``t``'s version counter, so saving it
    for backward still catches a later in-place change of ``t``.
    """
    stand_in = t.to(dtype=COMPUTE_DTYPE)
    stand_in.track_versions_of(t)
    return stand_in


def rounded(data: Any) -> Any:
    """``data`` (float32) rounded to the nearest bfloat16, ties to even (PyTorch's rounding)."""
    return data.astype(bfloat16)


def rounds_result(tensors: list[Tensor]) -> bool:
    """Whether an op on ``tensors`` computes in float32 and rounds to bf16.

    True when some input is bf16 and no floating input is wider (bf16 meeting float32
    promotes to float32 and stays there, as in PyTorch). Called for every op: it looks at
    ``dtype.kind`` first (bfloat16's is ``'V'``), which costs less than comparing dtypes.
    """
    found = False
    for t in tensors:
        dtype = t.dtype
        kind = dtype.kind
        if kind == "f":
            return False
        if kind == "V" and dtype == bfloat16:
            found = True
    return found
