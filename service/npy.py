"""The header that makes a gradient's raw bytes a ``.npy`` file (NumPy's format, v1.0/2.0)."""

from __future__ import annotations

import io

import numpy as np
from numpy.lib import format as npy_format


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The bytes to send before a C-order little-endian array of ``dtype`` and ``shape``."""
    description = {
        "descr": npy_format.dtype_to_descr(np.dtype(dtype).newbyteorder("<")),
        "fortran_order": False,
        "shape": tuple(shape),
    }
    buffer = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buffer, description)
    except ValueError:  # a header over 64 KiB (a shape of very many dims) needs version 2.0
        buffer = io.BytesIO()
        npy_format.write_array_header_2_0(buffer, description)
    return buffer.getvalue()
