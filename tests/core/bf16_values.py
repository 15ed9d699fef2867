"""bfloat16 bit patterns that a round trip must keep: NaN payloads, -0.0, subnormals, inf."""

from __future__ import annotations

import numpy as np

import gradvault.core as gv

#: Every kind of bf16 value, by its 16 bits.
SPECIAL_BITS = np.array(
    [
        0x0000,  # +0.0
        0x8000,  # -0.0
        0x0001,  # the smallest subnormal
        0x807F,  # the largest negative subnormal
        0x0080,  # the smallest normal
        0x7F7F,  # the largest finite
        0xFF7F,  # the most negative finite
        0x7F80,  # +inf
        0xFF80,  # -inf
        0x7FC0,  # the canonical quiet NaN
        0xFFC0,  # a negative quiet NaN
        0x7FC1,  # a quiet NaN with a payload
        0x7F81,  # a signalling NaN with a payload
        0xFFFF,  # all ones: a negative NaN
        0x3F80,  # 1.0
        0xC049,  # about -3.14
    ],
    dtype=np.uint16,
)


def special_values(shape: tuple[int, ...] = (16,), seed: int = 0) -> np.ndarray:
    """A bf16 array of ``shape`` holding every special pattern, then random bits."""
    count = int(np.prod(shape))
    bits = np.random.default_rng(seed).integers(0, 2**16, count, dtype=np.uint16)
    bits[: min(count, SPECIAL_BITS.size)] = SPECIAL_BITS[:count]
    return bits.view(gv.bfloat16).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two bf16 arrays are equal bit for bit (compared as integers)."""
    return (
        a.dtype == b.dtype == gv.bfloat16
        and a.shape == b.shape
        and np.array_equal(a.view(np.uint16), b.view(np.uint16))
    )
