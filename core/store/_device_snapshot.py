"""Captured gradients still on a device, to be written with their large arrays streamed.

A :class:`DeviceSnapshot` is what the store's write path takes instead of a host record
when the gradients live on a CUDA device: each gradient's frozen device buffer (the
capture's copy-on-write lend), its id, name, dtype and shape, and the :class:`RingPool`
its bytes are streamed through. The write copies the small gradients to host whole (they
are packed together); every other one is read chunk by chunk through a ring of pinned
host buffers, so host memory is bounded by the rings, not by the snapshot
(``_write.py``). The bytes written are the ones a host record of the same gradients
would write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DtypeMismatchError, DuplicateParamError
from ..records.param_id import ParamId, as_param_id
from ..records.record import GradientRecordEntry
from ..records.record_rules import DTYPE_NAMES, check_metadata, check_name
from ._device_stream import RingPool


@dataclass(frozen=True)
class DeviceGradient:
    """One captured gradient on its device: id, name, dtype name, shape, and the buffer.

    ``array`` is C-contiguous and little-endian on the device (a CuPy array, or any
    object the pool's copier reads); it is never written to.
    """

    param_id: ParamId
    name: str
    dtype: str
    shape: tuple[int, ...]
    array: Any = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def itemsize(self) -> int:
        return int(self.array.dtype.itemsize)

    def host_entry(self) -> GradientRecordEntry:
        """The gradient read to host whole, as a record entry (for the small ones)."""
        host = self.array if isinstance(self.array, np.ndarray) else self.array.get()
        return GradientRecordEntry.from_array(self.param_id, self.name, host)


class DeviceSnapshot:
    """Gradients captured on a device, with the ring pool their bytes are streamed through.

    ``entries`` are in record order; ``metadata`` is what a record of them would carry
    (``{"device": "cuda:0"}``). Build one with :meth:`of`, which checks what a record
    would check (unique ids, names, dtypes).
    """

    __slots__ = ("entries", "metadata", "rings")

    def __init__(
        self,
        entries: Sequence[DeviceGradient],
        metadata: Mapping[str, Any],
        rings: RingPool,
    ) -> None:
        self.entries = tuple(entries)
        self.metadata = dict(metadata)
        self.rings = rings

    @classmethod
    def of(
        cls,
        param_ids: Sequence[ParamId | str],
        names: Sequence[str],
        arrays: Sequence[Any],
        rings: RingPool,
        metadata: Mapping[str, Any],
    ) -> DeviceSnapshot:
        """The snapshot of ``arrays`` (device buffers) under ``param_ids`` and ``names``.

        Raises as a record would: DuplicateParamError for an id given twice,
        DtypeMismatchError for a dtype a record cannot hold, InvalidFieldError for a name
        or metadata it cannot hold. A buffer that is not C-contiguous is made so on its
        device (a device copy; host memory is not touched).
        """
        check_metadata(dict(metadata))
        entries = []
        seen: set[ParamId] = set()
        for given_id, name, array in zip(param_ids, names, arrays, strict=True):
            pid = given_id if type(given_id) is ParamId else as_param_id(given_id)
            if pid in seen:
                raise DuplicateParamError(f"two snapshot entries map to param {pid} ({name!r})")
            seen.add(pid)
            if type(name) is not str or not name.isascii():
                name = check_name(name, pid)
            dtype_name = DTYPE_NAMES.get(array.dtype)
            if dtype_name is None:
                raise DtypeMismatchError(
                    f"gradient for param {pid} ({name!r}) has dtype {array.dtype}; "
                    f"supported: {', '.join(DTYPE_NAMES.values())}"
                )
            if not array.flags.c_contiguous:
                array = array.copy(order="C")
            shape = tuple(int(n) for n in array.shape)
            entries.append(DeviceGradient(pid, name, dtype_name, shape, array))
        return cls(entries, metadata, rings)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Total bytes of the gradients."""
        return sum(entry.nbytes for entry in self.entries)
