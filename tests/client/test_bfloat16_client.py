"""bf16 snapshots through both clients, bit for bit: push, fetch, restore, download."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.autodiff.torch_adapter import param_id_of
from gradvault.core.records.safetensors_file import record_from_safetensors
from tests.core.bf16_values import same_bits, special_values

from .conftest import ClientUnderTest

OWN = ParamId(0xBF10)  # 3 x 1500 bf16: stored in an array of its own
PACKED = ParamId(0xBF11)  # 16 bf16: packed
FLOAT = ParamId(0xBF12)  # a float32 gradient beside them


def _record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(OWN, "w", special_values((3, 1500), seed=3)),
            GradientRecordEntry.from_array(PACKED, "b", special_values((16,), seed=4)),
            GradientRecordEntry.from_array(FLOAT, "f", np.linspace(-1, 1, 6, dtype=np.float32)),
        ]
    )


def _assert_same(got: GradientsParamsRecord, sent: GradientsParamsRecord) -> None:
    for a, b in zip(got, sent, strict=True):
        assert (a.param_id, a.name, a.dtype, a.shape) == (b.param_id, b.name, b.dtype, b.shape)
        assert bytes(a.data) == bytes(b.data), a.name
        if b.dtype == "bfloat16":
            assert same_bits(np.asarray(a.array), b.array), a.name


async def test_push_fetch_and_restore_bf16_are_bit_exact(api: ClientUnderTest) -> None:
    record = _record()
    summary = await api.call("push", record, run="bf16", step=1)
    info = await api.call("info", summary.id)
    assert [g["dtype"] for g in info["gradients"]] == ["bfloat16", "bfloat16", "float32"]

    _assert_same(await api.call("fetch", summary.id), record)

    grads = await api.call("restore", summary.id, "cpu")
    assert grads.get(OWN).dtype == gv.bfloat16
    assert same_bits(grads.get(OWN).numpy(), next(iter(record)).array)
    _assert_same(grads.try_to_record(), record)


async def test_download_bf16_to_safetensors_and_npz_is_bit_exact(
    api: ClientUnderTest, tmp_path: Path
) -> None:
    record = _record()
    summary = await api.call("push", record, run="bf16", step=2)

    path = await api.call("download", summary.id, tmp_path / "g.safetensors")
    _assert_same(record_from_safetensors(path), record)

    npz = await api.call("download", summary.id, tmp_path / "g.npz")
    with np.load(npz) as arrays:  # no pickle, no ml_dtypes needed to load it
        for entry in record:
            saved = arrays[str(entry.param_id)]
            if entry.dtype == "bfloat16":
                assert saved.dtype == np.dtype("<u2") and saved.shape == entry.shape
                assert same_bits(saved.view(ml_dtypes.bfloat16), entry.array)
            else:
                np.testing.assert_array_equal(saved, entry.array)


async def test_bf16_restores_onto_a_torch_module_bit_exact(api: ClientUnderTest) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Linear(1500, 3, dtype=torch.bfloat16)
    names = {"weight": special_values((3, 1500), seed=6), "bias": special_values((3,), seed=7)}
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(param_id_of(name), name, values)
            for name, values in names.items()
        ]
    )
    summary = await api.call("push", record, run="bf16", step=3)
    grads = await api.call("restore", summary.id, "cpu", module=module)
    for name, values in names.items():
        grad = getattr(module, name).grad
        assert grad.dtype == torch.bfloat16
        assert same_bits(grad.view(torch.int16).numpy().view(gv.bfloat16), values), name
        pid = param_id_of(name)
        assert grad.data_ptr() == grads.get(pid).numpy().ctypes.data  # shared, not copied
