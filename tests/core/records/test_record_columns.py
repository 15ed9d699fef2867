"""Records held by column: entries (and a capture's read-only views) built when read.

A capture's record holds the lent buffers, a restore's the packed gradients as slices of
one array; neither builds a ``GradientRecordEntry`` until one is asked for. These tests
hold such records against records built entry by entry from the same values.
"""

from __future__ import annotations

import asyncio

import ml_dtypes
import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import (
    DuplicateParamError,
    GradientRecordEntry,
    GradientsParams,
    GradientsParamsRecord,
    ParamId,
)
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.records.record import LazyArrays


def _bf16_bits(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint16).view(ml_dtypes.bfloat16)


def _arrays() -> list[np.ndarray]:
    """Gradients of every kind a capture meets: dtypes, shapes, layouts, sizes."""
    rng = np.random.default_rng(3)
    return [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal(5).astype(np.float16),
        np.arange(6, dtype=np.int64).reshape(2, 3).T,  # not C-contiguous
        # NaN payloads, -0.0, a subnormal, infinities: bit for bit
        _bf16_bits([0x7FC1, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x3F80]),
        np.array(2.5, dtype=np.float64),  # 0-d
        np.zeros((0, 3), dtype=np.float32),  # empty
        np.array([True, False, True]),
        rng.standard_normal(5000).astype(np.float32),
        rng.integers(-5, 5, 9).astype(np.int8),
    ]


def _grads(arrays: list[np.ndarray]) -> GradientsParams:
    grads = GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(ParamId(), wrap(array.copy(order="K")), name=f"layer{i}.weight")
    return grads


def _eager(grads: GradientsParams) -> GradientsParamsRecord:
    """The record built entry by entry, each gradient copied: what a capture must equal."""
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(pid, grads.name(pid), grads.get(pid).numpy().copy())
            for pid in grads
        ],
        metadata={"device": "cpu"},
    )


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("mixed", [False, True], ids=["one dtype", "every kind"])
def test_a_capture_record_equals_the_record_built_entry_by_entry(mixed: bool) -> None:
    arrays = _arrays() if mixed else [np.arange(k, dtype=np.float32) for k in range(1, 40)]
    grads = _grads(arrays)
    expected = _eager(grads)
    record = grads.try_to_record()
    assert record == expected
    assert len(record) == len(arrays)
    assert record.nbytes == expected.nbytes == sum(a.nbytes for a in arrays)
    assert repr(record) == repr(expected)
    for entry, want, array in zip(record, expected, arrays, strict=True):
        assert (entry.param_id, entry.name, entry.dtype, entry.shape) == (
            want.param_id,
            want.name,
            want.dtype,
            want.shape,
        )
        assert type(entry.shape) is tuple and entry.shape == array.shape
        assert entry.array.dtype == array.dtype
        assert _bits(entry.array) == _bits(array)
        assert entry.array.flags.c_contiguous and not entry.array.flags.writeable
        with pytest.raises(ValueError):
            entry.array[...] = 0
        entry.validate()
        assert record[entry.param_id] is entry and entry.param_id in record
        assert bytes(entry.data) == _bits(array)


def test_columns_are_the_entries_fields_without_building_entries() -> None:
    grads = _grads(_arrays())
    record = grads.try_to_record()
    columns = record.columns()
    assert list(columns.param_ids) == list(grads)
    assert list(columns.names) == [grads.name(pid) for pid in grads]
    entries = record.entries
    assert list(columns.dtypes) == [e.dtype for e in entries]
    assert [_bits(a) for a in columns.arrays] == [_bits(e.array) for e in entries]
    assert all(a is e.array for a, e in zip(record.columns().arrays, entries, strict=True))
    eager = _eager(grads)
    assert eager.columns().param_ids == columns.param_ids
    assert [_bits(a) for a in eager.columns().arrays] == [_bits(a) for a in columns.arrays]


def test_a_capture_record_shares_the_gradients_buffers_read_only() -> None:
    arrays = [np.arange(6, dtype=np.float32) + i for i in range(4)]
    grads = GradientsParams()
    for array in arrays:
        grads.register(ParamId(), wrap(array))
    record = grads.try_to_record()
    assert all(np.shares_memory(e.array, a) for e, a in zip(record, arrays, strict=True))
    assert all(a.flags.writeable for a in arrays)  # the gradients' own stay writable


def test_nothing_done_after_the_capture_changes_a_record_held_by_column() -> None:
    arrays = _arrays()
    grads = _grads(arrays)
    early_alias = np.asarray(grads.get(next(iter(grads))))  # an alias taken before
    record = grads.try_to_record()
    capture = grads.capture()
    early_alias += 100
    for pid in grads:
        tensor = grads.get(pid)
        if tensor.dtype.kind == "f" and tensor.dtype != gv.bfloat16:
            tensor.add_(1.0)
            np.asarray(tensor)[...] = 7  # an alias taken after
        tensor.data = wrap(np.zeros_like(tensor.numpy()))
    from_capture = capture.to_record()
    for got in (record, from_capture):
        assert [_bits(e.array) for e in got] == [_bits(a) for a in arrays]


def test_a_capture_keeps_its_entries_on_request() -> None:
    arrays = _arrays()
    grads = _grads(arrays)
    capture = grads.capture()
    assert len(capture) == len(arrays)
    assert capture.nbytes == sum(a.nbytes for a in arrays)
    assert capture.device == "cpu"
    assert [pid for pid, _, _ in capture.entries] == list(grads)
    assert [name for _, name, _ in capture.entries] == [grads.name(pid) for pid in grads]
    assert [_bits(a) for _, _, a in capture.entries] == [_bits(a) for a in arrays]
    assert asyncio.run(capture.to_record_async()) == capture.to_record()


def test_an_empty_capture_is_an_empty_record() -> None:
    record = GradientsParams().try_to_record()
    assert len(record) == 0 and record.nbytes == 0 and list(record) == []
    assert record == GradientsParamsRecord(metadata={"device": "cpu"})


def test_from_columns_refuses_duplicate_ids_and_columns_of_other_lengths() -> None:
    pid = ParamId()
    array = np.zeros(2, dtype=np.float32)
    array.setflags(write=False)
    with pytest.raises(DuplicateParamError, match=f"param {pid} \\('b'\\) appears twice"):
        GradientsParamsRecord.from_columns([pid, pid], ["a", "b"], ["float32"] * 2, [array, array])
    with pytest.raises(TypeError, match="2 ids, 1 names"):
        GradientsParamsRecord.from_columns([pid, ParamId()], ["a"], ["float32"], [array])
    with pytest.raises(TypeError, match="1 arrays"):
        GradientsParamsRecord.from_columns([pid, ParamId()], ["a", "b"], ["float32"] * 2, [array])

    class Counted(LazyArrays):
        builds = 0

        def __len__(self) -> int:
            return 1

        def build(self) -> list[np.ndarray]:
            Counted.builds += 1
            return [array]

        @property
        def nbytes(self) -> int:
            return 8

        def shapes(self, count: int) -> list[tuple[int, ...]]:
            return [(2,)][:count]

    built = GradientsParamsRecord.from_columns([pid], ["a"], ["float32"], Counted())
    assert len(built) == 1 and built.nbytes == 8 and "float32[2]" in repr(built)
    assert Counted.builds == 0  # nothing built for the length, the size or the repr
    assert built == GradientsParamsRecord([GradientRecordEntry.from_array(pid, "a", array)])
    assert built[pid].array is array and list(built)[0] is built[pid]
    assert Counted.builds == 1  # once, however it is read


def test_from_record_of_a_column_record_gives_the_same_gradients(tmp_path) -> None:
    arrays = _arrays()
    grads = _grads(arrays)
    record = grads.try_to_record()
    # copy=False (a record read for the call alone, as restore reads) is below
    for restored in (GradientsParams.from_record(record), GradientsParams.from_record(record)):
        assert list(restored) == list(grads)
        for pid, array in zip(restored, arrays, strict=True):
            tensor = restored.get(pid)
            assert restored.name(pid) == grads.name(pid)
            assert tensor.shape == array.shape and tensor.dtype == array.dtype
            assert _bits(tensor.numpy()) == _bits(array)
            tensor.numpy()[...] = 0  # the tensors' buffers are their own
    assert [_bits(e.array) for e in record] == [_bits(a) for a in arrays]

    with gv.Recorder(tmp_path / "store") as recorder:
        info = recorder.start_snapshot(grads, run="r", step=1).result()
        fetched = recorder.sync.fetch(info.id)
        assert fetched == record  # metadata aside, every field and bit
        restored = recorder.sync.restore(info.id)
        assert [_bits(restored.get(pid).numpy()) for pid in restored] == [_bits(a) for a in arrays]
        first = next(iter(restored))
        restored.get(first).add_(1.0)  # one restored gradient's write stays its own
        again = recorder.sync.restore(info.id)
        assert [_bits(again.get(pid).numpy()) for pid in again] == [_bits(a) for a in arrays]
        assert all(not e.array.flags.writeable for e in recorder.sync.fetch(info.id))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8])
def test_a_restore_of_one_dtype_gives_every_shape_back(tmp_path, dtype) -> None:
    # one dtype: the packed gradients are sliced from one array (1-d ones not reshaped)
    shapes = [(7,), (2, 3), (), (0,), (0, 4), (1,), (3, 1, 2), (5,)]
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(shape).astype(np.float32).astype(dtype) for shape in shapes]
    grads = _grads(arrays)
    with gv.Recorder(tmp_path / "store") as recorder:
        info = recorder.start_snapshot(grads, run="r", step=0).result()
        fetched = recorder.sync.fetch(info.id)
        assert fetched == grads.try_to_record()
        assert [e.shape for e in fetched] == shapes
        assert all(not e.array.flags.writeable for e in fetched)
        restored = recorder.sync.restore(info.id)
        for pid, array in zip(restored, arrays, strict=True):
            tensor = restored.get(pid)
            assert tensor.shape == array.shape and tensor.dtype == array.dtype
            assert _bits(tensor.numpy()) == _bits(array)
        one = recorder.store  # one gradient alone: the same bytes and shape
        entry = asyncio.run(_read_gradient(one, info.id, next(iter(grads))))
        assert entry.shape == shapes[0] and _bits(entry.array) == _bits(arrays[0])


async def _read_gradient(store, snapshot_id: str, pid: ParamId) -> GradientRecordEntry:
    from gradvault.core.store import open_store

    async with open_store(store.location) as fresh:
        return await fresh.read_gradient(snapshot_id, pid)
