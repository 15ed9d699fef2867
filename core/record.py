"""GradientsParamsRecord: host copies of gradients, with their ids, names, dtypes and shapes.

A record is what crosses the boundary between the trainer and everything else (the
store, the service, the clients): plain little-endian bytes and metadata, never pickle.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import (
    DtypeMismatchError,
    DuplicateParamError,
    FormatVersionError,
    InvalidArgumentTypeError,
    InvalidFieldError,
    MissingGradientError,
    ShapeMismatchError,
    SizeMismatchError,
)
from .param_id import ParamId, as_param_id
from .record_rules import (
    DTYPE_NAMES,
    NAME_EXPECTED,
    SUPPORTED_DTYPES,
    check_metadata,
    check_name,
    check_shape,
    is_dtype_name,
    is_name,
    is_shape,
)

FORMAT_VERSION = 1


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small objects are built at once.

    Building the entries and tensors of a 10,000-gradient snapshot allocates tens of
    thousands of objects, none of them in cycles; the collections that this triggers over
    everything else the process holds took half of a restore's time (measured).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# NumPy's ``dtype.name`` is computed in Python on every access; capture holds a hot loop
_NAME_OF = DTYPE_NAMES


def _dtype_name(dtype: np.dtype) -> str | None:
    return _NAME_OF.get(dtype)


def _little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


@dataclass(frozen=True)
class GradientRecordEntry:
    """One gradient: ParamId, module path, dtype name, shape and its raw little-endian bytes.

    ``array`` is a read-only, C-contiguous, little-endian NumPy array that owns or shares
    the bytes; ``data`` is the same bytes as a memoryview.
    """

    param_id: ParamId
    name: str
    dtype: str
    shape: tuple[int, ...]
    array: np.ndarray = field(repr=False)

    @classmethod
    def from_array(
        cls, param_id: ParamId | str, name: str, array: np.ndarray
    ) -> GradientRecordEntry:
        """An entry holding ``array`` (copied only if it is not C-contiguous little-endian)."""
        # called once per gradient while the trainer waits: keep it lean
        pid = param_id if type(param_id) is ParamId else as_param_id(param_id)
        if type(name) is not str or not name.isascii():
            name = check_name(name, pid)
        host = array if type(array) is np.ndarray else np.asarray(array)
        dtype = host.dtype
        dtype_name = _NAME_OF.get(dtype)
        if dtype_name is None:
            raise DtypeMismatchError(
                f"gradient for param {param_id} ({name!r}) has dtype {dtype}; "
                f"supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        if not host.flags.c_contiguous or dtype.byteorder == ">":
            host = np.require(host, dtype=_little_endian(dtype), requirements="C")
        # a read-only view: the caller's array stays writable, the record's does not
        host = host.view()
        host.setflags(write=False)
        return cls(pid, name, dtype_name, host.shape, host)

    @classmethod
    def from_bytes(
        cls,
        param_id: ParamId | str,
        name: str,
        dtype: str,
        shape: tuple[int, ...] | list[int],
        data: bytes | bytearray | memoryview,
    ) -> GradientRecordEntry:
        """An entry from raw bytes; raises when dtype, shape and byte count disagree.

        Every dim must be an int >= 0 (a float or a bool is refused, never truncated);
        sizes are computed with Python ints, so no shape overflows.
        """
        pid = as_param_id(param_id)
        name = check_name(name, pid)
        if not is_dtype_name(dtype):
            raise DtypeMismatchError(
                f"gradient for param {pid} ({name!r}) has dtype {dtype!r}; "
                f"supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        shape = check_shape(shape, pid, name)
        np_dtype = _little_endian(np.dtype(dtype))
        expected = math.prod(shape) * np_dtype.itemsize
        found = memoryview(data).nbytes
        if found != expected:
            raise SizeMismatchError(
                f"gradient for param {pid} ({name!r}) has {found} bytes; "
                f"{dtype} x {shape} needs {expected}"
            )
        array = np.frombuffer(data, dtype=np_dtype).reshape(shape)
        array.flags.writeable = False
        return cls(pid, name, dtype, shape, array)

    @property
    def nbytes(self) -> int:
        """Size of the gradient in bytes."""
        return int(self.array.nbytes)

    @property
    def data(self) -> memoryview:
        """The raw little-endian bytes, C order."""
        if not self.array.size:
            return memoryview(b"")
        # as bytes: ml_dtypes' bfloat16 offers no buffer of its own
        return memoryview(self.array.reshape(-1).view(np.uint8))

    def validate(self) -> None:
        """Raise the matching RecorderError if a field cannot be written or fields disagree.

        The id must be a ParamId, the name text a snapshot can hold, the shape a tuple of
        ints >= 0, and dtype, shape and bytes must agree.
        """
        if type(self.param_id) is not ParamId:
            raise InvalidFieldError(
                f"gradient {self.name!r} has param id {self.param_id!r}; expected a ParamId"
            )
        if not is_name(self.name):
            raise InvalidFieldError(
                f"gradient for param {self.param_id} has name {self.name!r}; expected "
                f"{NAME_EXPECTED}"
            )
        if type(self.shape) is not tuple or not is_shape(self.shape):
            raise ShapeMismatchError(
                f"gradient for param {self.param_id} ({self.name!r}) has shape "
                f"{self.shape!r}; expected a tuple of ints >= 0"
            )
        if _dtype_name(self.array.dtype) != self.dtype or self.array.dtype.byteorder == ">":
            raise DtypeMismatchError(
                f"gradient for param {self.param_id} ({self.name!r}) says dtype {self.dtype}; "
                f"its bytes are {self.array.dtype}"
            )
        if self.array.shape != tuple(self.shape):
            expected = math.prod(self.shape) * self.array.dtype.itemsize
            error = ShapeMismatchError if expected == self.array.nbytes else SizeMismatchError
            raise error(
                f"gradient for param {self.param_id} ({self.name!r}) says shape {self.shape}; "
                f"its bytes hold {tuple(self.array.shape)}"
            )


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON-like ``value`` (dicts, lists and tuples copied; the rest shared)."""
    if isinstance(value, Mapping):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(item) for item in value]
    return value


class GradientsParamsRecord:
    """An immutable list of gradient entries plus format version and metadata.

    Immutable throughout: the entries' arrays are read-only, and ``metadata`` hands out
    a copy.

    Iterating gives the entries in order; ``record[param_id]`` finds one by id. Every
    entry is validated (``GradientRecordEntry.validate``), ids must be unique and the
    metadata must be JSON a manifest holds unchanged (``record_rules``), so a record that
    can be built can be written and read back.
    """

    def __init__(
        self,
        entries: list[GradientRecordEntry] | tuple[GradientRecordEntry, ...] = (),
        *,
        metadata: Mapping[str, Any] | None = None,
        format_version: int = FORMAT_VERSION,
    ) -> None:
        self._build(entries, metadata, format_version, check_entries=True)

    @classmethod
    def from_checked_entries(
        cls,
        entries: list[GradientRecordEntry] | tuple[GradientRecordEntry, ...],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> GradientsParamsRecord:
        """A record of entries whose fields are known to agree: made by
        ``GradientRecordEntry.from_array`` or ``from_bytes`` (which check every field), or
        read back by the store against a validated manifest.

        The entries are not validated again (a capture or a restore of many gradients
        would spend its time there); ids must still be unique and the metadata JSON.
        Entries built any other way go through the constructor.
        """
        record = cls.__new__(cls)
        record._build(entries, metadata, FORMAT_VERSION, check_entries=False)
        return record

    def _build(
        self,
        entries: list[GradientRecordEntry] | tuple[GradientRecordEntry, ...],
        metadata: Mapping[str, Any] | None,
        format_version: int,
        *,
        check_entries: bool,
    ) -> None:
        if format_version != FORMAT_VERSION:
            raise FormatVersionError(
                f"record has format version {format_version}; this release reads version "
                f"{FORMAT_VERSION}"
            )
        self._entries = tuple(entries)
        self._by_id: dict[ParamId, GradientRecordEntry] = {}
        for entry in self._entries:
            if check_entries and not isinstance(entry, GradientRecordEntry):
                raise InvalidArgumentTypeError(
                    f"a record holds GradientRecordEntry objects; got {type(entry).__name__}"
                )
            if entry.param_id in self._by_id:
                raise DuplicateParamError(
                    f"param {entry.param_id} ({entry.name!r}) appears twice in the record "
                    f"(first as {self._by_id[entry.param_id].name!r})"
                )
            if check_entries:
                entry.validate()
            self._by_id[entry.param_id] = entry
        self._metadata: dict[str, Any] = _json_copy(check_metadata(metadata))
        self._format_version = format_version

    @property
    def metadata(self) -> dict[str, Any]:
        """The record's metadata: a copy, so changing it never changes the record."""
        return _json_copy(self._metadata)

    @property
    def format_version(self) -> int:
        """The record format version (``FORMAT_VERSION``)."""
        return self._format_version

    @property
    def entries(self) -> tuple[GradientRecordEntry, ...]:
        """The entries, in order."""
        return self._entries

    def __iter__(self) -> Iterator[GradientRecordEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, param_id: object) -> bool:
        try:
            return as_param_id(param_id) in self._by_id  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False

    def __getitem__(self, param_id: ParamId | str) -> GradientRecordEntry:
        pid = as_param_id(param_id)
        try:
            return self._by_id[pid]
        except KeyError:
            raise MissingGradientError(f"record has no gradient for param {pid}") from None

    @property
    def nbytes(self) -> int:
        """Total bytes of every gradient."""
        return sum(entry.nbytes for entry in self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GradientsParamsRecord):
            return NotImplemented
        return len(self) == len(other) and all(
            a.param_id == b.param_id
            and a.name == b.name
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.array.tobytes() == b.array.tobytes()
            for a, b in zip(self._entries, other._entries, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lines = [f"GradientsParamsRecord({len(self)} gradients, {self.nbytes} bytes)"]
        lines += [f"  {e.param_id} {e.name!r} {e.dtype}{list(e.shape)}" for e in self._entries[:20]]
        if len(self) > 20:
            lines.append(f"  ... {len(self) - 20} more")
        return "\n".join(lines)
