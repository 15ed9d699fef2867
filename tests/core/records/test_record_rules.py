"""The writer refuses, before anything is written, whatever the reader would refuse.

``record_rules`` holds one rule per field; the writer (``register``, record and entry
construction, ``write_snapshot``, the recorder) and the manifest validation use the same
ones. The property tests write through the public API to a local store and read back with
a fresh store object: a value is either refused up front or read back unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import gradvault.core as gv
from gradvault.core import (
    DtypeMismatchError,
    GradientRecordEntry,
    GradientsParams,
    GradientsParamsRecord,
    InvalidFieldError,
    ParamId,
    ShapeMismatchError,
    SizeMismatchError,
)
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.store import open_store

FIELD_ERRORS = (InvalidFieldError, DtypeMismatchError, ShapeMismatchError, SizeMismatchError)


# --- the cases of the report ------------------------------------------------------------


def test_a_name_that_is_not_a_string_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    pid = ParamId()
    grads = GradientsParams()
    with pytest.raises(InvalidFieldError) as caught:
        grads.register(pid, gv.tensor([1.0, 2.0]), name=7)  # type: ignore[arg-type]
    assert str(pid) in str(caught.value) and "7" in str(caught.value)
    assert "string" in str(caught.value)
    assert pid not in grads  # the container is unchanged
    entry = GradientRecordEntry(pid, 7, "float32", (2,), np.zeros(2, np.float32))  # type: ignore[arg-type]
    with gv.Recorder(tmp_path / "store") as recorder:
        with pytest.raises(InvalidFieldError, match=str(pid)):
            recorder.start_snapshot(GradientsParamsRecord([entry]), run="r", step=0)
    assert not (tmp_path / "store").exists()  # nothing was written, not even the folder


@pytest.mark.parametrize("name", [7, None, b"fc.weight", "fc\ud800"])
def test_entries_refuse_names_the_reader_refuses(name: Any) -> None:
    pid = ParamId()
    with pytest.raises(InvalidFieldError, match=str(pid)):
        GradientRecordEntry.from_array(pid, name, np.zeros(2, np.float32))
    with pytest.raises(InvalidFieldError, match=str(pid)):
        GradientRecordEntry.from_bytes(pid, name, "float32", (2,), bytes(8))
    if name is not None:
        with pytest.raises(InvalidFieldError, match=str(pid)):
            GradientsParams().register(pid, gv.zeros(2), name=name)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "complex64"])
def test_register_refuses_a_dtype_no_snapshot_holds(dtype: str) -> None:
    pid = ParamId()
    with pytest.raises(DtypeMismatchError, match=str(pid)) as caught:
        GradientsParams().register(pid, wrap(np.zeros(2, dtype)), name="w")
    assert dtype in str(caught.value) and "float32" in str(caught.value)


def test_a_huge_shape_is_a_size_error_with_the_real_byte_count() -> None:
    pid = ParamId()
    with pytest.raises(SizeMismatchError) as caught:
        GradientRecordEntry.from_bytes(pid, "w", "float32", (2**32, 2**32), bytes(8))
    message = str(caught.value)
    assert str(4 * 2**64) in message and "8 bytes" in message and "-" not in message.split(";")[1]


@pytest.mark.parametrize("shape", [(2.7,), (2.0,), (True, 2), ("2",), (-1,), 3, None])
def test_from_bytes_refuses_dims_that_are_not_ints(shape: Any) -> None:
    pid = ParamId()
    with pytest.raises(ShapeMismatchError, match=str(pid)):
        GradientRecordEntry.from_bytes(pid, "w", "float32", shape, bytes(8))


def test_from_bytes_takes_numpy_ints_as_plain_ints() -> None:
    entry = GradientRecordEntry.from_bytes(
        ParamId(), "w", "float32", (np.int64(2), np.uint8(1)), bytes(8)
    )
    assert entry.shape == (2, 1) and all(type(n) is int for n in entry.shape)


@pytest.mark.parametrize("shape, error", [((2.0,), ShapeMismatchError), ([2], ShapeMismatchError)])
def test_a_record_refuses_an_entry_built_with_a_bad_shape(shape: Any, error: type) -> None:
    entry = GradientRecordEntry(ParamId(), "w", "float32", shape, np.zeros(2, np.float32))
    with pytest.raises(error):
        GradientsParamsRecord([entry])


def test_a_record_refuses_an_entry_whose_id_is_not_a_param_id() -> None:
    entry = GradientRecordEntry("0123456789abcdef", "w", "float32", (2,), np.zeros(2, np.float32))  # type: ignore[arg-type]
    with pytest.raises(InvalidFieldError, match="ParamId"):
        GradientsParamsRecord([entry])


@pytest.mark.parametrize(
    "metadata, named",
    [
        ({"lr": float("nan")}, "['lr']"),
        ({"a": [1, float("inf")]}, "['a'][1]"),
        ({"big": 2**64}, "['big']"),
        ({1: "x"}, "key 1"),
        ({"o": object()}, "['o']"),
        ({"s": "\udc80"}, "['s']"),
        ([("a", 1)], "list"),
    ],
)
def test_a_record_refuses_metadata_that_is_not_json(metadata: Any, named: str) -> None:
    with pytest.raises(InvalidFieldError, match="metadata") as caught:
        GradientsParamsRecord([], metadata=metadata)
    assert named in str(caught.value)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_metadata_nested_too_deep_is_refused_and_the_deepest_allowed_is_written(
    tmp_path: Path,
) -> None:
    with pytest.raises(InvalidFieldError, match="nests more than 64 levels"):
        GradientsParamsRecord([], metadata={"deep": _nested(300)})
    record = GradientsParamsRecord([], metadata={"deep": _nested(63)})

    async def round_trip() -> Any:
        store = open_store(tmp_path / "store")
        try:
            info = await store.write_snapshot(record, run="r", step=0)
            return (await store.read_snapshot(info.id)).metadata["deep"]
        finally:
            await store.close()

    assert asyncio.run(round_trip()) == _nested(63)


@pytest.mark.parametrize(
    "arguments, field",
    [
        ({"run": "r", "step": 2**63}, "step"),
        ({"run": "r", "step": 1.0}, "step"),
        ({"run": "r\ud800", "step": 0}, "run"),
        ({"run": "r", "step": 0, "tags": {"a": 1}}, "tags"),
        ({"run": "r", "step": 0, "tags": {"a": "\ud800"}}, "tags"),
    ],
)
def test_the_recorder_refuses_snapshot_fields_before_capture(
    tmp_path: Path, arguments: dict, field: str
) -> None:
    grads = GradientsParams()
    grads.register(ParamId(), gv.zeros(2), name="w")
    with gv.Recorder(tmp_path / "store") as recorder:
        with pytest.raises(InvalidFieldError, match=field):
            recorder.start_snapshot(grads, **arguments)
    assert not (tmp_path / "store").exists()  # nothing was written, not even the folder


def test_from_record_with_a_module_refuses_another_dtype() -> None:
    model = gv.Linear(3, 2)
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(p.id, name, np.zeros(p.shape, np.float64))
            for name, p in model.named_parameters()
        ]
    )
    with pytest.raises(DtypeMismatchError) as caught:
        GradientsParams.from_record(record, module=model)
    message = str(caught.value)
    assert str(model.weight.id) in message and "'weight'" in message
    assert "float64" in message and "float32" in message
    with pytest.raises(DtypeMismatchError):
        GradientsParams.from_record(record, module=model, match="name")


def test_empty_names_and_control_characters_round_trip(tmp_path: Path) -> None:
    grads = GradientsParams()
    names = ["", "\x00\x1f\n", "\u202eright-to-left", "ünï/çødé.weight", "😀"]
    for name in names:
        grads.register(ParamId(), gv.ones(3), name=name)
    with gv.Recorder(tmp_path / "store") as recorder:
        info = recorder.sync.snapshot(grads, run="r", step=0)
    with gv.Recorder(tmp_path / "store") as fresh:
        restored = fresh.sync.restore(info.id, "cpu")
    assert [restored.name(pid) for pid in restored] == names


# --- every value the writer accepts, the reader accepts ---------------------------------

TEXT = st.text(max_size=8)  # hypothesis leaves out lone surrogates: all of it is writable
SURROGATE = st.builds(str.__add__, st.text(max_size=3), st.characters(categories=["Cs"]))
ANY_TEXT = st.one_of(TEXT, SURROGATE)
NOT_TEXT = st.one_of(st.integers(), st.binary(max_size=3), st.floats())


@st.composite
def mostly(draw: st.DrawFn, valid: st.SearchStrategy, other: st.SearchStrategy) -> Any:
    """From ``valid`` about three times in four, so that acceptance is exercised as much."""
    return draw(other) if draw(st.integers(0, 3)) == 3 else draw(valid)


def json_like(leaves: st.SearchStrategy, keys: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.tuples(children, children),
            st.dictionaries(keys, children, max_size=3),
        ),
        max_leaves=6,
    )


JSON_VALUES = json_like(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        TEXT,
    ),
    TEXT,
)
NOT_QUITE_JSON = json_like(
    st.one_of(
        st.integers(-(2**65), 2**65), st.floats(), ANY_TEXT, st.just(float("nan")), st.binary()
    ),
    st.one_of(ANY_TEXT, st.integers(0, 3)),
)
SUPPORTED = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
UNSUPPORTED = ["uint16", "uint64", "complex64"]
DTYPES = mostly(st.sampled_from(SUPPORTED), st.sampled_from(UNSUPPORTED))
DIMS = mostly(
    st.one_of(st.integers(0, 4), st.integers(0, 4).map(np.int32)),
    st.one_of(st.integers(-2, -1), st.floats(0, 4), st.booleans()),
)


def _write_then_read(
    root: Path,
    *,
    name: Any = "w",
    dtype: str = "float32",
    shape: Any = (2, 3),
    as_bytes: bool = False,
    metadata: Any = None,
    run: Any = "r",
    step: Any = 0,
    tags: Any = None,
) -> tuple[GradientsParamsRecord, GradientsParamsRecord, dict] | None:
    """Write one snapshot as a user would; what a fresh reader finds, or None if refused.

    A refusal must be one of the field errors, and must leave the store empty.
    """

    async def write() -> GradientsParamsRecord:
        pid = ParamId()
        if as_bytes:
            size = math.prod(int(n) for n in shape if isinstance(n, int | np.integer) and n >= 0)
            entry = GradientRecordEntry.from_bytes(
                pid, name, dtype, shape, bytes(size * np.dtype(dtype).itemsize)
            )
            record = GradientsParamsRecord([entry], metadata=metadata)
        else:
            grads = GradientsParams()
            grads.register(pid, wrap(np.ones(shape, dtype)), name=name)
            record = GradientsParamsRecord(grads.try_to_record().entries, metadata=metadata)
        store = open_store(root, chunk_bytes=64, pack_threshold=32)
        try:
            await store.write_snapshot(record, run=run, step=step, tags=tags)
        finally:
            await store.close()
        return record

    async def read() -> tuple[list, GradientsParamsRecord | None, dict | None]:
        store = open_store(root)
        try:
            listed = await store.list()
            if not listed:
                return listed, None, None
            return listed, await store.read_snapshot(listed[0].id), await store.info(listed[0].id)
        finally:
            await store.close()

    try:
        written = asyncio.run(write())
    except FIELD_ERRORS:
        event("refused by the writer")
        listed, _, _ = asyncio.run(read())
        assert listed == []
        return None
    event("written and read back")
    listed, found, manifest = asyncio.run(read())
    assert len(listed) == 1 and found is not None and manifest is not None
    return written, found, manifest


def _assert_read_back(result: tuple, **written: Any) -> None:
    record, found, manifest = result
    assert found == record  # ids, names, dtypes, shapes and bytes
    user_metadata = {k: v for k, v in found.metadata.items() if k != "snapshot"}
    expected = orjson.loads(orjson.dumps(record.metadata))  # tuples come back as lists
    assert user_metadata == {k: v for k, v in expected.items() if k != "snapshot"}
    for field, value in written.items():
        assert manifest[field] == ({} if field == "tags" and value is None else value)


def _is_text(value: Any) -> bool:
    """Written here apart from the rules: a str holding no lone surrogate."""
    return isinstance(value, str) and not any("\ud800" <= c <= "\udfff" for c in value)


def _is_json(value: Any) -> bool:
    """Both encoders the store uses take it, and neither changes a value on the way."""
    try:
        orjson.dumps(value)  # refuses non-str keys, lone surrogates and ints past 64 bits
        json.dumps(value, allow_nan=False)  # refuses nan and inf (orjson writes them as null)
    except (TypeError, ValueError):
        return False
    return True


SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(name=mostly(st.one_of(TEXT, st.none()), st.one_of(SURROGATE, NOT_TEXT)), dtype=DTYPES)
def test_any_name_and_dtype_the_writer_takes_reads_back(tmp_path_factory, name, dtype) -> None:
    result = _write_then_read(tmp_path_factory.mktemp("w"), name=name, dtype=dtype)
    if result is not None:
        _assert_read_back(result)
    assert (result is not None) == ((name is None or _is_text(name)) and dtype not in UNSUPPORTED)


@SETTINGS
@given(shape=st.one_of(st.lists(DIMS, max_size=3), st.tuples(DIMS, DIMS)), dtype=DTYPES)
def test_any_shape_from_bytes_the_writer_takes_reads_back(tmp_path_factory, shape, dtype) -> None:
    result = _write_then_read(tmp_path_factory.mktemp("w"), shape=shape, dtype=dtype, as_bytes=True)
    if result is not None:
        _assert_read_back(result)
    dims_ok = all((type(n) is int or isinstance(n, np.integer)) and n >= 0 for n in shape)
    assert (result is not None) == (dims_ok and dtype not in UNSUPPORTED)


@SETTINGS
@given(
    metadata=mostly(
        st.one_of(st.none(), st.dictionaries(TEXT, JSON_VALUES, max_size=3)),
        st.one_of(
            st.dictionaries(st.one_of(TEXT, st.integers(0, 3)), NOT_QUITE_JSON, max_size=3),
            st.lists(JSON_VALUES, max_size=2),
        ),
    )
)
def test_any_metadata_the_writer_takes_reads_back(tmp_path_factory, metadata) -> None:
    result = _write_then_read(tmp_path_factory.mktemp("w"), metadata=metadata)
    if result is not None:
        _assert_read_back(result)
    expected = metadata is None or (isinstance(metadata, dict) and _is_json(metadata))
    assert (result is not None) == expected


@SETTINGS
@given(
    run=mostly(TEXT.filter(bool), st.one_of(st.just(""), SURROGATE, NOT_TEXT, st.none())),
    step=mostly(
        st.one_of(st.integers(0, 10**6), st.just(2**63 - 1)),
        st.one_of(
            st.integers(-3, -1), st.integers(2**63, 2**64 + 2), st.booleans(), st.floats(0, 9)
        ),
    ),
    tags=mostly(
        st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=3)),
        st.dictionaries(
            st.one_of(ANY_TEXT, st.integers()), st.one_of(ANY_TEXT, st.integers()), min_size=1
        ),
    ),
)
def test_any_run_step_and_tags_the_writer_takes_read_back(
    tmp_path_factory, run, step, tags
) -> None:
    result = _write_then_read(tmp_path_factory.mktemp("w"), run=run, step=step, tags=tags)
    if result is not None:
        _assert_read_back(result, run=run, step=step, tags=tags)
    expected = (
        _is_text(run)
        and run != ""
        and type(step) is int
        and 0 <= step < 2**63
        and (tags is None or all(_is_text(k) and _is_text(v) for k, v in tags.items()))
    )
    assert (result is not None) == expected
