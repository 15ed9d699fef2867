"""Records as safetensors files: what we write the safetensors library reads, and back.

The ``safetensors`` package is the reference reader and writer. Every malformed kind of
file is refused by ``SafetensorsHeader`` with an InvalidUploadError naming what is wrong.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load, load_file, save, save_file

import gradvault.core as gv
from gradvault.core import (
    DtypeMismatchError,
    GradientRecordEntry,
    GradientsParamsRecord,
    InvalidUploadError,
    ParamId,
    SizeMismatchError,
)
from gradvault.core.records.safetensors_file import (
    MANIFEST_KEY,
    NAMES_KEY,
    PARAM_IDS_KEY,
    SAFETENSORS_DTYPES,
    SafetensorsHeader,
    data_order,
    encode_header,
    record_from_safetensors,
    record_header,
    safetensors_chunks,
)

# safetensors.numpy has no bf16; tests/core/autodiff/test_bfloat16.py reads BF16 with
# safetensors.torch
DTYPES = [dtype for dtype in SAFETENSORS_DTYPES if dtype != "bfloat16"]


def entry(name: str, array: np.ndarray, pid: ParamId | None = None) -> GradientRecordEntry:
    return GradientRecordEntry.from_array(pid or ParamId(), name, array)


def sample_record() -> GradientsParamsRecord:
    rng = np.random.default_rng(0)
    return GradientsParamsRecord(
        [
            entry("fc1.weight", rng.standard_normal((3, 5)).astype(np.float32)),
            entry("fc1.bias", np.array([np.nan, -0.0, np.inf], dtype=np.float16)),
            entry("embed.ids", np.arange(7, dtype=np.int64)),
            entry("mask", np.array([[True, False]])),
            entry("", np.zeros((0, 4), dtype=np.float64)),
            entry("scalar", np.array(2.5, dtype=np.float64)),
            entry("énorme ✓", np.arange(5, dtype=np.uint8)),
        ],
        metadata={"epoch": 3, "notes": ["a", 1.5]},
    )


def file_bytes(record: GradientsParamsRecord, **options: Any) -> bytes:
    return b"".join(bytes(chunk) for chunk in safetensors_chunks(record, **options))


def assert_bit_identical(record: GradientsParamsRecord, arrays: dict[str, np.ndarray]) -> None:
    assert set(arrays) == {str(e.param_id) for e in record}
    for gradient in record:
        found = arrays[str(gradient.param_id)]
        assert found.dtype == gradient.array.dtype.newbyteorder("=")
        assert found.shape == gradient.shape
        assert found.tobytes() == gradient.array.tobytes()


# --- writing: the safetensors library reads what we write -----------------------------


def test_the_library_reads_a_record_bit_for_bit_with_names_and_manifest(tmp_path: Path) -> None:
    record = sample_record()
    data = file_bytes(record)
    assert len(data) == len(record_header(record)) + record.nbytes
    assert_bit_identical(record, load(data))

    path = tmp_path / "grads.safetensors"
    path.write_bytes(data)
    assert_bit_identical(record, load_file(path))
    with safe_open(path, framework="numpy") as opened:
        metadata = opened.metadata()
    names = json.loads(metadata[NAMES_KEY])
    assert list(names.items()) == [(str(e.param_id), e.name) for e in record]
    assert json.loads(metadata[MANIFEST_KEY]) == {"format_version": 1, "metadata": record.metadata}


def test_every_tensor_starts_at_a_multiple_of_its_item_size() -> None:
    record = sample_record()
    data = file_bytes(record)
    header = SafetensorsHeader.parse(data, body_bytes=len(data))
    assert header.data_start % 8 == 0
    for tensor in header.tensors:
        itemsize = np.dtype(tensor.dtype).itemsize
        assert (header.data_start + tensor.begin) % itemsize == 0, tensor
    # the header keeps the record's order, the data is widest first
    assert [t.param_id for t in header.tensors] == [e.param_id for e in record]
    assert [t.begin for t in header.tensors] != sorted(t.begin for t in header.tensors)


def test_a_header_is_byte_identical_to_the_library_s_own() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    for metadata in ({}, {"ü": "✓ v"}):  # one key: the library orders keys by hash
        theirs = save({"9f3c0a1b2c3d4e5f": array}, metadata=metadata or None)
        ours = encode_header([("9f3c0a1b2c3d4e5f", "float32", (2, 3), 24)], metadata)
        assert theirs == ours + array.tobytes()


def test_chunks_are_the_gradients_own_buffers() -> None:
    record = sample_record()
    chunks = list(safetensors_chunks(record))
    data_chunks = chunks[1:]
    big = record.entries[0]
    assert any(
        isinstance(chunk, memoryview) and np.shares_memory(np.asarray(chunk), big.array)
        for chunk in data_chunks
    )
    assert len(data_chunks) == sum(1 for e in record if e.nbytes)  # empty gradients: no chunk


def test_encode_header_refuses_what_it_cannot_describe() -> None:
    with pytest.raises(DtypeMismatchError, match="uint16"):
        encode_header([("a", "uint16", (2,), 4)], {})
    with pytest.raises(SizeMismatchError, match="needs 8"):
        encode_header([("a", "float32", (2,), 7)], {})
    with pytest.raises(gv.DuplicateParamError, match="'a'"):
        encode_header([("a", "uint8", (1,), 1), ("a", "uint8", (1,), 1)], {})
    with pytest.raises(gv.InvalidFieldError):
        encode_header([], {"k": 1})  # type: ignore[dict-item]


def test_data_order_is_widest_first_and_stable() -> None:
    entries = [
        ("a", "uint8", (1,), 1),
        ("b", "float64", (1,), 8),
        ("c", "float16", (1,), 2),
        ("d", "int64", (1,), 8),
        ("e", "bool", (1,), 1),
    ]
    assert data_order(entries) == [1, 3, 2, 0, 4]


# --- reading: we read what the library writes -----------------------------------------


def test_a_file_the_library_wrote_reads_back_bit_for_bit(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        str(ParamId()): rng.standard_normal((4, 3)).astype(np.float64),
        str(ParamId()): rng.integers(-5, 5, size=(2, 2, 2)).astype(np.int16),
        str(ParamId()): np.array([True, False, True]),
    }
    names = {key: f"layer{i}" for i, key in enumerate(arrays)}
    path = tmp_path / "theirs.safetensors"
    save_file(arrays, path, metadata={NAMES_KEY: json.dumps(names), "format": "np"})
    record = record_from_safetensors(path)
    assert_bit_identical(record, arrays)
    assert {str(e.param_id): e.name for e in record} == names
    assert record.metadata == {}
    for gradient in record:
        assert not gradient.array.flags.writeable


def test_name_keys_are_taken_when_param_ids_maps_them() -> None:
    ids = {"fc.weight": str(ParamId()), "fc.bias": str(ParamId())}
    arrays = {"fc.weight": np.ones((2, 2), np.float32), "fc.bias": np.zeros(2, np.float32)}
    data = save(arrays, metadata={PARAM_IDS_KEY: json.dumps(ids)})
    record = record_from_safetensors(data)
    assert {e.name: str(e.param_id) for e in record} == ids
    for gradient in record:
        assert gradient.array.tobytes() == arrays[gradient.name].tobytes()


def test_a_round_trip_through_a_file_keeps_order_names_metadata_and_bits(tmp_path: Path) -> None:
    record = sample_record()
    path = tmp_path / "r.safetensors"
    with open(path, "wb") as file:
        for chunk in safetensors_chunks(record):
            file.write(chunk)
    back = record_from_safetensors(path)
    assert back == record
    assert back.metadata == record.metadata
    assert [e.name for e in back] == [e.name for e in record]
    assert record_from_safetensors(str(path)) == record


def test_read_from_a_stream_reads_only_the_header() -> None:
    data = file_bytes(sample_record())
    stream = io.BytesIO(data)
    header = SafetensorsHeader.read_from(stream, body_bytes=len(data))
    assert stream.tell() == header.data_start
    assert header.file_length == len(data)
    assert len(header.tensors) == len(sample_record())


def test_a_snapshot_manifest_gives_the_metadata_read_snapshot_gives() -> None:
    record = GradientsParamsRecord([entry("w", np.ones(3, np.float32))], metadata={"a": 1})
    manifest = {
        "format_version": 1,
        "id": "01J0000000000000000000000A",
        "run": "r",
        "step": 4,
        "created_at": "2025-01-01T00:00:00.000Z",
        "device": "cpu",
        "backend": "numpy",
        "tags": {"t": "u"},
        "metadata": {"a": 1},
    }
    back = record_from_safetensors(file_bytes(record, manifest=manifest))
    assert back.metadata == {
        "a": 1,
        "snapshot": {k: manifest[k] for k in ("id", "run", "step", "created_at", "device", "tags")},
    }


# --- property: random records round-trip through both readers and writers -------------


@st.composite
def records(draw: st.DrawFn) -> GradientsParamsRecord:
    count = draw(st.integers(0, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(count):
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if dtype == "bool":
            array = rng.integers(0, 2, size=shape).astype(bool)
        else:  # any bit pattern: NaN payloads, -0.0 and infinities included
            array = np.frombuffer(rng.bytes(size), dtype=dtype).reshape(shape)
        name = draw(st.text(max_size=8))
        entries.append(entry(name if draw(st.booleans()) else f"p{i}", array))
    return GradientsParamsRecord(entries, metadata=draw(st.sampled_from([None, {"k": [1, "x"]}])))


@settings(max_examples=60, deadline=None)
@given(records())
def test_random_records_round_trip_through_the_library(record: GradientsParamsRecord) -> None:
    data = file_bytes(record)
    arrays = load(data)
    assert_bit_identical(record, arrays)
    back = record_from_safetensors(data)
    assert back == record and back.metadata == record.metadata
    # and what the library writes from the same arrays reads back to the same gradients
    names = {str(e.param_id): e.name for e in record}
    theirs = record_from_safetensors(
        save(arrays, metadata={NAMES_KEY: json.dumps(names)}) if arrays else save({})
    )
    assert {e.param_id: (e.name, e.dtype, e.shape, e.array.tobytes()) for e in theirs} == {
        e.param_id: (e.name, e.dtype, e.shape, e.array.tobytes()) for e in record
    }


# --- malformed files: one test per kind ------------------------------------------------

PID = "9f3c0a1b2c3d4e5f"
PID2 = "0123456789abcdef"


def raw(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A file with ``header`` (an object dumped as JSON, or the header's exact bytes)."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(text) if length is None else length).to_bytes(8, "little") + text + data


def tensor(dtype: str = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def refused(data: bytes, *, match: str, **options: Any) -> InvalidUploadError:
    """Both the header parser and record_from_safetensors refuse ``data`` saying ``match``."""
    with pytest.raises(InvalidUploadError, match=match) as caught:
        SafetensorsHeader.parse(data, body_bytes=len(data), **options)
    with pytest.raises(InvalidUploadError, match=match):
        record_from_safetensors(data, **options)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, gv.GradvaultError)
    return caught.value


def test_a_well_formed_minimal_file_is_accepted() -> None:
    data = raw({PID: tensor()}, bytes(8))
    header = SafetensorsHeader.parse(data, body_bytes=len(data))
    assert header.tensors[0].param_id == ParamId.parse(PID) and header.data_length == 8
    assert record_from_safetensors(data)[PID].array.tolist() == [0.0, 0.0]


def test_header_length_over_the_limit() -> None:
    data = raw({PID: tensor()}, bytes(8))
    refused(data, match=r"header length is \d+ bytes; the limit is 16 bytes", max_header_bytes=16)
    # the limit is checked from the first 8 bytes alone, before the header is read
    with pytest.raises(InvalidUploadError, match="limit"):
        SafetensorsHeader.declared_length((2**40).to_bytes(8, "little"))


def test_header_length_past_the_end_of_the_file() -> None:
    refused(
        raw({PID: tensor()}, bytes(8), length=10_000), match="more than the .* bytes that follow"
    )
    refused(raw(b"", length=2**64 - 1), match="limit")


def test_file_shorter_than_the_length_field() -> None:
    refused(b"\x08\x00\x00", match="8-byte header length")
    with pytest.raises(InvalidUploadError, match="inside the 8-byte header length"):
        SafetensorsHeader.parse(b"\x08\x00")


def test_header_cut_short_when_parsing_a_prefix() -> None:
    data = raw({PID: tensor()}, bytes(8))
    with pytest.raises(InvalidUploadError, match="only 5 bytes follow"):
        SafetensorsHeader.parse(data[:13])


def test_header_that_is_not_utf8() -> None:
    refused(raw(b'{"\xff\xfe": 1}'), match="not valid UTF-8")


@pytest.mark.parametrize("text", [b"", b"{", b"not json", b'{"a": 1} x', b"\x00" * 8])
def test_header_that_is_not_json(text: bytes) -> None:
    refused(raw(text), match="not valid JSON")


@pytest.mark.parametrize("text", [b"[]", b"1", b'"x"', b"null"])
def test_header_that_is_not_an_object(text: bytes) -> None:
    refused(raw(text), match="not an object")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_or_infinity_in_the_header(constant: str) -> None:
    text = f'{{"{PID}": {{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, "x": {constant}}}'
    refused(raw(text.encode(), bytes(8)), match=r"NaN|Infinity|beyond a float")


def test_duplicate_keys_in_the_header() -> None:
    one = json.dumps(tensor())
    refused(raw(f'{{"{PID}": {one}, "{PID}": {one}}}'.encode(), bytes(8)), match="twice")
    nested = (
        f'{{"{PID}": {{"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}}}'
    )
    refused(raw(nested.encode(), bytes(8)), match="'dtype' twice")


def test_duplicate_keys_or_nan_inside_gradvault_metadata() -> None:
    names = f'{{"{PID}": "a", "{PID}": "b"}}'
    refused(raw({"__metadata__": {NAMES_KEY: names}, PID: tensor()}, bytes(8)), match="twice")
    manifest = '{"metadata": {"x": NaN}}'
    refused(raw({"__metadata__": {MANIFEST_KEY: manifest}, PID: tensor()}, bytes(8)), match="NaN")


def test_deeply_nested_json() -> None:
    refused(raw(b"[" * 100_000 + b"]" * 100_000), match="nests JSON too deeply|not valid JSON")


@pytest.mark.parametrize("dtype", ["bf16", "U16", "F8_E4M3", "float32", "f32", 4, None])
def test_unknown_dtype(dtype: Any) -> None:
    refused(raw({PID: tensor(dtype=dtype)}, bytes(8)), match=r"dtype .*expected one of F16, F32")


@pytest.mark.parametrize("shape", ["2", [2.0], [-2], [True, 2], [[2]], None, {"0": 2}])
def test_shape_that_is_not_a_list_of_ints(shape: Any) -> None:
    info = {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}
    refused(raw({PID: info}, bytes(8)), match="shape .*expected a list of ints >= 0")


@pytest.mark.parametrize("offsets", [[0], [0, 8, 8], [-8, 0], [0.0, 8], [0, True], "0,8", None])
def test_data_offsets_that_are_not_two_ints(offsets: Any) -> None:
    info = {"dtype": "F32", "shape": [2], "data_offsets": offsets}
    refused(raw({PID: info}, bytes(8)), match=r"data_offsets .*expected \[begin, end\]")


@pytest.mark.parametrize("offsets", [(0, 4), (0, 12), (8, 0)])
def test_lying_offsets(offsets: tuple[int, int]) -> None:
    refused(raw({PID: tensor(offsets=offsets)}, bytes(16)), match="F32 x \\[2\\] needs 8 bytes")


def test_overlapping_tensors() -> None:
    header = {PID: tensor(offsets=(0, 8)), PID2: tensor(offsets=(4, 12))}
    error = refused(raw(header, bytes(12)), match="overlaps")
    assert PID in str(error) and PID2 in str(error)
    # an empty tensor inside another one overlaps it too, as the library says
    inside = {PID: tensor(offsets=(0, 8)), PID2: tensor(shape=(0,), offsets=(4, 4))}
    refused(raw(inside, bytes(8)), match="overlaps")


def test_a_gap_between_tensors_or_before_the_first() -> None:
    header = {PID: tensor(offsets=(0, 8)), PID2: tensor(offsets=(12, 20))}
    refused(raw(header, bytes(20)), match=r"bytes \[8, 12\) of the data belong to no tensor")
    refused(raw({PID: tensor(offsets=(4, 12))}, bytes(12)), match="at the start of the data")


def test_trailing_bytes_after_the_last_tensor() -> None:
    refused(raw({PID: tensor()}, bytes(9)), match="1 trailing bytes")
    refused(raw({}, b"x"), match="1 trailing bytes")


def test_body_shorter_than_the_last_offset() -> None:
    refused(raw({PID: tensor()}, bytes(7)), match="ends early: .* tensors end at byte")


@pytest.mark.parametrize("key", ["fc1.weight", PID.upper(), PID[:-1], "", "__meta__"])
def test_key_that_is_neither_a_param_id_nor_a_mapped_name(key: str) -> None:
    refused(raw({key: tensor()}, bytes(8)), match="neither a ParamId")


def test_param_ids_map_errors() -> None:
    bad_value = {"__metadata__": {PARAM_IDS_KEY: json.dumps({"w": "nope"})}, "w": tensor()}
    refused(raw(bad_value, bytes(8)), match="maps 'w' to 'nope'; expected a ParamId")
    same = {
        "__metadata__": {PARAM_IDS_KEY: json.dumps({"w": PID})},
        "w": tensor(),
        PID: tensor(offsets=(8, 16)),
    }
    refused(raw(same, bytes(16)), match="are both param")
    stray = {"__metadata__": {PARAM_IDS_KEY: json.dumps({"v": PID})}, PID2: tensor()}
    refused(raw(stray, bytes(8)), match="'v', which names no tensor")
    both = {
        "__metadata__": {PARAM_IDS_KEY: json.dumps({"w": PID}), NAMES_KEY: json.dumps({"w": "x"})},
        "w": tensor(),
    }
    refused(raw(both, bytes(8)), match="named both")


def test_names_map_errors() -> None:
    for names, match in [
        ("not json", "not valid JSON"),
        ("[]", "not an object"),
        (json.dumps({PID: 3}), "maps .* to 3"),
        (json.dumps({PID2: "x"}), "which names no tensor"),
        (f'{{"{PID}": "\\ud800"}}', "expected a string"),
    ]:
        refused(raw({"__metadata__": {NAMES_KEY: names}, PID: tensor()}, bytes(8)), match=match)


@pytest.mark.parametrize(
    "metadata", [[], "x", {"k": 1}, {"k": None}, {"k": ["v"]}, {"k": {"a": "b"}}]
)
def test_metadata_that_is_not_str_to_str(metadata: Any) -> None:
    refused(raw({"__metadata__": metadata, PID: tensor()}, bytes(8)), match="__metadata__")


def test_tensor_entries_with_missing_or_unknown_fields() -> None:
    missing = {PID: {"dtype": "F32", "shape": [2]}}
    refused(raw(missing, bytes(8)), match=r"missing \['data_offsets'\]")
    extra = {PID: {**tensor(), "offsets": [0, 8]}}
    refused(raw(extra, bytes(8)), match=r"unknown \['offsets'\]")
    refused(raw({PID: [1]}, bytes(8)), match="expected an object")


def test_manifest_metadata_that_is_not_an_object() -> None:
    manifest = json.dumps({"metadata": [1, 2]})
    refused(raw({"__metadata__": {MANIFEST_KEY: manifest}, PID: tensor()}, bytes(8)), match="list")
    refused(raw({"__metadata__": {MANIFEST_KEY: "[]"}}), match="not an object")
    huge = json.dumps({"metadata": {"n": 2**70}})
    refused(raw({"__metadata__": {MANIFEST_KEY: huge}}), match="beyond 64 bits")


@pytest.mark.parametrize("depth", [70, 300, 900])
def test_manifest_metadata_nested_too_deeply(depth: int) -> None:
    # deeper metadata than a manifest can be written with is refused up front, not at commit
    manifest = '{"metadata": {"a": ' + "[" * depth + "]" * depth + "}}"
    refused(raw({"__metadata__": {MANIFEST_KEY: manifest}}), match="levels deep; at most 64")


def test_error_messages_stay_short_for_huge_keys() -> None:
    error = refused(raw({"k" * 100_000: tensor()}, bytes(8)), match="neither a ParamId")
    assert len(str(error)) < 400


def test_the_library_refuses_what_we_refuse() -> None:
    # a sample of the kinds the reference reader also checks, so both agree on them
    for data in [
        raw({PID: tensor(offsets=(0, 4))}, bytes(8)),
        raw({PID: tensor(offsets=(0, 8)), PID2: tensor(offsets=(4, 12))}, bytes(12)),
        raw({PID: tensor()}, bytes(9)),
        raw({PID: tensor()}, bytes(7)),
        raw({PID: tensor(dtype="F33")}, bytes(8)),
    ]:
        with pytest.raises(Exception):  # noqa: B017 - the library raises its own error types
            load(data)
        with pytest.raises(InvalidUploadError):
            record_from_safetensors(data)


def test_error_tree_has_invalid_upload_error() -> None:
    assert issubclass(InvalidUploadError, gv.GradvaultError)
    assert issubclass(InvalidUploadError, ValueError)
    assert "InvalidUploadError" in (gv.errors.__doc__ or "")


def test_an_empty_file_on_disk_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    with pytest.raises(InvalidUploadError, match="8-byte header length"):
        record_from_safetensors(path)


# NumPy refuses these with a plain ValueError: over 64 dims, or an empty array whose other
# dims overflow a 64-bit byte count (each needs no data, so no byte count catches them)
TOO_MANY_DIMS = "dimensions; expected at most 64"
TOO_LARGE = "non-zero dimensions times its item size .* more than 9223372036854775807 bytes"
UNHOLDABLE_SHAPES = {
    "65-dims": ([1] * 65, "65 " + TOO_MANY_DIMS),
    "65-empty-dims": ([0] * 65, "65 " + TOO_MANY_DIMS),
    "1000-dims": ([1] * 1000, "1000 " + TOO_MANY_DIMS),
    "empty-by-2**62": ([0, 2**62], TOO_LARGE),
    "2**70-by-empty": ([2**70, 0], TOO_LARGE),
    "empty-by-2**63": ([0, 2**63], TOO_LARGE),
    "2**31-empty-2**31": ([2**31, 0, 2**31], TOO_LARGE),
}


@pytest.mark.parametrize("kind", sorted(UNHOLDABLE_SHAPES))
def test_a_shape_numpy_cannot_hold_is_refused_naming_the_tensor(kind: str) -> None:
    shape, match = UNHOLDABLE_SHAPES[kind]
    size = 4 * math.prod(shape)  # the bytes F32 x shape needs: 4 or none
    error = refused(raw({PID: tensor(shape=shape, offsets=(0, size))}, bytes(size)), match=match)
    assert f"tensor '{PID}' of dtype F32 has shape [{shape[0]}, " in str(error)
    assert len(str(error)) < 400


@pytest.mark.parametrize("kind", sorted(UNHOLDABLE_SHAPES))
def test_an_entry_from_bytes_refuses_a_shape_numpy_cannot_hold(kind: str) -> None:
    shape, match = UNHOLDABLE_SHAPES[kind]
    with pytest.raises(gv.ShapeMismatchError, match=match) as caught:
        GradientRecordEntry.from_bytes(
            PID, "fc.weight", "float32", shape, bytes(4 * math.prod(shape))
        )
    assert f"param {PID} ('fc.weight') has shape ({shape[0]}, " in str(caught.value)
    assert len(str(caught.value)) < 400


ITEM_SIZES = {"F16": 2, "F32": 4, "F64": 8, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "U8": 1}
ITEM_SIZES |= {"BOOL": 1, "BF16": 2}


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ([1] * 64, "F32"),
        ([0] * 64, "F64"),
        ([0, 2**62], "U8"),
        ([2**61, 0, 1], "I16"),
        ([0, 2**63 - 1], "U8"),
    ],
)
def test_a_shape_at_numpy_s_limits_is_taken(shape: list[int], dtype: str) -> None:
    size = math.prod(shape) * ITEM_SIZES[dtype]
    record = record_from_safetensors(raw({PID: tensor(dtype, shape, (0, size))}, bytes(size)))
    assert record[PID].shape == tuple(shape)


# --- property: whatever the header says, the reader answers or raises InvalidUploadError --


def _mostly(good: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` four times in five, ``odd`` otherwise."""
    return st.integers(0, 4).flatmap(lambda n: odd if n == 0 else good)


_DIMS = _mostly(
    st.one_of(st.integers(0, 3), st.sampled_from([0, 2**31, 2**62, 2**63 - 1, 2**63, 2**70])),
    st.sampled_from([-1, 2**64, 1.0, True, None]),
)
_SHAPES = _mostly(
    st.one_of(
        st.lists(_DIMS, max_size=4),
        st.lists(st.sampled_from([0, 1]), min_size=60, max_size=70),
    ),
    st.sampled_from([None, "2", [[2]], {"0": 2}]),
)
_OFFSETS = st.one_of(
    st.lists(st.one_of(st.integers(-2, 40), st.sampled_from([2**63, 2**64])), max_size=3),
    st.sampled_from([None, "0,8", [0.0, 8]]),
)
_CODES = _mostly(st.sampled_from(list(SAFETENSORS_DTYPES.values())), st.sampled_from(["F8", 4]))
_KEYS = _mostly(st.sampled_from([PID, PID2, "00000000000000a1"]), st.text(max_size=4))


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A header (its JSON bytes) of a few tensor entries and a body to go with it.

    Most entries are well-formed but for their shape and laid out end to end as the
    format wants, so that odd shapes get past the offsets check to the reader's later
    checks; some break another rule.
    """
    document: dict[str, Any] = {}
    position = 0
    for _ in range(draw(st.integers(0, 3))):
        code, shape = draw(_CODES), draw(_SHAPES)
        offsets: Any = draw(_OFFSETS)
        if draw(st.integers(0, 4)) and isinstance(shape, list) and isinstance(code, str):
            dims = [n for n in shape if type(n) is int]
            size = math.prod(dims) * ITEM_SIZES.get(code, 1)
            offsets = [position, position + min(abs(size), 64)]
        if isinstance(offsets, list) and len(offsets) == 2 and offsets[1] in range(65):
            position = max(position, offsets[1])
        info: dict[str, Any] = {"dtype": code, "shape": shape, "data_offsets": offsets}
        if draw(st.integers(0, 9)) == 0:
            info[draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))] = None
        document[draw(_KEYS)] = info
    if draw(st.integers(0, 4)) == 0:
        names = draw(st.dictionaries(_KEYS, st.one_of(st.text(max_size=3), st.none()), max_size=2))
        document["__metadata__"] = {NAMES_KEY: json.dumps(names)}
    text = json.dumps(document).encode()
    return text, bytes(draw(_mostly(st.just(position), st.integers(0, 64))))


@settings(max_examples=300, deadline=None)
@given(headers())
def test_any_header_is_read_or_refused_with_invalid_upload_error(
    header_and_data: tuple[bytes, bytes],
) -> None:
    text, data = header_and_data
    file = raw(text, data)
    try:
        header = SafetensorsHeader.parse(file, body_bytes=len(file))
    except InvalidUploadError as error:
        assert str(error).startswith("safetensors file: ") and len(str(error)) < 600
        with pytest.raises(InvalidUploadError):
            record_from_safetensors(file)
        return
    record = record_from_safetensors(file)
    assert [entry.shape for entry in record] == [tensor.shape for tensor in header.tensors]
