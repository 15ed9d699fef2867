"""Resume in the middle of a gradient-accumulation window, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientRecordEntry, GradientsAccumulator, GradientsParams

STEPS, MICRO_BATCHES = 5, 8
STOP_STEP, STOP_MICRO = 2, 4  # after micro-batch 5 of step 3 (both counted from 1)


def _batch(step: int, micro: int) -> tuple[gv.Tensor, gv.Tensor]:
    rng = np.random.default_rng(1000 * step + micro)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    y = rng.integers(0, 4, 16)
    return gv.tensor(x), gv.tensor(y)


def _micro_batch(model: gv.MLP, accumulator: GradientsAccumulator, step: int, micro: int) -> None:
    x, y = _batch(step, micro)
    loss = gv.cross_entropy(model(x), y) / MICRO_BATCHES
    accumulator.accumulate(model, GradientsParams.from_grads(loss.backward(), model))


def _new_model(seed: int) -> gv.MLP:
    gv.manual_seed(seed)
    return gv.MLP(12, [32, 32], 4)


def _optimizer(kind: str) -> gv.Optimizer:
    return gv.SGD(momentum=0.9, weight_decay=1e-4) if kind == "sgd" else gv.Adam()


def _through_bytes(record: gv.GradientsParamsRecord) -> gv.GradientsParamsRecord:
    """What crossing a process boundary leaves of a record: bytes and metadata."""
    return gv.GradientsParamsRecord(
        [
            GradientRecordEntry.from_bytes(
                str(e.param_id), e.name, e.dtype, list(e.shape), bytes(e.data)
            )
            for e in record
        ]
    )


def _train(kind: str, interrupt: bool) -> list[bytes]:
    model = _new_model(0)
    optimizer = _optimizer(kind)
    start_step, start_micro, accumulator = 0, 0, GradientsAccumulator()
    if interrupt:
        for step in range(STOP_STEP + 1):
            accumulator = GradientsAccumulator()
            for micro in range(MICRO_BATCHES):
                _micro_batch(model, accumulator, step, micro)
                if step == STOP_STEP and micro == STOP_MICRO:
                    break
            else:
                optimizer.step(0.05, model, accumulator.grads())
                model.zero_grad()
        model_record = model.state_record()
        optimizer_record = optimizer.state_record()
        grads_record = _through_bytes(accumulator.current().try_to_record())
        del model, optimizer, accumulator  # the job is preempted
        model = _new_model(99)  # different values and ParamIds until the record is loaded
        model.load_record(model_record)
        optimizer = _optimizer(kind).load_record(optimizer_record, model)
        accumulator = GradientsAccumulator()
        accumulator.accumulate(
            model, GradientsParams.from_record(grads_record, "cpu", module=model)
        )
        start_step, start_micro = STOP_STEP, STOP_MICRO + 1
    for step in range(start_step, STEPS):
        if step != start_step or not interrupt:
            accumulator = GradientsAccumulator()
        for micro in range(start_micro if step == start_step else 0, MICRO_BATCHES):
            _micro_batch(model, accumulator, step, micro)
        optimizer.step(0.05, model, accumulator.grads())
        model.zero_grad()
    return [p.detach().numpy().tobytes() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_resume_mid_accumulation_is_bit_identical(kind: str) -> None:
    uninterrupted = _train(kind, interrupt=False)
    resumed = _train(kind, interrupt=True)
    assert resumed == uninterrupted
    # and training did move the parameters, so the comparison is not vacuous
    assert uninterrupted != [p.detach().numpy().tobytes() for p in _new_model(0).parameters()]


def test_losing_the_partial_window_is_not_bit_identical() -> None:
    """The control: resuming without the saved gradients gives different parameters."""
    uninterrupted = _train("sgd", interrupt=False)
    model = _new_model(0)
    optimizer = _optimizer("sgd")
    for step in range(STEPS):
        accumulator = GradientsAccumulator()
        for micro in range(MICRO_BATCHES):
            if step == STOP_STEP and micro <= STOP_MICRO:
                continue  # these micro-batches were lost with the preempted job
            _micro_batch(model, accumulator, step, micro)
        optimizer.step(0.05, model, accumulator.grads())
        model.zero_grad()
    assert [p.detach().numpy().tobytes() for p in model.parameters()] != uninterrupted
