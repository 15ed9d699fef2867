"""GradientsParamsRecord: host copies of gradients, with their ids, names, dtypes and shapes.

A record is what crosses the boundary between the trainer and everything else (the
store, the service, the clients): plain little-endian bytes and metadata, never pickle.
"""

from __future__ import annotations

import abc
import contextlib
import gc
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import (
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
    check_array_shape,
    check_metadata,
    check_name,
    check_shape,
    is_dtype_name,
    is_name,
    is_shape,
)

FORMAT_VERSION = 1

#: held while a record held by column builds its arrays or entries (RLock: the entries
#: are built from the arrays)
_LAZY_BUILD = threading.RLock()


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


def read_only_array(array: np.ndarray) -> np.ndarray:
    """``array`` as a record holds it: a read-only view when it is C-contiguous and
    little-endian, else a read-only copy that is. The caller's array stays writable."""
    if not array.flags.c_contiguous or array.dtype.byteorder == ">":
        array = np.require(array, dtype=_little_endian(array.dtype), requirements="C")
    view = array.view()
    view.flags.writeable = False
    return view


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
        host = read_only_array(host)
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
        sizes are computed with Python ints, so no shape overflows, and a shape NumPy
        cannot hold (over 64 dims, or dims whose product overflows, empty arrays
        included) is a ShapeMismatchError.
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
        check_array_shape(shape, np_dtype.itemsize, pid, name)  # an empty one may still be
        array = np.frombuffer(data, dtype=np_dtype).reshape(shape)
        array.flags.writeable = False
        return cls(pid, name, dtype, shape, array)

    @classmethod
    def _unchecked(
        cls, param_id: ParamId, name: str, dtype: str, array: np.ndarray
    ) -> GradientRecordEntry:
        """The entry of fields known to agree (a record held by column), shape the array's.

        Fills the fields at once: the frozen dataclass's ``__init__`` sets them one
        ``object.__setattr__`` at a time, a third of the cost of 10,000 entries.
        """
        entry = object.__new__(cls)
        entry.__dict__.update(
            param_id=param_id, name=name, dtype=dtype, shape=array.shape, array=array
        )
        return entry

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
        return self.array.reshape(-1).view(np.uint8).data

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
    if type(value) is dict or isinstance(value, Mapping):  # a dict without the ABC check
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(item) for item in value]
    return value


class RecordColumns(NamedTuple):
    """A record's gradients by column, in record order: what bulk readers and writers take.

    ``arrays`` are the entries' arrays (read-only, C-contiguous, little-endian); a
    gradient's shape is its array's.
    """

    param_ids: tuple[ParamId, ...]
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    arrays: tuple[np.ndarray, ...]


class LazyArrays(abc.ABC):
    """A record's arrays, built all at once the first time they are read (a capture's).

    ``from_columns`` takes one in place of the arrays; ``nbytes`` and ``shapes`` answer
    ``record.nbytes`` and ``repr`` without building them.
    """

    __slots__ = ()

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of arrays."""

    @abc.abstractmethod
    def build(self) -> Sequence[np.ndarray]:
        """Every array (read-only, C-contiguous, little-endian), in record order."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Their total size in bytes."""

    @abc.abstractmethod
    def shapes(self, count: int) -> list[tuple[int, ...]]:
        """The shapes of the first ``count`` arrays."""


class GradientsParamsRecord:
    """An immutable list of gradient entries plus format version and metadata.

    Immutable throughout: the entries' arrays are read-only, and ``metadata`` hands out
    a copy.

    Iterating gives the entries in order; ``record[param_id]`` finds one by id. Every
    entry is validated (``GradientRecordEntry.validate``), ids must be unique and the
    metadata must be JSON a manifest holds unchanged (``record_rules``), so a record that
    can be built can be written and read back.

    A record of many gradients is held by column (``from_columns``: a capture, a
    restore): its entry objects, and for a capture its arrays, are built together the
    first time an entry is asked for; ``columns()`` reads them without building entries.
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

    @classmethod
    def from_columns(
        cls,
        param_ids: Sequence[ParamId],
        names: Sequence[str],
        dtypes: Sequence[str],
        arrays: Sequence[np.ndarray] | LazyArrays,
        *,
        metadata: Mapping[str, Any] | None = None,
        unique_ids: bool = False,
    ) -> GradientsParamsRecord:
        """A record of gradients given by column, whose fields are known to agree.

        As for ``from_checked_entries``, the caller vouches for every field: ids are
        ParamIds, names text a snapshot can hold, and each array read-only, C-contiguous,
        little-endian, of the dtype named in ``dtypes``. ``arrays`` may be ``LazyArrays``,
        built (all at once) the first time they are read. Ids must be unique: checked
        here unless ``unique_ids`` says the caller knows (the keys of a dict, a validated
        manifest's column). No entry object is built until one is asked for.
        """
        count = len(param_ids)
        if len(names) != count or len(dtypes) != count:
            raise InvalidArgumentTypeError(
                f"record columns differ in length: {count} ids, {len(names)} names, "
                f"{len(dtypes)} dtypes"
            )
        if not unique_ids and len(set(param_ids)) != count:
            seen: dict[ParamId, str] = {}
            for pid, name in zip(param_ids, names, strict=True):
                if pid in seen:
                    raise DuplicateParamError(
                        f"param {pid} ({name!r}) appears twice in the record "
                        f"(first as {seen[pid]!r})"
                    )
                seen[pid] = name
        record = cls.__new__(cls)
        record._entries = None
        record._by_id = None
        record._ids, record._names, record._dtypes = tuple(param_ids), tuple(names), tuple(dtypes)
        if len(arrays) != count:
            raise InvalidArgumentTypeError(
                f"record columns differ in length: {count} ids, {len(arrays)} arrays"
            )
        if isinstance(arrays, LazyArrays):
            record._arrays, record._lazy = None, arrays
        else:
            record._arrays, record._lazy = tuple(arrays), None
        record._nbytes = None
        record._metadata = _json_copy(check_metadata(metadata))
        record._format_version = FORMAT_VERSION
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
        self._entries: tuple[GradientRecordEntry, ...] | None = tuple(entries)
        by_id: dict[ParamId, GradientRecordEntry] = {}
        for entry in self._entries:
            if check_entries and not isinstance(entry, GradientRecordEntry):
                raise InvalidArgumentTypeError(
                    f"a record holds GradientRecordEntry objects; got {type(entry).__name__}"
                )
            if entry.param_id in by_id:
                raise DuplicateParamError(
                    f"param {entry.param_id} ({entry.name!r}) appears twice in the record "
                    f"(first as {by_id[entry.param_id].name!r})"
                )
            if check_entries:
                entry.validate()
            by_id[entry.param_id] = entry
        self._by_id: dict[ParamId, GradientRecordEntry] | None = by_id
        # a record made from columns holds these instead of entries (from_columns)
        self._ids: tuple[ParamId, ...] | None = None
        self._names: tuple[str, ...] | None = None
        self._dtypes: tuple[str, ...] | None = None
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._lazy: LazyArrays | None = None
        self._nbytes: int | None = None
        self._metadata: dict[str, Any] = _json_copy(check_metadata(metadata))
        self._format_version = format_version

    def _held_columns(self) -> tuple[tuple[ParamId, ...], tuple[str, ...], tuple[str, ...]]:
        """The ids, names and dtypes of a record made from columns."""
        ids, names, dtypes = self._ids, self._names, self._dtypes
        assert ids is not None and names is not None and dtypes is not None
        return ids, names, dtypes

    def _column_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays of a record held by column, built now if they are not yet."""
        arrays = self._arrays
        if arrays is None:
            with _LAZY_BUILD:  # two threads reading a new record build its arrays once
                arrays = self._arrays
                if arrays is None:
                    lazy, (ids, _, _) = self._lazy, self._held_columns()
                    assert lazy is not None  # a record made from columns holds one or the other
                    arrays = tuple(lazy.build())
                    if len(arrays) != len(ids):
                        raise InvalidArgumentTypeError(
                            f"record columns differ in length: {len(ids)} ids, {len(arrays)} arrays"
                        )
                    self._arrays = arrays
        return arrays

    def _all_entries(self) -> tuple[GradientRecordEntry, ...]:
        """The entries, built (all at once, in one pass) the first time they are needed."""
        entries = self._entries
        if entries is None:
            arrays = self._column_arrays()
            entry = GradientRecordEntry._unchecked
            with _LAZY_BUILD, paused_gc():
                entries = self._entries
                if entries is None:
                    entries = tuple(map(entry, *self._held_columns(), arrays))
                    self._entries = entries
        return entries

    def _index(self) -> dict[ParamId, GradientRecordEntry]:
        by_id = self._by_id
        if by_id is None:
            entries = self._all_entries()
            ids, _, _ = self._held_columns()  # made from entries, it has _by_id from the start
            by_id = self._by_id = dict(zip(ids, entries, strict=True))
        return by_id

    def columns(self) -> RecordColumns:
        """The gradients by column (ids, names, dtypes, arrays), without building entries."""
        if self._entries is None or self._ids is not None:
            return RecordColumns(*self._held_columns(), self._column_arrays())
        entries = self._entries
        return RecordColumns(
            tuple(e.param_id for e in entries),
            tuple(e.name for e in entries),
            tuple(e.dtype for e in entries),
            tuple(e.array for e in entries),
        )

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
        return self._all_entries()

    def __iter__(self) -> Iterator[GradientRecordEntry]:
        return iter(self._all_entries())

    def __len__(self) -> int:
        if self._entries is None:
            return len(self._held_columns()[0])
        return len(self._entries)

    def __contains__(self, param_id: object) -> bool:
        try:
            return as_param_id(param_id) in self._index()
        except (ValueError, TypeError):
            return False

    def __getitem__(self, param_id: ParamId | str) -> GradientRecordEntry:
        pid = as_param_id(param_id)
        try:
            return self._index()[pid]
        except KeyError:
            raise MissingGradientError(f"record has no gradient for param {pid}") from None

    @property
    def nbytes(self) -> int:
        """Total bytes of every gradient."""
        if self._nbytes is None:
            if self._arrays is None and self._lazy is not None:
                self._nbytes = self._lazy.nbytes
            elif self._entries is None:
                self._nbytes = sum(int(array.nbytes) for array in self._column_arrays())
            else:
                self._nbytes = sum(entry.nbytes for entry in self._entries)
        return self._nbytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GradientsParamsRecord):
            return NotImplemented
        if len(self) != len(other):
            return False
        mine, theirs = self.columns(), other.columns()
        return (
            mine.param_ids == theirs.param_ids
            and mine.names == theirs.names
            and mine.dtypes == theirs.dtypes
            and all(
                a.shape == b.shape and a.tobytes() == b.tobytes()
                for a, b in zip(mine.arrays, theirs.arrays, strict=True)
            )
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        # cheap whatever the size (asyncio's task reprs call it): builds no entries
        lines = [f"GradientsParamsRecord({len(self)} gradients, {self.nbytes} bytes)"]
        if self._entries is not None:
            rows = [(e.param_id, e.name, e.dtype, e.shape) for e in self._entries[:20]]
        else:
            if self._arrays is None and self._lazy is not None:
                shapes = self._lazy.shapes(20)
            else:
                shapes = [array.shape for array in self._column_arrays()[:20]]
            ids, names, dtypes = self._held_columns()
            head = (ids[:20], names[:20], dtypes[:20], shapes[:20])
            rows = list(zip(*head, strict=True))
        lines += [f"  {pid} {name!r} {dtype}{list(shape)}" for pid, name, dtype, shape in rows]
        if len(self) > 20:
            lines.append(f"  ... {len(self) - 20} more")
        return "\n".join(lines)
