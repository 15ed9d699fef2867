"""Gradient records as safetensors files: encode the header, parse one strictly, read, stream.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8
JSON (``{key: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``)
and then the data buffer, each tensor's bytes at ``[begin, end)`` of it, end to end, with
no gap and nothing after the last one. gradvault names each tensor by its ParamId's text
and keeps the rest of a record in ``__metadata__`` (docs/FORMAT.md, "safetensors export and
upload"):

- ``"gradvault.names"``: a JSON object, ParamId text -> gradient name;
- ``"gradvault.param_ids"``: a JSON object, key -> ParamId text, for files whose keys are
  names (a ``state_dict`` saved with ``safetensors``): the key is then the gradient's name;
- ``"gradvault.manifest"``: a JSON object, the record's metadata under ``"metadata"`` and,
  for a snapshot the store serves, the manifest's other summary fields (id, run, step, ...).

The header lists the tensors in the record's order; their bytes are laid out widest
dtype first (:func:`data_order`), so that, as in files the safetensors library writes, every
tensor starts at a multiple of its item size (the data starts at a multiple of 8).

Files come from other machines, so :class:`SafetensorsHeader` refuses anything the format
does not allow, before a byte of data is read: ``InvalidUploadError`` names what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..errors import (
    DtypeMismatchError,
    DuplicateParamError,
    InvalidFieldError,
    InvalidUploadError,
    SizeMismatchError,
)
from .mapped_file import map_readonly
from .param_id import ParamId
from .record import GradientRecordEntry, GradientsParamsRecord
from .record_rules import (
    METADATA_EXPECTED,
    NAME_EXPECTED,
    SHAPE_EXPECTED,
    array_shape_problem,
    check_shape,
    is_name,
    is_shape,
    is_text,
    json_problem,
)

#: The largest JSON header read by default: the safetensors library's own limit.
MAX_HEADER_BYTES = 100_000_000
#: The safetensors dtype code of each dtype a record holds; no other code is accepted.
SAFETENSORS_DTYPES: Mapping[str, str] = {
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "bool": "BOOL",
    "bfloat16": "BF16",
}
_RECORD_DTYPES = {code: name for name, code in SAFETENSORS_DTYPES.items()}
_ITEMSIZE = {name: np.dtype(name).itemsize for name in SAFETENSORS_DTYPES}

#: ``__metadata__`` keys gradvault reads and writes (each value is JSON text).
NAMES_KEY = "gradvault.names"
PARAM_IDS_KEY = "gradvault.param_ids"
MANIFEST_KEY = "gradvault.manifest"
#: How deeply the ``"gradvault.manifest"`` JSON may nest (its metadata must stay writable).
MAX_MANIFEST_DEPTH = 64
#: The manifest fields that tell a record read back which snapshot it came from.
SNAPSHOT_FIELDS = ("id", "run", "step", "created_at", "device", "tags")

_METADATA = "__metadata__"
_LENGTH_BYTES = 8
_TENSOR_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_PARAM_ID_TEXT = re.compile(r"[0-9a-f]{16}")
_DTYPE_CODES = ", ".join(SAFETENSORS_DTYPES.values())


def _refuse(problem: str) -> InvalidUploadError:
    return InvalidUploadError(f"safetensors file: {problem}")


def _show(value: object) -> str:
    """``repr(value)``, cut short: keys and values come from the file and may be huge."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------- writing
def data_order(entries: Sequence[tuple[str, str, Sequence[int], int]]) -> list[int]:
    """The positions of ``entries`` in the order :func:`encode_header` lays out their bytes.

    Widest item size first, the given order among equals: every tensor then starts at a
    multiple of its item size, as in files the safetensors library writes.
    """
    return sorted(range(len(entries)), key=lambda i: -_ITEMSIZE.get(entries[i][1], 1))


def encode_header(
    entries: Iterable[tuple[str, str, Sequence[int], int]], metadata: Mapping[str, str]
) -> bytes:
    """The 8-byte length and the JSON header of a file holding ``entries``, padded to 8 bytes.

    ``entries`` are ``(key, dtype, shape, nbytes)`` with a record dtype name (``"float32"``);
    the header lists them in this order, and their bytes must follow it in
    :func:`data_order`. ``metadata`` becomes ``__metadata__`` (str -> str).
    """
    entries = list(entries)
    tensors: dict[str, Any] = {}
    if metadata:
        for key, value in metadata.items():
            if not (is_text(key) and is_text(value)):
                raise InvalidFieldError(
                    f"safetensors __metadata__ maps strings to strings; got {key!r}: {value!r}"
                )
        tensors[_METADATA] = dict(metadata)
    offsets: list[tuple[int, int]] = [(0, 0)] * len(entries)
    position = 0
    for i in data_order(entries):
        key, dtype, shape, nbytes = entries[i]
        code = SAFETENSORS_DTYPES.get(dtype)
        if code is None:
            raise DtypeMismatchError(
                f"tensor {key!r} has dtype {dtype!r}; a safetensors export holds "
                f"{', '.join(SAFETENSORS_DTYPES)}"
            )
        dims = check_shape(shape, key, key)
        if math.prod(dims) * _ITEMSIZE[dtype] != nbytes:
            raise SizeMismatchError(
                f"tensor {key!r} has {nbytes} bytes; {dtype} x {list(dims)} needs "
                f"{math.prod(dims) * _ITEMSIZE[dtype]}"
            )
        offsets[i] = (position, position + nbytes)
        position += nbytes
    for (key, dtype, shape, _), (begin, end) in zip(entries, offsets, strict=True):
        if not is_text(key) or key == _METADATA:
            raise InvalidFieldError(f"a safetensors key is a string other than {_METADATA!r}")
        if key in tensors:
            raise DuplicateParamError(f"the key {key!r} appears twice in one safetensors file")
        tensors[key] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": [int(n) for n in shape],
            "data_offsets": [begin, end],
        }
    text = json.dumps(tensors, ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(_LENGTH_BYTES, "little") + text


def gradvault_metadata(
    names: Mapping[str, str], manifest: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The ``__metadata__`` gradvault writes: ParamId text -> name and the manifest summary."""
    metadata = {NAMES_KEY: json.dumps(dict(names), ensure_ascii=False, separators=(",", ":"))}
    if manifest is not None:
        metadata[MANIFEST_KEY] = json.dumps(
            dict(manifest), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
    return metadata


def _record_entries(record: GradientsParamsRecord) -> list[tuple[str, str, tuple[int, ...], int]]:
    return [(str(e.param_id), e.dtype, e.shape, e.nbytes) for e in record.entries]


def record_header(
    record: GradientsParamsRecord, *, manifest: Mapping[str, Any] | None = None
) -> bytes:
    """The header of ``record`` as a safetensors file; its data (``record.nbytes``) follows.

    ``manifest`` is the summary to keep under ``"gradvault.manifest"``; by default
    ``{"format_version": ..., "metadata": record.metadata}``.
    """
    if manifest is None:
        manifest = {"format_version": record.format_version, "metadata": record.metadata}
    names = {str(entry.param_id): entry.name for entry in record.entries}
    return encode_header(_record_entries(record), gradvault_metadata(names, manifest))


def safetensors_chunks(
    record: GradientsParamsRecord, *, manifest: Mapping[str, Any] | None = None
) -> Iterator[bytes | memoryview]:
    """``record`` as one safetensors file, piece by piece: the header, then each gradient.

    The gradients' own bytes are yielded (memoryviews, no copies); the file is
    ``len(record_header(record)) + record.nbytes`` bytes long.
    """
    yield record_header(record, manifest=manifest)
    entries = record.entries
    for i in data_order(_record_entries(record)):
        if entries[i].nbytes:
            yield entries[i].data


# ---------------------------------------------------------------------- reading
def _refuse_constant(name: str) -> float:
    raise _refuse(f"the header JSON holds {name}, which JSON does not allow")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _refuse(f"the header JSON holds the number {text}, beyond a float's range")
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _refuse(f"the header JSON has the key {_show(key)} twice in one object")
        result[key] = value
    return result


def _strict_json(text: str, what: str) -> Any:
    """``text`` parsed as JSON that no two readers could read differently."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_object,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except InvalidUploadError as error:
        raise _refuse(f"{what}: {str(error).removeprefix('safetensors file: ')}") from None
    except ValueError as error:
        raise _refuse(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise _refuse(f"{what} nests JSON too deeply") from None


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor of a parsed header: its key, gradient identity, dtype, shape and place.

    ``dtype`` is the record's name (``"float32"``); ``begin`` and ``end`` are offsets in
    the data buffer, which starts at ``SafetensorsHeader.data_start`` in the file.
    """

    key: str
    param_id: ParamId
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class SafetensorsHeader:
    """A safetensors header, checked strictly; build one with :meth:`parse` or :meth:`read_from`.

    ``tensors`` are in the header's order (a record read from the file keeps it),
    ``metadata`` is ``__metadata__`` as written, ``manifest`` the parsed
    ``"gradvault.manifest"`` (or None) and ``record_metadata`` the metadata a record read
    from the file gets. ``header_length`` is the JSON's length ``N``,
    ``data_start`` (``8 + N``) where the data begins, ``data_length`` how many data bytes
    the tensors cover, and ``file_length`` the length the whole file must have.
    """

    def __init__(
        self,
        tensors: tuple[SafetensorsTensor, ...],
        metadata: dict[str, str],
        manifest: dict[str, Any] | None,
        header_length: int,
        data_length: int,
    ) -> None:
        self.tensors = tensors
        self.metadata = metadata
        self.manifest = manifest
        self.record_metadata = _record_metadata(manifest)
        self.header_length = header_length
        self.data_length = data_length

    @property
    def data_start(self) -> int:
        return _LENGTH_BYTES + self.header_length

    @property
    def file_length(self) -> int:
        return self.data_start + self.data_length

    def __repr__(self) -> str:
        return (
            f"SafetensorsHeader({len(self.tensors)} tensors, header {self.header_length} "
            f"bytes, data {self.data_length} bytes)"
        )

    @staticmethod
    def declared_length(
        prefix: bytes | bytearray | memoryview,
        *,
        max_header_bytes: int = MAX_HEADER_BYTES,
        body_bytes: int | None = None,
    ) -> int:
        """The JSON header's length ``N`` that the file's first 8 bytes declare, checked.

        InvalidUploadError if fewer than 8 bytes are given, if ``N`` exceeds
        ``max_header_bytes`` or, when the file's length ``body_bytes`` is known, if the
        header would run past its end.
        """
        if body_bytes is not None and body_bytes < _LENGTH_BYTES:
            raise _refuse(
                f"the file is {body_bytes} bytes; a safetensors file starts with an 8-byte "
                "header length"
            )
        if len(prefix) < _LENGTH_BYTES:
            raise _refuse(
                f"the file ends after {len(prefix)} bytes, inside the 8-byte header length"
            )
        length = int.from_bytes(bytes(prefix[:_LENGTH_BYTES]), "little")
        if length > max_header_bytes:
            raise _refuse(
                f"the header length is {length} bytes; the limit is {max_header_bytes} bytes"
            )
        if body_bytes is not None and _LENGTH_BYTES + length > body_bytes:
            raise _refuse(
                f"the header length is {length} bytes, more than the {body_bytes - 8} bytes "
                f"that follow it in a file of {body_bytes} bytes"
            )
        return length

    @classmethod
    def parse(
        cls,
        prefix: bytes | bytearray | memoryview,
        *,
        max_header_bytes: int = MAX_HEADER_BYTES,
        body_bytes: int | None = None,
    ) -> SafetensorsHeader:
        """The header at the start of ``prefix`` (the file's first ``8 + N`` bytes or more).

        ``body_bytes`` is the whole file's length when known (an upload's length, a file's
        size); the data must then end exactly there. Without it, the caller checks that
        the file is ``file_length`` bytes once it has it all. Raises InvalidUploadError
        naming what is wrong.
        """
        length = cls.declared_length(
            prefix, max_header_bytes=max_header_bytes, body_bytes=body_bytes
        )
        if len(prefix) < _LENGTH_BYTES + length:
            raise _refuse(
                f"the header length is {length} bytes but only {len(prefix) - 8} bytes follow"
            )
        try:
            text = bytes(prefix[_LENGTH_BYTES : _LENGTH_BYTES + length]).decode("utf-8")
        except UnicodeDecodeError as error:
            raise _refuse(f"the header is not valid UTF-8: {error}") from None
        document = _strict_json(text, "the header")
        header = cls._from_document(document, length)
        if body_bytes is not None and body_bytes != header.file_length:
            if body_bytes > header.file_length:
                raise _refuse(
                    f"{body_bytes - header.file_length} trailing bytes: the tensors end at "
                    f"byte {header.file_length} of a file of {body_bytes} bytes"
                )
            raise _refuse(
                f"the file ends early: it is {body_bytes} bytes; its tensors end at byte "
                f"{header.file_length}"
            )
        return header

    @classmethod
    def read_from(
        cls,
        stream: BinaryIO,
        *,
        max_header_bytes: int = MAX_HEADER_BYTES,
        body_bytes: int | None = None,
    ) -> SafetensorsHeader:
        """The header read from the start of a binary ``stream``, which is left after it."""
        prefix = _read_exactly(stream, _LENGTH_BYTES)
        length = cls.declared_length(
            prefix, max_header_bytes=max_header_bytes, body_bytes=body_bytes
        )
        return cls.parse(
            prefix + _read_exactly(stream, length),
            max_header_bytes=max_header_bytes,
            body_bytes=body_bytes,
        )

    # --- the checks ----------------------------------------------------------------
    @classmethod
    def _from_document(cls, document: object, length: int) -> SafetensorsHeader:
        if not isinstance(document, dict):
            raise _refuse(f"the header is a JSON {type(document).__name__}, not an object")
        metadata = _metadata(document.get(_METADATA, {}))
        names = _json_map(metadata, NAMES_KEY, is_name, NAME_EXPECTED)
        param_ids = _json_map(
            metadata, PARAM_IDS_KEY, _is_param_id_text, "a ParamId (16 lowercase hex digits)"
        )
        manifest = None
        if MANIFEST_KEY in metadata:
            manifest = _strict_json(metadata[MANIFEST_KEY], f"__metadata__[{MANIFEST_KEY!r}]")
            if not isinstance(manifest, dict):
                raise _refuse(
                    f"__metadata__[{MANIFEST_KEY!r}] is a JSON {type(manifest).__name__}, "
                    "not an object"
                )

        tensors: list[SafetensorsTensor] = []
        keys_of: dict[ParamId, str] = {}
        for key, info in document.items():
            if key == _METADATA:
                continue
            dtype, shape, begin, end = _tensor_info(key, info)
            if key in param_ids:
                if key in names:
                    raise _refuse(
                        f"tensor {_show(key)} is named both by {NAMES_KEY!r} and by "
                        f"{PARAM_IDS_KEY!r}"
                    )
                param_id, name = ParamId.parse(param_ids[key]), key
                if not is_name(name):
                    raise _refuse(
                        f"tensor key {_show(key)} cannot be a name; expected {NAME_EXPECTED}"
                    )
            elif _is_param_id_text(key):
                param_id, name = ParamId.parse(key), names.get(key, "")
            else:
                raise _refuse(
                    f"tensor key {_show(key)} is neither a ParamId (16 lowercase hex digits) nor a "
                    f"name that __metadata__[{PARAM_IDS_KEY!r}] maps to one"
                )
            if param_id in keys_of:
                raise _refuse(
                    f"tensors {_show(keys_of[param_id])} and {_show(key)} are both param {param_id}"
                )
            keys_of[param_id] = key
            tensors.append(SafetensorsTensor(key, param_id, name, dtype, shape, begin, end))

        for mapping, what in ((names, NAMES_KEY), (param_ids, PARAM_IDS_KEY)):
            stray = [key for key in mapping if key not in document or key == _METADATA]
            if stray:
                raise _refuse(
                    f"__metadata__[{what!r}] has the key {_show(stray[0])}, which names no tensor"
                )
        data_length = _check_layout(tensors)
        return cls(tuple(tensors), metadata, manifest, length, data_length)


def _is_param_id_text(value: object) -> bool:
    return isinstance(value, str) and _PARAM_ID_TEXT.fullmatch(value) is not None


def _metadata(value: object) -> dict[str, str]:
    if value is None:  # the safetensors library reads a null __metadata__ as none
        return {}
    if not isinstance(value, dict):
        raise _refuse(f"__metadata__ is a JSON {type(value).__name__}; expected an object")
    for key, text in value.items():
        if not (is_text(key) and is_text(text)):
            raise _refuse(
                f"__metadata__ maps strings to strings; it has {_show(key)}: {_show(text)}"
            )
    return value


def _json_map(metadata: dict[str, str], key: str, rule: Any, expected: str) -> dict[str, str]:
    """``metadata[key]`` parsed as a JSON object of strings whose values pass ``rule``."""
    if key not in metadata:
        return {}
    mapping = _strict_json(metadata[key], f"__metadata__[{key!r}]")
    if not isinstance(mapping, dict):
        raise _refuse(f"__metadata__[{key!r}] is a JSON {type(mapping).__name__}, not an object")
    for name, value in mapping.items():
        if not is_text(name) or not rule(value):
            raise _refuse(
                f"__metadata__[{key!r}] maps {_show(name)} to {_show(value)}; expected {expected}"
            )
    return mapping


def _tensor_info(key: str, info: object) -> tuple[str, tuple[int, ...], int, int]:
    """The record dtype, shape and offsets of one header entry, each checked."""
    if not isinstance(info, dict):
        raise _refuse(f"tensor {_show(key)} is a JSON {type(info).__name__}; expected an object")
    if set(info) != _TENSOR_FIELDS:
        missing = sorted(_TENSOR_FIELDS - set(info))
        extra = sorted(set(info) - _TENSOR_FIELDS)
        raise _refuse(
            f"tensor {_show(key)} has fields {_show(sorted(info))}; expected exactly dtype, "
            "shape and data_offsets"
            + (f" (missing {missing})" if missing else f" (unknown {_show(extra)})")
        )
    code = info["dtype"]
    dtype = _RECORD_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise _refuse(
            f"tensor {_show(key)} has dtype {_show(code)}; expected one of {_DTYPE_CODES}"
        )
    shape = info["shape"]
    if not isinstance(shape, list) or not is_shape(shape):
        raise _refuse(f"tensor {_show(key)} has shape {_show(shape)}; expected {SHAPE_EXPECTED}")
    offsets = info["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int and n >= 0 for n in offsets)
    ):
        raise _refuse(
            f"tensor {_show(key)} has data_offsets {_show(offsets)}; expected [begin, end], "
            "two ints >= 0"
        )
    begin, end = offsets
    needed = math.prod(shape) * _ITEMSIZE[dtype]
    if end - begin != needed:
        raise _refuse(
            f"tensor {_show(key)} has data_offsets [{begin}, {end}] ({end - begin} bytes); "
            f"{code} x {_show(shape)} needs {needed} bytes"
        )
    problem = array_shape_problem(shape, _ITEMSIZE[dtype])  # an empty one may still be
    if problem is not None:
        raise _refuse(f"tensor {_show(key)} of dtype {code} has shape {_show(shape)}: {problem}")
    return dtype, tuple(shape), begin, end


def _check_layout(tensors: list[SafetensorsTensor]) -> int:
    """The data's length; InvalidUploadError if tensors overlap or leave a gap."""
    position, previous = 0, None
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.begin < position and previous is not None:  # only past a tensor: begin >= 0
            raise _refuse(
                f"tensor {_show(tensor.key)} at bytes [{tensor.begin}, {tensor.end}) overlaps "
                f"tensor {_show(previous.key)} at [{previous.begin}, {previous.end})"
            )
        if tensor.begin > position:
            after = (
                f"after tensor {_show(previous.key)}" if previous else "at the start of the data"
            )
            raise _refuse(
                f"bytes [{position}, {tensor.begin}) of the data belong to no tensor "
                f"({after}, before tensor {_show(tensor.key)}); the format has no gaps"
            )
        position, previous = tensor.end, tensor
    return position


def _read_exactly(stream: BinaryIO, count: int) -> bytes:
    data = stream.read(count)
    while data is not None and len(data) < count:
        more = stream.read(count - len(data))
        if not more:
            break
        data += more
    return data or b""


# ---------------------------------------------------------------------- records
def _nesting_depth(value: object) -> int:
    """How deeply lists and objects nest in ``value`` (walked without recursion)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            pending.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _record_metadata(manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The record's metadata: the manifest's ``metadata``, and ``snapshot`` for a snapshot's
    (with ``rank`` and ``world_size`` for a shard's)."""
    if manifest is None:
        return {}
    depth = _nesting_depth(manifest)
    if depth > MAX_MANIFEST_DEPTH:
        raise _refuse(
            f"__metadata__[{MANIFEST_KEY!r}] nests {depth} levels deep; at most "
            f"{MAX_MANIFEST_DEPTH}"
        )
    metadata = manifest.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise _refuse(
            f"__metadata__[{MANIFEST_KEY!r}]['metadata'] is a JSON "
            f"{type(metadata).__name__}; expected {METADATA_EXPECTED}"
        )
    metadata = dict(metadata)
    if all(field in manifest for field in SNAPSHOT_FIELDS):
        metadata["snapshot"] = {field: manifest[field] for field in SNAPSHOT_FIELDS}
        shard = manifest.get("shard")
        if isinstance(shard, dict):  # one rank's shard: as the store's read of it says
            metadata["snapshot"].update(
                {key: shard[key] for key in ("rank", "world_size") if key in shard}
            )
    problem = json_problem(metadata, "the record's metadata")
    if problem is not None:
        raise _refuse(f"{problem}; expected {METADATA_EXPECTED}")
    return metadata


def record_from_safetensors(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> GradientsParamsRecord:
    """The record a safetensors file (a path, or the file's bytes) holds, bit for bit.

    A file is mapped, not read: the record's arrays are read-only views of the mapping
    (or of the given buffer), so the file must not be changed while the record is used.
    The store's write lets each chunk of a mapped file go once written
    (``gradvault.core.records.mapped_file.release_pages``), so committing the record holds a
    chunk per array in flight of it, not the whole file.
    Names come from ``"gradvault.names"`` (or the keys, under ``"gradvault.param_ids"``),
    metadata from ``"gradvault.manifest"``; a snapshot the store served comes back with
    the metadata ``read_snapshot`` gives, ``"snapshot"`` included. InvalidUploadError if
    the file is malformed (see :class:`SafetensorsHeader`).
    """
    if isinstance(source, bytes | bytearray | memoryview):
        buffer = memoryview(source).cast("B")
    else:
        buffer = map_readonly(source)
    header = SafetensorsHeader.parse(
        buffer, max_header_bytes=max_header_bytes, body_bytes=len(buffer)
    )
    start = header.data_start
    entries = [
        GradientRecordEntry.from_bytes(
            tensor.param_id,
            tensor.name,
            tensor.dtype,
            tensor.shape,
            buffer[start + tensor.begin : start + tensor.end],
        )
        for tensor in header.tensors
    ]
    return GradientsParamsRecord(entries, metadata=header.record_metadata)
