"""bfloat16 in the autodiff engine: bf16 ops compute in float32 and round once.

NumPy arithmetic on ml_dtypes' bfloat16 rounds every intermediate to 8 bits of precision
(a sum of 1000 ones is 256), so no op computes in it: as PyTorch's CPU kernels do, an op
on bf16 tensors widens them to float32 (exactly), computes, and rounds the result to
bf16 once, to nearest even. :func:`widened` and :func:`rounded` are the two halves;
``Function.apply`` (core/autodiff/function.py) and ``Node.apply``
(core/autodiff/graph.py) call them for forward and backward. Ops that only move data
(views, copies, casts, indexing) run on the bf16 bits as they are, so that they stay
views and keep every bit (NaN payloads included). The dtype itself and its name are in
:mod:`gradvault.core.records.dtypes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..records.dtypes import COMPUTE_DTYPE, bfloat16

if TYPE_CHECKING:
    from .tensor import Tensor


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
