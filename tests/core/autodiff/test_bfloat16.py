"""bfloat16 tensors: factories, casts, promotion as PyTorch's, float32 compute, records."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gradvault.core as gv
from gradvault.client.cli.demo_task import Task
from gradvault.core import backend
from gradvault.core.autodiff.autograd import gradcheck
from gradvault.core.errors import (
    DtypeMismatchError,
    GradvaultError,
    InplaceModificationError,
)
from gradvault.core.records.safetensors_file import record_from_safetensors, safetensors_chunks

from ..bf16_values import special_values

BF16 = gv.bfloat16


def test_the_dtype_is_ml_dtypes_bfloat16_and_every_spelling_names_it() -> None:
    assert BF16 == np.dtype(ml_dtypes.bfloat16)
    for spelling in (BF16, "bfloat16", ml_dtypes.bfloat16):
        assert gv.zeros(2, dtype=spelling).dtype == BF16
    assert repr(gv.ones(2, dtype=BF16)) == "tensor([1, 1], dtype=bfloat16)"


def test_factories_make_bf16_leaves_that_can_require_grad() -> None:
    for made in (
        gv.zeros(2, 3, dtype=BF16),
        gv.ones(2, 3, dtype=BF16),
        gv.full((2, 3), 1.5, dtype=BF16),
        gv.randn(2, 3, dtype=BF16),
        gv.rand(2, 3, dtype=BF16),
        gv.arange(0, 6, dtype=BF16).reshape(2, 3),
        gv.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=BF16),
        gv.tensor(np.ones((2, 3), dtype=BF16)),  # a bf16 array keeps its dtype
        gv.zeros_like(gv.ones(2, 3), dtype=BF16),
    ):
        assert made.dtype == BF16 and made.shape == (2, 3)
    leaf = gv.randn(3, dtype=BF16, requires_grad=True)
    assert leaf.requires_grad and leaf.is_leaf


def test_to_and_back_rounds_to_nearest_even_as_pytorch_does() -> None:
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.4e38, -1e-45], np.float32)
    cast = gv.tensor(values).to(BF16)
    assert cast.dtype == BF16
    # ties to even: 1 + 2**-8 -> 1.0; 1 + 3 * 2**-8 -> 1 + 2**-6; above the tie rounds up;
    # past the largest finite bf16 -> inf; a float32 subnormal below bf16's -> -0.0
    assert cast.numpy().view(np.uint16).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x8000]
    assert gv.tensor(values).bfloat16().dtype == BF16
    assert cast.float().dtype == gv.float32
    exact = special_values()
    back = gv.tensor(exact).float().to(BF16).numpy()
    finite = np.isfinite(exact.astype(np.float32))
    assert np.array_equal(back.view(np.uint16)[finite], exact.view(np.uint16)[finite])


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        (gv.float16, gv.float32),  # neither holds the other
        (gv.float32, gv.float32),
        (gv.float64, gv.float64),
        (gv.int64, BF16),
        (np.dtype("uint8"), BF16),
        (gv.bool_, BF16),
    ],
)
def test_promotion_follows_torch_result_type(other: np.dtype, expected: np.dtype) -> None:
    x = gv.ones(3, dtype=BF16)
    y = gv.ones(3, dtype=other)
    assert (x + y).dtype == expected and (y * x).dtype == expected


def test_python_numbers_and_0d_tensors_keep_bf16() -> None:
    x = gv.ones(3, dtype=BF16)
    assert (x * 2.5).dtype == BF16 and (2 + x).dtype == BF16 and (x / 3).dtype == BF16
    assert (x * gv.tensor(2.0, dtype=gv.float64)).dtype == BF16  # a 0-d float decides nothing
    assert (gv.ones(3, dtype=gv.float16) * gv.tensor(2.0, dtype=BF16)).dtype == gv.float16
    assert (gv.arange(3) * gv.tensor(2.0, dtype=BF16)).dtype == BF16  # the 0-d float wins


def test_ops_compute_in_float32_and_round_once() -> None:
    # NumPy's own bf16 arithmetic rounds every partial sum: 1000 ones sum to 256 there
    assert float(np.ones(1000, dtype=BF16).sum()) == 256.0
    ones = gv.ones(1000, dtype=BF16)
    assert ones.sum().item() == 1000.0 and ones.sum().dtype == BF16
    assert ones.mean().item() == 1.0
    assert (gv.ones(1, 1000, dtype=BF16) @ gv.ones(1000, 1, dtype=BF16)).item() == 1000.0
    # the float32 result is rounded once: 1 + 3 * 2**-9 is above the tie, so 1 + 2**-7
    x = gv.tensor([1.0], dtype=BF16)
    three_ninths = gv.tensor([3 * 2**-9], dtype=BF16)
    assert (x + three_ninths).item() == 1 + 2**-7
    expected = np.exp(np.float32(3.0)).astype(BF16)  # exp in float32, then rounded
    assert gv.tensor([3.0], dtype=BF16).exp().numpy().view(np.uint16)[0] == expected.view(np.uint16)


def test_backward_gives_bf16_gradients_computed_in_float32() -> None:
    x = gv.ones(1000, dtype=BF16, requires_grad=True)
    w = gv.full((1000,), 0.5, dtype=BF16, requires_grad=True)
    (x * w).sum().backward()
    assert x.grad.dtype == BF16 and w.grad.dtype == BF16
    assert np.all(x.grad.numpy().astype(np.float32) == 0.5)
    # a gradient summed over 1000 rows (a broadcast weight) is exact, not 256
    b = gv.ones(1, dtype=BF16, requires_grad=True)
    (gv.ones(1000, 1, dtype=BF16) * b).sum().backward()
    assert b.grad.item() == 1000.0


def test_second_order_gradients_go_through_bf16() -> None:
    x = gv.tensor([1.5, -2.0], dtype=BF16, requires_grad=True)
    (g,) = gv.autograd.grad((x * x * x).sum(), [x], create_graph=True)
    assert g.dtype == BF16 and g.detach().numpy().astype(np.float32).tolist() == [6.75, 12.0]
    (gg,) = gv.autograd.grad(g.sum(), [x])
    assert gg.dtype == BF16 and gg.numpy().astype(np.float32).tolist() == [9.0, -12.0]


def _bits(t: gv.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint16)


def test_data_movement_keeps_every_bit_and_views_stay_views() -> None:
    values = special_values((4, 4))
    bits = values.view(np.uint16)
    t = gv.tensor(values)
    assert np.array_equal(_bits(t.reshape(16)), bits.reshape(16))
    assert np.array_equal(_bits(t.T), bits.T)
    assert np.array_equal(_bits(t[1:3]), bits[1:3])
    assert np.array_equal(_bits(t[..., 0]), bits[..., 0])
    assert np.array_equal(_bits(t.expand(2, 4, 4)[1]), bits)
    assert np.array_equal(_bits(t.clone()), bits)
    assert np.array_equal(_bits(gv.cat([t, t])), np.concatenate([bits, bits]))
    eye = np.eye(4, dtype=bool)
    selected = gv.where(gv.tensor(eye), t, gv.zeros(4, 4, dtype=BF16))
    assert np.array_equal(_bits(selected), np.where(eye, bits, 0))
    assert np.shares_memory(t.reshape(16).numpy(), t.numpy())
    assert np.shares_memory(t.T.numpy(), t.numpy())


def test_a_saved_bf16_tensor_changed_in_place_is_still_caught() -> None:
    a = gv.ones(3, dtype=BF16, requires_grad=True)
    b = gv.full((3,), 2.0, dtype=BF16)
    out = a * b  # saves b (as a float32 stand-in that shares b's version counter)
    b.add_(1)
    with pytest.raises(InplaceModificationError, match="add_"):
        out.sum().backward()


def test_gradcheck_checks_bf16_inputs_in_float64() -> None:
    x = gv.randn(3, dtype=BF16, requires_grad=True)
    assert gradcheck(lambda t: (t * t).tanh().sum(), (x,))


def test_cuda_is_refused_for_bf16_with_a_clear_error() -> None:
    """CuPy has no bfloat16: the refusal comes before CuPy is asked for anything."""
    x = gv.ones(2, dtype=BF16)
    with pytest.raises(DtypeMismatchError, match="CuPy has no bfloat16") as caught:
        x.to("cuda")
    assert isinstance(caught.value, GradvaultError) and isinstance(caught.value, ValueError)
    with pytest.raises(DtypeMismatchError, match="cuda:1"):
        x.to("cuda:1")
    with pytest.raises(DtypeMismatchError, match="cuda:0"):
        gv.zeros(2, dtype=BF16, device="cuda")
    with pytest.raises(DtypeMismatchError):
        gv.tensor(np.ones(2, dtype=BF16), device="cuda:0")
    with pytest.raises(DtypeMismatchError):
        backend.to_device(np.ones(2, dtype=BF16), backend.device("cuda"))
    assert x.to("cpu") is x  # the cpu is fine


def test_records_and_safetensors_carry_bf16_bit_for_bit() -> None:
    values = special_values((4, 8))
    entry = gv.GradientRecordEntry.from_array(gv.ParamId(1), "w", values)
    assert entry.dtype == "bfloat16" and entry.nbytes == 64
    assert entry.data.tobytes() == values.tobytes()
    again = gv.GradientRecordEntry.from_bytes(gv.ParamId(1), "w", "bfloat16", (4, 8), entry.data)
    assert np.array_equal(again.array.view(np.uint16), values.view(np.uint16))
    row = gv.GradientRecordEntry.from_array(gv.ParamId(2), "b", values[0])
    record = gv.GradientsParamsRecord([entry, row])
    blob = b"".join(bytes(piece) for piece in safetensors_chunks(record))
    back = record_from_safetensors(blob)
    assert back == record
    for a, b in zip(record, back, strict=True):
        assert b.dtype == "bfloat16" and np.array_equal(
            a.array.view(np.uint16), b.array.view(np.uint16)
        )
    torch = pytest.importorskip("torch")
    from safetensors.torch import load  # noqa: PLC0415

    loaded = load(blob)
    first = loaded[str(gv.ParamId(1))]
    assert first.dtype == torch.bfloat16
    assert np.array_equal(first.view(torch.int16).numpy().view(np.uint16), values.view(np.uint16))


def test_gradients_params_registers_and_records_bf16() -> None:
    grads = gv.GradientsParams()
    value = special_values((3, 5))
    grads.register(gv.ParamId(9), gv.tensor(value), name="layer")
    record = grads.try_to_record()
    assert record[gv.ParamId(9)].dtype == "bfloat16"
    restored = gv.GradientsParams.from_record(record, "cpu")
    assert np.array_equal(
        restored.get(gv.ParamId(9)).numpy().view(np.uint16), value.view(np.uint16)
    )


def _train(dtype: np.dtype, steps: int) -> list[float]:
    gv.manual_seed(0)
    task = Task.make(samples=256, in_features=16, classes=3, seed=1)
    model = gv.MLP(16, [32, 32], 3, dtype=dtype)
    x, y = gv.tensor(task.features, dtype=dtype), gv.tensor(task.labels)
    losses = []
    for _ in range(steps):
        loss = gv.cross_entropy(model(x), y)
        loss.backward()
        with gv.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
        model.zero_grad()
        losses.append(float(loss.item()))
    return losses


def test_a_bf16_mlp_trains_like_the_float32_one() -> None:
    """Same seed, same data: the bf16 loss curve stays within 0.05 (absolute) of float32's
    at every step and ends at least halved, as the float32 run's does."""
    bf16 = _train(BF16, 40)
    f32 = _train(gv.float32, 40)
    assert bf16[-1] < 0.5 * bf16[0] and f32[-1] < 0.5 * f32[0]
    assert max(abs(a - b) for a, b in zip(bf16, f32, strict=True)) < 0.05, (bf16, f32)


def test_other_ml_dtypes_types_are_refused_by_name() -> None:
    """Only bfloat16 of ml_dtypes' types is taken; float8 is refused, naming its dtype."""
    float8 = np.zeros(4, dtype=ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        gv.tensor(float8)
    with pytest.raises(DtypeMismatchError, match="float8_e4m3fn"):
        gv.GradientRecordEntry.from_array(gv.ParamId(1), "w", float8)
    with pytest.raises(DtypeMismatchError, match="'float8'"):
        gv.GradientRecordEntry.from_bytes(gv.ParamId(1), "w", "float8", (4,), bytes(4))
