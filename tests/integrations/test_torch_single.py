"""The torch integration in one process (no process group): a world of one rank."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

import torch  # noqa: E402 - after the skip

from gradvault.core import (  # noqa: E402
    DtypeMismatchError,
    GradientsParams,
    InvalidArgumentError,
    ParamIdMismatchError,
    Recorder,
    ShapeMismatchError,
)
from gradvault.integrations import torch as gv_torch  # noqa: E402
from tests.integrations.torch_loops import Net, micro_batch  # noqa: E402


def accumulated(seed: int = 0, dtype: torch.dtype = torch.float32) -> Net:
    torch.manual_seed(seed)
    model = Net().to(dtype)
    for _micro in range(2):  # half a window
        x, y = torch.randn(5, 6, dtype=dtype), torch.tensor([0, 1, 2, 0, 1])
        (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
    return model


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {
        name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_snapshot_and_restore_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    model = accumulated(dtype=dtype)
    expected = grads_of(model)
    info = gv_torch.snapshot(model, tmp_path / "store", run="one", step=3, tags={"k": "v"})
    assert (info.run, info.step, info.world_size, info.num_params) == ("one", 3, 1, 4)
    fresh = Net().to(dtype)
    gv_torch.restore(fresh, tmp_path / "store", info.id)
    for name, grad in grads_of(fresh).items():
        assert grad is not None and grad.dtype == dtype
        assert grad.view(torch.int16 if dtype != torch.float32 else torch.int32).equal(
            expected[name].view(torch.int16 if dtype != torch.float32 else torch.int32)
        ), name


def test_start_snapshot_captures_at_once(tmp_path: Path) -> None:
    model = accumulated()
    expected = grads_of(model)
    started = gv_torch.start_snapshot(model, str(tmp_path / "store"), run="r", step=0)
    micro_batch(model, 0, 2, 0)  # training goes on: the snapshot keeps what was captured
    info = started.result()
    assert started.result() is info and info.id == started.id
    fresh = Net()
    gv_torch.restore(fresh, tmp_path / "store", info.id)
    for name, grad in grads_of(fresh).items():
        assert torch.equal(grad, expected[name]), name


def test_parameters_without_a_gradient_come_back_without_one(tmp_path: Path) -> None:
    model = accumulated()
    model.out.bias.grad = None
    info = gv_torch.snapshot(model, tmp_path / "store", run="r", step=0)
    fresh = accumulated(seed=1)  # every .grad set, to other values
    gv_torch.restore(fresh, tmp_path / "store", info.id)
    assert fresh.out.bias.grad is None
    assert torch.equal(fresh.hidden.weight.grad, model.hidden.weight.grad)


def test_a_snapshot_written_whole_restores(tmp_path: Path) -> None:
    model = accumulated()
    with Recorder(tmp_path / "store") as recorder:
        info = recorder.sync.snapshot(GradientsParams.from_torch(model), run="r", step=0)
    fresh = Net()
    gv_torch.restore(fresh, tmp_path / "store", info.id)
    for name, grad in grads_of(fresh).items():
        assert torch.equal(grad, grads_of(model)[name]), name


def test_gradients_that_do_not_fit_change_nothing(tmp_path: Path) -> None:
    info = gv_torch.snapshot(accumulated(), tmp_path / "store", run="r", step=0)
    wider = accumulated(seed=2)
    wider.out = torch.nn.Linear(10, 4)
    before = grads_of(wider)
    with pytest.raises(ShapeMismatchError, match=r"'out.weight'.*\(3, 10\).*\(4, 10\)"):
        gv_torch.restore(wider, tmp_path / "store", info.id)
    doubled = accumulated(seed=2).double()
    with pytest.raises(DtypeMismatchError, match="float32; the parameter has torch.float64"):
        gv_torch.restore(doubled, tmp_path / "store", info.id)
    after = grads_of(wider)
    assert all(
        (before[name] is None and after[name] is None) or torch.equal(before[name], after[name])
        for name in before
    )


def test_gradients_of_another_model_are_refused(tmp_path: Path) -> None:
    info = gv_torch.snapshot(accumulated(), tmp_path / "store", run="r", step=0)
    other = torch.nn.Sequential(torch.nn.Linear(6, 10))
    with pytest.raises(ParamIdMismatchError, match="match no parameter.*'hidden.bias'"):
        gv_torch.restore(other, tmp_path / "store", info.id)
    assert all(param.grad is None for param in other.parameters())


def test_arguments_refused(tmp_path: Path) -> None:
    model = accumulated()
    with pytest.raises(InvalidArgumentError, match="timeout"):
        gv_torch.snapshot(model, tmp_path / "store", run="r", step=0, timeout=0)
    with pytest.raises(InvalidArgumentError, match="not initialized"):
        gv_torch.snapshot(model, tmp_path / "store", run="r", step=0, group=object())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        gv_torch.snapshot(object(), tmp_path / "store", run="r", step=0)


def test_the_exported_names() -> None:
    assert gv_torch.__all__ == [
        "DEFAULT_TIMEOUT_SECONDS",
        "DistributedSnapshotError",
        "SnapshotStarted",
        "UnsupportedSetupError",
        "restore",
        "snapshot",
        "start_snapshot",
    ]
