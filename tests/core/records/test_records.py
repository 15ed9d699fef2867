"""GradientsParamsRecord: capture, restore, validation and point-in-time semantics."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import (
    BackendMismatchError,
    DtypeMismatchError,
    DuplicateParamError,
    GradientRecordEntry,
    GradientsParams,
    GradientsParamsRecord,
    ParamId,
    ParamIdMismatchError,
    RecorderError,
    ShapeMismatchError,
    SizeMismatchError,
)
from gradvault.core.autodiff.tensor import wrap


def _model_and_grads(seed: int = 0) -> tuple[gv.MLP, GradientsParams]:
    gv.manual_seed(seed)
    model = gv.MLP(6, [8, 8], 3)
    x, y = gv.randn(10, 6), gv.tensor(np.arange(10) % 3)
    grads = GradientsParams.from_grads(gv.cross_entropy(model(x), y).backward(), model)
    return model, grads


def _snapshot_values(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


def test_try_to_record_leaves_the_container_exactly_as_it_was() -> None:
    _, grads = _model_and_grads()
    objects = {pid: grads.get(pid) for pid in grads}
    values = _snapshot_values(grads)
    record = grads.try_to_record()
    assert list(grads) == list(objects)
    assert all(grads.get(pid) is t for pid, t in objects.items())
    assert _snapshot_values(grads) == values
    assert {e.param_id for e in record} == set(objects)
    assert all(e.name for e in record)  # module paths travel with the record


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_round_trip_is_bit_identical(dtype: str) -> None:
    rng = np.random.default_rng(1)
    grads = GradientsParams()
    arrays = {
        ParamId(): rng.standard_normal((3, 5)).astype(dtype),
        ParamId(): np.asarray(rng.standard_normal(), dtype=dtype),  # 0-d
        ParamId(): np.zeros((0, 4), dtype=dtype),  # empty
        ParamId(): rng.standard_normal((6, 4)).astype(dtype).T,  # non-contiguous
        ParamId(): np.array([np.nan, np.inf, -np.inf, -0.0], dtype=dtype),
    }
    for pid, array in arrays.items():
        grads.register(pid, wrap(array))
    restored = GradientsParams.from_record(grads.try_to_record(), "cpu")
    for pid, array in arrays.items():
        got = restored.get(pid).numpy()
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.tobytes() == np.ascontiguousarray(array).tobytes()


def test_from_record_neither_sums_into_nor_clears_anything() -> None:
    model, grads = _model_and_grads()
    record = grads.try_to_record()
    existing = {p.id: p.grad.numpy().copy() for p in model.parameters()}
    restored = GradientsParams.from_record(record, "cpu")
    restored_again = GradientsParams.from_record(record, "cpu")
    for p in model.parameters():
        np.testing.assert_array_equal(p.grad.numpy(), existing[p.id])
    for pid in restored:
        assert restored.get(pid) is not restored_again.get(pid)
        assert restored.get(pid).numpy().tobytes() == record[pid].array.tobytes()
    assert len(record) == len(grads)


def test_restored_gradients_are_independent_of_the_record() -> None:
    _, grads = _model_and_grads()
    record = grads.try_to_record()
    restored = GradientsParams.from_record(record, "cpu")
    pid = next(iter(restored))
    before = record[pid].array.tobytes()
    restored.get(pid).add_(1.0)
    assert record[pid].array.tobytes() == before


def test_inconsistent_dtype_raises_naming_the_param() -> None:
    pid = ParamId()
    entry = GradientRecordEntry(pid, "fc.weight", "float32", (2,), np.zeros(2, np.float64))
    with pytest.raises(DtypeMismatchError, match=str(pid)) as info:
        GradientsParamsRecord([entry])
    assert "fc.weight" in str(info.value)


def test_inconsistent_shape_raises_naming_the_param() -> None:
    pid = ParamId()
    entry = GradientRecordEntry(pid, "fc.weight", "float32", (3, 2), np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeMismatchError, match="fc.weight"):
        GradientsParamsRecord([entry])


def test_inconsistent_byte_count_raises_naming_the_param() -> None:
    pid = ParamId()
    with pytest.raises(SizeMismatchError, match=str(pid)) as info:
        GradientRecordEntry.from_bytes(pid, "fc.bias", "float32", (4,), b"\0" * 15)
    assert "15 bytes" in str(info.value) and "16" in str(info.value)


def test_duplicate_id_raises() -> None:
    pid = ParamId()
    a = GradientRecordEntry.from_array(pid, "a", np.zeros(2, np.float32))
    b = GradientRecordEntry.from_array(pid, "b", np.zeros(2, np.float32))
    with pytest.raises(DuplicateParamError, match=str(pid)):
        GradientsParamsRecord([a, b])


def test_errors_share_the_recorder_root() -> None:
    for error in (
        DtypeMismatchError,
        ShapeMismatchError,
        SizeMismatchError,
        DuplicateParamError,
        BackendMismatchError,
        ParamIdMismatchError,
    ):
        assert issubclass(error, RecorderError)
        assert issubclass(error, gv.GradvaultError)


def test_wrong_backend_raises() -> None:
    _, grads = _model_and_grads()
    assert len(grads.try_to_record(backend="numpy")) == len(grads)
    assert len(grads.try_to_record(backend="cpu")) == len(grads)
    with pytest.raises(BackendMismatchError, match="cupy"):
        grads.try_to_record(backend="cupy")
    with pytest.raises(BackendMismatchError):
        asyncio.run(grads.to_record_async(backend="cuda:0"))


def test_record_is_a_point_in_time_across_backward_zero_grad_and_step() -> None:
    gv.manual_seed(3)
    model = gv.MLP(6, [8], 3)
    x, y = gv.randn(10, 6), gv.tensor(np.arange(10) % 3)
    gv.cross_entropy(model(x), y).backward()
    grads = GradientsParams.from_module_grad(model)
    record = grads.try_to_record()
    frozen = {e.param_id: e.array.tobytes() for e in record}
    gv.cross_entropy(model(x * 2), y).backward()  # accumulates into the same .grad tensors
    assert any(grads.get(pid).numpy().tobytes() != value for pid, value in frozen.items())
    gv.SGD(momentum=0.9).step(0.1, model, grads)
    model.zero_grad(set_to_none=False)
    assert all(not grads.get(pid).numpy().any() for pid in grads)
    assert {e.param_id: e.array.tobytes() for e in record} == frozen


def test_accumulator_snapshot_is_a_point_in_time() -> None:
    model, first = _model_and_grads()
    accumulator = gv.GradientsAccumulator()
    accumulator.accumulate(model, first)
    second = gv.cross_entropy(model(gv.randn(4, 6)), gv.tensor([0, 1, 2, 0])).backward()
    accumulator.accumulate(model, GradientsParams.from_grads(second, model))
    record = accumulator.current().try_to_record()
    frozen = {e.param_id: e.array.tobytes() for e in record}
    for _ in range(3):
        loss = gv.cross_entropy(model(gv.randn(4, 6)), gv.tensor([0, 1, 2, 0]))
        accumulator.accumulate(model, GradientsParams.from_grads(loss.backward(), model))
    assert {e.param_id: e.array.tobytes() for e in record} == frozen
    assert any(accumulator.current().get(pid).numpy().tobytes() != v for pid, v in frozen.items())


async def test_to_record_async_is_a_point_in_time_while_training_runs() -> None:
    gv.manual_seed(4)
    model = gv.MLP(6, [16], 3)
    x, y = gv.randn(32, 6), gv.tensor(np.arange(32) % 3)
    gv.cross_entropy(model(x), y).backward()
    grads = GradientsParams.from_module_grad(model)
    expected = {pid: grads.get(pid).numpy().tobytes() for pid in grads}
    optimizer = gv.SGD(momentum=0.9)
    steps = 0

    async def training() -> None:
        nonlocal steps
        for _ in range(20):
            gv.cross_entropy(model(x), y).backward()
            optimizer.step(0.05, model, grads)
            steps += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(training())
    record = await grads.to_record_async()
    await task
    assert steps == 20
    assert {e.param_id: e.array.tobytes() for e in record} == expected


def test_model_record_round_trip_restores_param_ids() -> None:
    model, grads = _model_and_grads(5)
    record = grads.try_to_record()
    fresh = gv.MLP(6, [8, 8], 3)
    assert {p.id for p in fresh.parameters()}.isdisjoint(set(grads))
    with pytest.raises(ParamIdMismatchError, match="load the model record first"):
        GradientsParams.from_record(record, "cpu", module=fresh)
    fresh.load_record(model.state_record())
    assert [p.id for p in fresh.parameters()] == [p.id for p in model.parameters()]
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    restored = GradientsParams.from_record(record, "cpu", module=fresh)
    assert set(restored) == {p.id for p in fresh.parameters()}


def test_restore_by_name_remaps_ids() -> None:
    model, grads = _model_and_grads(6)
    record = grads.try_to_record()
    other = gv.MLP(6, [8, 8], 3)
    restored = GradientsParams.from_record(record, "cpu", module=other, match="name")
    by_name = {name: p for name, p in other.named_parameters()}
    for entry in record:
        target = by_name[entry.name]
        assert restored.get(target.id).numpy().tobytes() == entry.array.tobytes()


def test_restore_by_name_checks_shapes() -> None:
    _, grads = _model_and_grads(7)
    record = grads.try_to_record()
    other = gv.MLP(6, [9, 8], 3)
    with pytest.raises(ShapeMismatchError, match="layers.0.weight"):
        GradientsParams.from_record(record, "cpu", module=other, match="name")


async def test_a_capture_is_the_point_in_time_that_records_are_made_from() -> None:
    _, grads = _model_and_grads()
    before = _snapshot_values(grads)
    capture = grads.capture()
    assert len(capture) == len(grads) and capture.device == "cpu"
    assert capture.nbytes == sum(len(values) for values in before.values())
    with gv.no_grad():
        for pid in grads:
            grads.get(pid).add_(1.0)  # training goes on after the capture
    for record in (capture.to_record(), await capture.to_record_async()):
        assert {entry.param_id: entry.array.tobytes() for entry in record} == before
        assert record.metadata == {"device": "cpu"}
    assert [pid for pid, _, _ in capture.entries] == list(grads)
    with pytest.raises(BackendMismatchError):
        grads.capture(backend="cupy")


def test_record_metadata_cannot_be_changed_through_the_record() -> None:
    source = {"lr": 0.1, "nested": {"steps": [1, 2]}}
    record = GradientsParamsRecord([], metadata=source)
    record.metadata["lr"] = 9.0
    record.metadata["nested"]["steps"].append(3)
    source["nested"]["steps"].append(4)  # nor through the mapping it was built from
    assert record.metadata == {"lr": 0.1, "nested": {"steps": [1, 2]}}
    with pytest.raises(AttributeError):
        record.metadata = {}  # type: ignore[misc]


def test_a_record_of_checked_entries_still_refuses_duplicate_ids() -> None:
    pid = ParamId()
    entry = GradientRecordEntry.from_array(pid, "w", np.zeros(2, np.float32))
    record = GradientsParamsRecord.from_checked_entries([entry], metadata={"a": 1})
    assert record == GradientsParamsRecord([entry]) and record.metadata == {"a": 1}
    with pytest.raises(DuplicateParamError, match=str(pid)):
        GradientsParamsRecord.from_checked_entries([entry, entry])
