"""Validation of a snapshot manifest read back from a store, before anything trusts it.

One pass over the whole document: every field with its type, every gradient column with
one entry per gradient, each ``array`` either ``packed`` or the gradient's own ParamId (so
no storage key can leave the snapshot). Columns are checked whole (a regex over a joined
column, type sets, C-level ``map``) and loops run only to name the culprit once a check
has failed, so that a 10,000-gradient manifest is checked in a few milliseconds.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from itertools import chain, compress, repeat
from operator import add, eq, mul, ne, not_, or_
from typing import Any, NoReturn

import numpy as np
import orjson

from ..errors import ManifestError
from ..records.param_id import ParamId
from ..records.record import SUPPORTED_DTYPES
from ..records.record_rules import (
    DTYPE_EXPECTED,
    NAME_EXPECTED,
    SHAPE_EXPECTED,
    first_invalid_dtype,
    first_invalid_name,
    first_invalid_shape,
)
from ._checksums import format_checksum, parse_checksum
from ._zarr_format import (
    PACKED_ARRAY,
    PACKED_AT_ROOT,
    PACKED_AT_ROOT_FROM,
    Compression,
    parse_compression,
)

#: Per-gradient columns of ``manifest["gradients"]`` (``stats`` holds four more).
GRADIENT_COLUMNS = (
    "param_id",
    "name",
    "dtype",
    "shape",
    "nbytes",
    "checksum",
    "array",
    "offset",
    "chunk_shape",
)
STATS_COLUMNS = ("l2_norm", "max_abs", "nan_count", "inf_count")


_ITEMSIZE = {name: np.dtype(name).itemsize for name in SUPPORTED_DTYPES}
# Whole columns are checked at once: joined into one string (a TypeError if any entry is
# not a string), checked by one regex or one bytes.translate, entry lengths by one set.
_HEX_DIGITS = b"0123456789abcdef"
_HEX_DIGITS_ANY_CASE = b"0123456789abcdefABCDEF"
_CHECKSUM_PREFIX = "crc32c:"
_PARAM_ID_LENGTH = 16
_CHECKSUM_LENGTH = len(format_checksum(0))
_MISSING = object()


class _Said(str):
    """A description of what was found, shown as is rather than as a JSON value."""


def _show(value: object) -> str:
    if value is _MISSING:
        return "nothing (the field is missing)"
    if isinstance(value, _Said):
        return str(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _types(values: list) -> set[type]:
    return set(map(type, values))


def _joined(values: list) -> str | None:
    """The entries of ``values`` end to end, or None if one is not a string."""
    try:
        return "".join(values)
    except TypeError:
        return None


def _parses(parser: Callable[[Any], object], text: object) -> bool:
    """Whether ``parser`` (ParamId.parse, parse_checksum: the one rule) accepts ``text``."""
    try:
        parser(text)
    except ValueError:
        return False
    return True


def _all_checksums(checksums: list) -> bool:
    """Whether every entry is ``crc32c:<8 hex digits>`` (C-speed slices, no loop).

    The bulk form of :func:`parse_checksum`'s rule, for 10,000 entries at once; the entry
    that fails is then found with the parser itself.
    """
    joined = _joined(checksums)
    if joined is None or not set(map(len, checksums)) <= {_CHECKSUM_LENGTH}:
        return False
    data = joined.encode()
    if len(data) != len(joined):  # not ASCII
        return False
    count = len(checksums)
    prefix = _CHECKSUM_PREFIX.encode()
    for k, char in enumerate(prefix):  # k-th character of every entry
        if data[k::_CHECKSUM_LENGTH] != bytes([char]) * count:
            return False
    return all(
        not data[k::_CHECKSUM_LENGTH].translate(None, _HEX_DIGITS_ANY_CASE)
        for k in range(len(prefix), _CHECKSUM_LENGTH)
    )


def _all_param_ids(ids: list) -> bool:
    """Whether every entry is a ParamId's text: the bulk form of ``ParamId.parse``'s rule
    (the entry that fails is then found with the parser itself)."""
    joined = _joined(ids)
    return (
        joined is not None
        and set(map(len, ids)) <= {_PARAM_ID_LENGTH}
        and not joined.encode().translate(None, _HEX_DIGITS)  # nothing but lowercase hex
    )


def packed_name(document: dict[str, Any]) -> str:
    """What a manifest names its packed array by: PACKED_AT_ROOT where it says so (format 4
    on, not a shard's: the snapshot's node is then the packed array), else PACKED_ARRAY."""
    version = document.get("format_version")
    packed = document.get("packed")
    if (
        type(version) is int
        and version >= PACKED_AT_ROOT_FROM
        and document.get("shard") is None
        and type(packed) is dict
        and packed.get("array") == PACKED_AT_ROOT
    ):
        return PACKED_AT_ROOT
    return PACKED_ARRAY


class _ManifestCheck:
    """One validation pass over a manifest document; see :func:`validate_manifest`."""

    def __init__(self, document: dict[str, Any], snapshot_id: str) -> None:
        self.document = document
        self.snapshot_id = snapshot_id
        self.columns: dict[str, Any] = {}
        self.count = 0
        self.packed_rows: list[int] = []
        self.own_rows: list[int] = []
        #: what the manifest names the packed array by (:func:`packed_name`)
        self.packed_name = PACKED_ARRAY

    def fail(
        self, field: str, expected: str, found: object, position: int | None = None
    ) -> NoReturn:
        who = "" if position is None else f" of {self.describe(position)}"
        raise ManifestError(
            f"snapshot {self.snapshot_id}: manifest field {field!r}{who} should be {expected}; "
            f"found {_show(found)}"
        )

    def describe(self, position: int) -> str:
        """``param 9f3c... ('fc1.weight')``, falling back on the position where needed."""
        ids, names = self.columns.get("param_id"), self.columns.get("name")
        pid = ids[position] if isinstance(ids, list) and position < len(ids) else None
        name = names[position] if isinstance(names, list) and position < len(names) else None
        if _parses(ParamId.parse, pid):
            label = f"param {pid}"
        else:
            label = f"gradient #{position}"
        return f"{label} ({name!r})" if isinstance(name, str) else label

    def field(self, key: str, kind: type, expected: str) -> Any:
        value = self.document.get(key, _MISSING)
        if type(value) is not kind:
            self.fail(key, expected, value)
        return value

    def run(self) -> None:
        document = self.document
        if document.get("id", _MISSING) != self.snapshot_id:
            self.fail(
                "id", f"the snapshot's own id {self.snapshot_id!r}", document.get("id", _MISSING)
            )
        if not self.field("run", str, "a non-empty string"):
            self.fail("run", "a non-empty string", "''")
        step = self.field("step", int, "an int >= 0")
        if step < 0:
            self.fail("step", "an int >= 0", step)
        self.field("created_at", str, "an ISO 8601 UTC time (a string)")
        self.field("device", str, "a device string such as 'cpu'")
        tags = self.field("tags", dict, "an object mapping strings to strings")
        if not _types(list(tags.values())) <= {str}:
            self.fail("tags", "an object mapping strings to strings", tags)
        metadata = document.get("metadata")
        if metadata is not None and type(metadata) is not dict:
            self.fail("metadata", "an object or null", metadata)
        compression = document.get("compression", _MISSING)
        try:
            if compression is _MISSING or not (compression is None or type(compression) is str):
                raise ValueError
            parse_compression(compression)
        except ValueError:
            self.fail("compression", "null or 'zstd:<level>'", compression)
        self.check_columns()
        self.check_gradients()
        self.check_totals()
        self.check_packed()
        self.check_own_arrays()

    def check_columns(self) -> None:
        columns = self.field("gradients", dict, "an object of per-gradient columns")
        self.columns = columns
        ids = columns.get("param_id", _MISSING)
        if type(ids) is not list:
            self.fail("gradients.param_id", "a list (one ParamId per gradient)", ids)
        self.count = count = len(ids)
        expected = f"a list of {count} entries, one per gradient (as gradients.param_id)"
        for key in GRADIENT_COLUMNS:
            column = columns.get(key, _MISSING)
            if type(column) is not list:
                self.fail(f"gradients.{key}", expected, column)
            if len(column) != count:
                self.fail(f"gradients.{key}", expected, _Said(f"a list of {len(column)} entries"))
        stats = columns.get("stats", _MISSING)
        if type(stats) is not dict:
            self.fail(
                "gradients.stats", f"an object of the columns {', '.join(STATS_COLUMNS)}", stats
            )
        for key in STATS_COLUMNS:
            column = stats.get(key, _MISSING)
            if type(column) is not list:
                self.fail(f"gradients.stats.{key}", expected, column)
            if len(column) != count:
                self.fail(
                    f"gradients.stats.{key}", expected, _Said(f"a list of {len(column)} entries")
                )

    def first(self, column: Sequence[Any], ok: Any) -> int:
        """The position of the first entry of ``column`` that ``ok`` rejects."""
        return next(i for i, value in enumerate(column) if not ok(value))

    def check_gradients(self) -> None:
        columns, count = self.columns, self.count
        ids, names, dtypes = columns["param_id"], columns["name"], columns["dtype"]
        shapes, sizes, checksums = columns["shape"], columns["nbytes"], columns["checksum"]

        if not _all_param_ids(ids):
            i = self.first(ids, lambda text: _parses(ParamId.parse, text))
            self.fail("gradients.param_id", "a ParamId (16 lowercase hex digits)", ids[i], i)
        if len(set(ids)) != count:
            seen: dict[str, int] = {}
            for i, pid in enumerate(ids):
                if pid in seen:
                    self.fail(
                        "gradients.param_id",
                        "an id no other gradient has",
                        _Said(
                            f"{pid}, also the id of gradient #{seen[pid]} ({names[seen[pid]]!r})"
                        ),
                        i,
                    )
                seen[pid] = i
        # the writer's own rules (record_rules): what it can write, this reads
        invalid = first_invalid_name(names)
        if invalid is not None:
            self.fail("gradients.name", NAME_EXPECTED, names[invalid], invalid)
        invalid = first_invalid_dtype(dtypes)
        if invalid is not None:
            self.fail("gradients.dtype", DTYPE_EXPECTED, dtypes[invalid], invalid)
        invalid = first_invalid_shape(shapes)
        if invalid is not None:
            self.fail("gradients.shape", SHAPE_EXPECTED, shapes[invalid], invalid)
        if not _types(sizes) <= {int} or sizes != list(
            map(mul, map(math.prod, shapes), map(_ITEMSIZE.__getitem__, dtypes))
        ):
            i = self.first(
                range(count),
                lambda i: (
                    type(sizes[i]) is int
                    and sizes[i] == math.prod(shapes[i]) * _ITEMSIZE[dtypes[i]]
                ),
            )
            self.fail(
                "gradients.nbytes",
                f"{math.prod(shapes[i]) * _ITEMSIZE[dtypes[i]]} (shape {tuple(shapes[i])} x "
                f"{_ITEMSIZE[dtypes[i]]}-byte {dtypes[i]})",
                sizes[i],
                i,
            )
        if not _all_checksums(checksums):
            i = self.first(checksums, lambda text: _parses(parse_checksum, text))
            self.fail("gradients.checksum", "'crc32c:<8 hex digits>'", checksums[i], i)
        arrays = columns["array"]
        self.packed_rows, self.own_rows = list(range(count)), []
        packed = self.packed_name = packed_name(self.document)
        if packed == PACKED_AT_ROOT and arrays.count(packed) != count:
            # the snapshot's node is the packed array: it has no other array
            i = self.first(arrays, lambda array: array == PACKED_AT_ROOT)
            self.fail(
                "gradients.array",
                "'' (the packed array, which is the snapshot's node), as for every gradient "
                "of a snapshot whose manifest says packed.array ''",
                arrays[i],
                i,
            )
        if arrays.count(packed) != count:
            is_packed = list(map(eq, arrays, repeat(packed)))
            self.packed_rows = list(compress(range(count), is_packed))
            if not all(map(or_, is_packed, map(eq, arrays, ids))):
                i = self.first(range(count), lambda i: arrays[i] in (packed, ids[i]))
                self.fail(
                    "gradients.array",
                    f"{packed!r} or the gradient's own ParamId {ids[i]!r}",
                    arrays[i],
                    i,
                )
            self.own_rows = list(compress(range(count), map(not_, is_packed)))

    def check_totals(self) -> None:
        nbytes = self.field("nbytes", int, "an int, the sum of gradients.nbytes")
        total = sum(self.columns["nbytes"])
        if nbytes != total:
            self.fail("nbytes", f"{total}, the sum of gradients.nbytes", nbytes)
        if total > sys.maxsize:  # no array of this platform could hold them: a lie
            sizes = self.columns["nbytes"]
            i = max(range(self.count), key=sizes.__getitem__)
            self.fail(
                "gradients.nbytes",
                f"a size this platform can hold in memory (at most {sys.maxsize}), as all "
                f"the gradients together must be",
                sizes[i],
                i,
            )
        num_params = self.field("num_params", int, f"{self.count}, the number of gradients")
        if num_params != self.count:
            self.fail("num_params", f"{self.count}, the number of gradients", num_params)

    def check_packed(self) -> None:
        columns = self.columns
        rows = self.packed_rows
        packed = self.document.get("packed", _MISSING)
        if not rows:
            if packed is not None:
                self.fail("packed", "null, as no gradient is packed", packed)
            return
        if type(packed) is not dict:
            self.fail(
                "packed",
                f"an object describing the {self.packed_name!r} array, as {len(rows)} gradients "
                f"are packed (the first: {self.describe(rows[0])})",
                packed,
            )
        if packed.get("array", _MISSING) != self.packed_name:
            self.fail(
                "packed.array",
                repr(self.packed_name) + (", as the gradients say" if self.packed_name else ""),
                packed.get("array", _MISSING),
            )
        chunk_bytes = packed.get("chunk_bytes", _MISSING)
        if type(chunk_bytes) is not int or chunk_bytes < 1:
            self.fail("packed.chunk_bytes", "an int >= 1", chunk_bytes)
        length = packed.get("nbytes", _MISSING)
        if type(length) is not int or length < 0:
            self.fail("packed.nbytes", "an int >= 0", length)
        if self.packed_name == PACKED_AT_ROOT:  # one uncompressed chunk, as written
            if chunk_bytes != length:
                self.fail(
                    "packed.chunk_bytes",
                    f"{length} (packed.nbytes: the packed array that is the snapshot's node "
                    "is one chunk)",
                    chunk_bytes,
                )
            if self.document.get("compression") is not None:
                self.fail(
                    "compression",
                    "null (the packed array that is the snapshot's node is uncompressed)",
                    self.document.get("compression"),
                )
        offsets, sizes = columns["offset"], columns["nbytes"]
        if len(rows) != self.count:
            offsets = [offsets[i] for i in rows]
            sizes = [sizes[i] for i in rows]
        if not (_types(offsets) <= {int} and min(offsets) >= 0):
            slot = self.first(offsets, lambda offset: type(offset) is int and offset >= 0)
            self.fail(
                "gradients.offset",
                "an int >= 0 (a byte offset in packed)",
                offsets[slot],
                rows[slot],
            )
        ends = list(map(add, offsets, sizes))
        end = max(ends)
        if end == length:
            return
        slot = self.first(ends, lambda stop: stop <= length) if end > length else len(ends) - 1
        if slot < len(ends) - 1:  # a gradient before the last one sticks out: its offset
            self.fail(
                "gradients.offset",
                f"an offset that keeps the gradient's {sizes[slot]} bytes inside the packed "
                f"array's {length} (packed.nbytes)",
                offsets[slot],
                rows[slot],
            )
        self.fail(
            "packed.nbytes",
            f"{end}, where the packed gradients end (the last: {self.describe(rows[-1])})",
            length,
        )

    def check_own_arrays(self) -> None:
        own = self.own_rows
        if not own:
            return
        shapes, chunks = self.columns["shape"], self.columns["chunk_shape"]
        own_chunks = [chunks[i] for i in own]
        suspects = own
        if _types(own_chunks) <= {list}:
            extents = list(chain.from_iterable(own_chunks))
            if _types(extents) <= {int}:
                # a chunk shape of ints equal to its (checked) shape is one whole chunk: fine
                suspects = list(compress(own, map(ne, own_chunks, (shapes[i] for i in own))))
        for i in suspects:
            if not _contiguous_chunks(shapes[i], chunks[i]):
                self.fail(
                    "gradients.chunk_shape",
                    f"a chunk shape of {len(shapes[i])} ints >= 1 for shape {shapes[i]}, of the "
                    f"form [1, ..., 1, k, *shape[a+1:]] with k <= shape[a]",
                    chunks[i],
                    i,
                )


def _contiguous_chunks(shape: list[int], chunk: object) -> bool:
    """Whether ``chunk`` is a chunk shape :func:`chunk_spans` reads for ``shape``."""
    if type(chunk) is not list or len(chunk) != len(shape):
        return False
    if not all(type(n) is int and n >= 0 for n in chunk):
        return False
    if chunk == shape or 0 in shape:
        return True  # one whole chunk, or no chunks at all
    if any(c < 1 or c > n for c, n in zip(chunk, shape, strict=True)):
        return False
    axis = len(shape) - 1
    while axis > 0 and chunk[axis] == shape[axis]:
        axis -= 1
    return all(c == 1 for c in chunk[:axis])


def validate_manifest(document: object, snapshot_id: str) -> None:
    """Check a manifest before anything is read through it; FormatVersionError if malformed.

    One pass over the document (docs/FORMAT.md, "The manifest"): the top-level fields and
    their types, equal-length gradient columns, ParamIds well formed and unique, each
    gradient's ``array`` either ``"packed"`` or its own ParamId (so no storage key built
    from the manifest can leave the snapshot), dtypes supported, shapes consistent with
    ``nbytes``, checksums well formed, packed gradients inside the packed array (which is
    described exactly when some gradient is packed) and own arrays' chunk shapes readable.
    The message names the snapshot, the field and, per gradient, the parameter. Whole
    columns are checked at once (a joined-string regex, type sets) so that 10,000
    gradients cost about a millisecond.
    """
    if type(document) is not dict:
        raise ManifestError(
            f"snapshot {snapshot_id}: the manifest should be a JSON object; found {_show(document)}"
        )
    _ManifestCheck(document, snapshot_id).run()


class ArrayClaim:
    """What the manifest says of one array, to hold its ``zarr.json`` against.

    ``fields`` maps the array document's fields to the manifest fields that state them
    (``{"shape": "gradients.shape", ...}``); ``who`` names the array in messages.
    """

    def __init__(
        self,
        *,
        who: str,
        shape: list[int],
        dtype: str,
        chunk_shape: list[int],
        compression: Compression | None,
        separator: str,
        fields: dict[str, str],
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self.who = who
        self.shape, self.dtype, self.chunk_shape = shape, dtype, chunk_shape
        self.compression = compression
        #: of the chunk keys, as the snapshot's format version has it
        self.separator = separator
        self.fields = fields
        self.attributes = attributes


def _codec_names(codecs: object) -> list[str] | None:
    if type(codecs) is not list or not all(type(c) is dict for c in codecs):
        return None
    names = [codec.get("name") for codec in codecs]
    return names if _types(names) <= {str} else None


def _endian(codecs: list[dict]) -> object:
    configuration = codecs[0].get("configuration") or {}
    return configuration.get("endian", "little") if type(configuration) is dict else None


def validate_array_document(raw: memoryview, claim: ArrayClaim, snapshot_id: str, key: str) -> None:
    """Check an array's ``zarr.json`` says what the manifest says of the array.

    The array document is what every other Zarr reader goes by: a manifest whose dtype,
    shape, chunk shape or compression disagrees with it is refused (FormatVersionError,
    naming the snapshot, the array, the fields and both values) before any chunk is read,
    rather than reinterpreting the bytes the other way.
    """
    try:
        document = orjson.loads(raw)
    except ValueError as error:
        document = _Said(f"no JSON ({error})")
    validate_array_fields(document, claim, snapshot_id, key)


def validate_array_fields(document: object, claim: ArrayClaim, snapshot_id: str, key: str) -> None:
    """:func:`validate_array_document` of a document parsed already (the snapshot's own,
    where the snapshot's node is the packed array: its attributes are the manifest)."""

    def fail(field: str, expected: object, found: object) -> NoReturn:
        source = claim.fields.get(field)
        said = f", as the manifest's field {source!r} says" if source else ""
        raise ManifestError(
            f"snapshot {snapshot_id}: {claim.who}: its array document {key} should have "
            f"{field} {_show(expected)}{said}; found {_show(found)}"
        )

    if type(document) is not dict:
        raise ManifestError(
            f"snapshot {snapshot_id}: {claim.who}: its array document {key} should be a JSON "
            f"object; found {_show(document)}"
        )
    get = document.get
    for field, expected in (("zarr_format", 3), ("node_type", "array")):
        if get(field, _MISSING) != expected:
            fail(field, expected, get(field, _MISSING))
    if get("data_type", _MISSING) != claim.dtype:
        fail("data_type", claim.dtype, get("data_type", _MISSING))
    if get("shape", _MISSING) != claim.shape:
        fail("shape", claim.shape, get("shape", _MISSING))
    grid = get("chunk_grid", _MISSING)
    expected_grid = {"name": "regular", "configuration": {"chunk_shape": claim.chunk_shape}}
    if grid != expected_grid:
        fail("chunk_grid", expected_grid, grid)
    encoding = get("chunk_key_encoding", _MISSING)
    configuration = encoding.get("configuration") if type(encoding) is dict else None
    if (
        type(encoding) is not dict
        or encoding.get("name") != "default"
        or (configuration is not None and type(configuration) is not dict)
        or (configuration or {}).get("separator", "/") != claim.separator
    ):
        fail(
            "chunk_key_encoding",
            _Said(f"default, with separator {claim.separator!r}"),
            encoding,
        )
    if get("storage_transformers") not in (None, []):
        fail("storage_transformers", [], get("storage_transformers"))
    codecs = get("codecs", _MISSING)
    expected_names = (
        ["bytes", "crc32c"] if claim.compression is None else ["bytes", "zstd", "crc32c"]
    )
    names = _codec_names(codecs)
    if names != expected_names:
        fail(
            "codecs", _Said(", ".join(expected_names)), _Said(", ".join(names)) if names else codecs
        )
    if _endian(codecs) != "little":
        fail("codecs", _Said("bytes with endian 'little'"), codecs)
    if claim.attributes is not None:
        attributes = get("attributes")
        ours = attributes.get("gradvault") if type(attributes) is dict else None
        for name, value in claim.attributes.items():
            found = ours.get(name, _MISSING) if type(ours) is dict else _MISSING
            if found != value:
                fail(f"attributes.gradvault.{name}", value, found)
