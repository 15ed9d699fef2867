"""Zarr data types gradvault writes that zarr-python 3.1 lacks: ``bfloat16``.

gradvault declares :class:`BFloat16` under zarr-python's ``zarr.data_type`` entry point
(``pyproject.toml``), and importing this module registers it at once: zarr-python 3.1
collects data-type entry points but never loads them, so until it does, a reader writes
``import gradvault.zarr_dtypes`` once; zarr-python then reads and writes the
``"data_type": "bfloat16"`` arrays of a gradvault store bit for bit. This module imports
only NumPy, ml_dtypes and zarr, never gradvault's core.

The type is Zarr v3's registered extension data type ``bfloat16`` (zarr-extensions): no
configuration, the ``bytes`` codec with either endianness, fill values as for floats. A
fill value is a JSON number, ``"NaN"`` (``0x7fc0``), ``"Infinity"``, ``"-Infinity"`` or a
hex string of exactly 4 digits giving the raw bits. This type parses fill values itself:
zarr-python's float helpers read any 4-hex-digit string as float16 bits (``"0x3f80"``
would become 1.875 rather than 1.0).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self, TypeGuard

import ml_dtypes
import numpy as np
from zarr.core.dtype.common import DataTypeValidationError, HasEndianness, HasItemSize
from zarr.core.dtype.npy.common import endianness_to_numpy_str, get_endianness_from_numpy_dtype
from zarr.core.dtype.wrapper import ZDType
from zarr.dtype import data_type_registry

__all__ = ["BFloat16"]

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_HEX_BITS = re.compile(r"0x[0-9a-fA-F]{4}")
_SPECIAL_BITS = {"NaN": 0x7FC0, "Infinity": 0x7F80, "-Infinity": 0xFF80}
_NAME_OF_BITS = {bits: name for name, bits in _SPECIAL_BITS.items()}


def _from_bits(bits: int) -> Any:
    return np.array(bits, dtype=np.uint16).view(_BFLOAT16)[()]


def _bits(value: Any) -> int:
    return int(np.array(value, dtype=_BFLOAT16).view(np.uint16))


@dataclass(frozen=True, kw_only=True)
class BFloat16(ZDType[Any, Any], HasEndianness, HasItemSize):
    """Zarr v3's ``bfloat16`` data type, as ``ml_dtypes.bfloat16`` arrays."""

    dtype_cls: ClassVar[type] = type(_BFLOAT16)
    _zarr_v3_name: ClassVar[Literal["bfloat16"]] = "bfloat16"

    @property
    def item_size(self) -> int:
        """2 bytes."""
        return 2

    @classmethod
    def from_native_dtype(cls, dtype: Any) -> Self:
        """This type for ``ml_dtypes.bfloat16`` (either byte order); refuses any other dtype."""
        if cls._check_native_dtype(dtype):
            return cls(endianness=get_endianness_from_numpy_dtype(dtype))
        raise DataTypeValidationError(f"Invalid data type: {dtype}. Expected {_BFLOAT16}")

    def to_native_dtype(self) -> np.dtype:
        """``ml_dtypes.bfloat16`` in this type's byte order."""
        return _BFLOAT16.newbyteorder(endianness_to_numpy_str(self.endianness))

    @classmethod
    def _from_json_v2(cls, data: Any) -> Self:
        raise DataTypeValidationError("bfloat16 is a Zarr v3 data type; Zarr v2 has none")

    @classmethod
    def _from_json_v3(cls, data: Any) -> Self:
        if data == cls._zarr_v3_name:
            return cls()
        raise DataTypeValidationError(f"Invalid JSON for {cls.__name__}: {data!r}")

    def to_json(self, zarr_format: Literal[2, 3]) -> Any:
        """``"bfloat16"`` (Zarr v3 only)."""
        if zarr_format == 3:
            return self._zarr_v3_name
        raise ValueError("bfloat16 is a Zarr v3 data type; Zarr v2 cannot describe it")

    def _check_scalar(self, data: object) -> TypeGuard[Any]:
        if isinstance(data, str):
            return data in _SPECIAL_BITS or _HEX_BITS.fullmatch(data) is not None
        return isinstance(data, int | float | np.integer | np.floating | ml_dtypes.bfloat16)

    def cast_scalar(self, data: object) -> Any:
        """``data`` (a number, or a JSON fill string) as a ``bfloat16`` scalar."""
        if not self._check_scalar(data) or isinstance(data, bool):
            raise TypeError(f"cannot convert {data!r} ({type(data).__name__}) to bfloat16")
        if isinstance(data, str):
            return _from_bits(_SPECIAL_BITS.get(data) or int(data, 16))
        return np.array(data, dtype=_BFLOAT16)[()]  # a bf16 scalar keeps its bits

    def default_scalar(self) -> Any:
        """Zero."""
        return _from_bits(0)

    def from_json_scalar(self, data: Any, *, zarr_format: Literal[2, 3]) -> Any:
        """A fill value from JSON: a number, ``"NaN"``, ``"±Infinity"`` or ``"0x"`` + 4 hex bits."""
        if isinstance(data, str) and not self._check_scalar(data):
            raise TypeError(
                f"bfloat16 fill value {data!r}: expected a number, 'NaN', 'Infinity', "
                "'-Infinity' or '0x' and 4 hex digits"
            )
        return self.cast_scalar(data)

    def to_json_scalar(self, data: object, *, zarr_format: Literal[2, 3]) -> float | str:
        """A number when finite; ``"NaN"``/``"Infinity"``/``"-Infinity"``; other NaNs as hex."""
        value = self.cast_scalar(data)
        number = float(value)
        if math.isfinite(number):
            return number
        bits = _bits(value)
        return _NAME_OF_BITS.get(bits, f"0x{bits:04x}")


data_type_registry.register(BFloat16._zarr_v3_name, BFloat16)
