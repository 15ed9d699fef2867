"""Min, max and sum of squares of float32 values in one pass, with their crc32c where the
CPU can (_fused_stats.c)."""

from collections.abc import Sequence

import numpy as np

#: Which stats kernel the CPU got: "256-bit vectors (AVX2)" or "128-bit vectors".
KERNEL: str

def min_max_sum_squares(values: np.ndarray | memoryview, /) -> tuple[float, float, float]:
    """(min, max, sum of squares) of a C-contiguous buffer of float32 values; NaN is skipped
    by min and max and makes the sum of squares NaN. TypeError for another format,
    ValueError for a strided or empty buffer."""

def min_max_sum_squares_portable(values: np.ndarray | memoryview, /) -> tuple[float, float, float]:
    """The same by the 128-bit kernel, which every CPU runs."""

def crc32c_min_max_sum_squares(
    values: np.ndarray | memoryview, crc: int, /
) -> tuple[int, float, float, float]:
    """(crc32c, min, max, sum of squares): the crc32c of the values' bytes continued from
    ``crc`` (0: none before), and :func:`min_max_sum_squares`, in one pass by the kernel
    :data:`CHECKSUM_KERNEL` names. Present only where the CPU has SSE4.2, PCLMULQDQ and
    AVX2 with VPCLMULQDQ (256-bit carry-less multiplies); OverflowError for a crc over 32
    bits."""

def crc32c_min_max_sum_squares_256(
    values: np.ndarray | memoryview, crc: int, /
) -> tuple[int, float, float, float]:
    """The same by the 256-bit kernel (tests check it where the CPU gets the 512-bit one).
    Present where :func:`crc32c_min_max_sum_squares` is."""

#: Which kernel takes the crc32c with the stats: "512-bit carry-less multiplies (AVX-512)"
#: where the CPU has AVX-512F, "256-bit carry-less multiplies" otherwise. Present where
#: :func:`crc32c_min_max_sum_squares` is.
CHECKSUM_KERNEL: str

def crc32c_parts(
    parts: Sequence[memoryview | bytes | np.ndarray], stats: Sequence[bool], /
) -> list[tuple[int, int] | tuple[int, int, float, float, float]]:
    """One pass over ``parts`` (C-contiguous buffers) laid end to end, without the GIL:
    for each, ``(running, own)`` crc32c (of every part up to and including it, of it
    alone), and where its flag in ``stats`` is true (float32 values: at least one, a
    multiple of 4 bytes, else ValueError) ``(running, own, min, max, sum of squares)``,
    the values' stats as :func:`min_max_sum_squares`'s taken in the same pass. Present
    where :func:`crc32c_min_max_sum_squares` is."""
