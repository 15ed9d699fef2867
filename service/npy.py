"""The header that makes a gradient's raw bytes a ``.npy`` file (NumPy's format, v1.0/2.0).

NumPy's format has no bfloat16 (ml_dtypes' dtype describes itself as ``'<V2'``, opaque
bytes): a bf16 gradient's ``.npy`` says ``'<u2'``, its raw 16-bit patterns, and the
response's ``X-Gradvault-Dtype: bfloat16`` says how to view them
(``np.load(f).view(ml_dtypes.bfloat16)``, bit for bit); docs/SERVICE.md.
"""

from __future__ import annotations

import io

import numpy as np
from numpy.lib import format as npy_format

from gradvault.core.records.dtypes import BFLOAT16_NAME


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The bytes to send before a C-order little-endian array of ``dtype`` and ``shape``."""
    stored = np.dtype("<u2") if dtype == BFLOAT16_NAME else np.dtype(dtype).newbyteorder("<")
    description = {
        "descr": npy_format.dtype_to_descr(stored),
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
