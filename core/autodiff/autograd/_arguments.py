"""Arguments that PyTorch's autograd API takes as one tensor or as a sequence of them."""

from __future__ import annotations

from typing import Any


def as_tuple(x: Any) -> tuple[Any, ...]:
    """``x`` as a tuple: a tuple or list as it is, anything else as a 1-tuple."""
    return tuple(x) if isinstance(x, tuple | list) else (x,)
