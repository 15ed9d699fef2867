"""The PyTorch adapter: memory shared both ways, bit-identical round trips, clear refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import (
    DeviceError,
    DtypeMismatchError,
    GradientsParams,
    ParamIdMismatchError,
    ShapeMismatchError,
    bfloat16,
    from_dlpack,
)
from gradvault.core.autodiff.torch_adapter import param_id_of
from gradvault.core.records.safetensors_file import record_from_safetensors, safetensors_chunks

from ..bf16_values import same_bits, special_values

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

#: bit patterns no arithmetic would produce: signed zero, NaNs with payloads and sign,
#: infinities, the smallest and largest subnormals, the extremes
SPECIAL_BITS = {
    torch.float16: (np.uint16, [0x8000, 0x7E01, 0xFC01, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x7BFF]),
    torch.float32: (
        np.uint32,
        [0x80000000, 0x7FC00123, 0xFF800001, 0x7F800000, 0xFF800000, 0x1, 0x7FFFFF, 0x7F7FFFFF],
    ),
    torch.float64: (
        np.uint64,
        [1 << 63, 0x7FF8000000000ABC, 0xFFF0000000000001, 0x7FF0 << 48, 0x1, 0xFFFFFFFFFFFFF],
    ),
}


class Net(torch.nn.Module):
    """Parameters of three float dtypes, nested names."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 2, dtype=torch.float64)
        self.scale = torch.nn.Parameter(torch.ones(3, 5, dtype=torch.float16))


def special_grads(net: Net) -> None:
    """Give every parameter a gradient holding the special bit patterns, then random bits."""
    generator = np.random.default_rng(0)
    for param in net.parameters():
        unsigned, patterns = SPECIAL_BITS[param.dtype]
        bits = generator.integers(0, np.iinfo(unsigned).max, size=param.numel(), dtype=unsigned)
        bits[: len(patterns)] = patterns[: param.numel()]
        values = bits.view(np.dtype(str(param.dtype).removeprefix("torch.")))
        param.grad = torch.from_numpy(values.reshape(tuple(param.shape)).copy())


def bits_of(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().numpy().tobytes()


def test_from_torch_shares_each_gradient_and_keys_it_by_name() -> None:
    net = Net()
    special_grads(net)
    grads = GradientsParams.from_torch(net)
    assert len(grads) == 5
    for name, param in net.named_parameters():
        pid = param_id_of(name)
        assert grads.name(pid) == name
        view = grads.get(pid).numpy()
        assert np.shares_memory(view, param.grad.numpy())
        assert view.ctypes.data == param.grad.data_ptr()
    # a write through PyTorch is seen through gradvault: the same bytes
    net.head.bias.grad.fill_(3.0)
    assert grads.get(param_id_of("head.bias")).numpy().tolist() == [3.0, 3.0]


def test_to_torch_shares_memory_and_the_round_trip_is_bit_identical(tmp_path: Path) -> None:
    source = Net()
    special_grads(source)
    expected = {name: bits_of(param.grad) for name, param in source.named_parameters()}

    # through a record and a safetensors file, as a snapshot travels
    record = GradientsParams.from_torch(source).try_to_record()
    path = tmp_path / "g.safetensors"
    path.write_bytes(b"".join(bytes(chunk) for chunk in safetensors_chunks(record)))
    restored = GradientsParams.from_record(record_from_safetensors(path))

    target = Net()
    restored.to_torch(target)
    for name, param in target.named_parameters():
        assert bits_of(param.grad) == expected[name], name
        assert param.grad.data_ptr() == restored.get(param_id_of(name)).numpy().ctypes.data
    np.testing.assert_array_equal(
        target.head.weight.grad.numpy().view(np.uint64).ravel()[:6],
        np.array(SPECIAL_BITS[torch.float64][1], dtype=np.uint64),
    )


def test_a_record_is_a_point_in_time_copy_of_shared_gradients() -> None:
    net = Net()
    special_grads(net)
    before = bits_of(net.encoder[0].weight.grad)
    record = GradientsParams.from_torch(net).try_to_record()
    net.encoder[0].weight.grad.add_(1.0)  # PyTorch accumulates into the shared buffer
    entry = next(e for e in record if e.name == "encoder.0.weight")
    assert bytes(entry.data) == before


def test_param_ids_are_stable_across_processes_and_versions(tmp_path: Path) -> None:
    # pinned: a snapshot written today must restore by id with every later version
    assert str(param_id_of("encoder.0.weight")) == "ceac9d6b5009931c"
    assert str(param_id_of("head.bias")) == "0c3c8b8415ca33db"
    code = (
        "from gradvault.core.autodiff.torch_adapter import param_id_of\n"
        "print(param_id_of('encoder.0.weight'), param_id_of('héad.π'))\n"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    assert runs == {f"ceac9d6b5009931c {param_id_of('héad.π')}\n"}


def test_refused_dtypes_and_layouts_name_the_parameter_and_take_nothing() -> None:
    net = Net()
    special_grads(net)
    net.scale.grad = None
    complex_net = torch.nn.Linear(2, 2, dtype=torch.complex64)
    complex_net.weight.grad = torch.zeros(2, 2, dtype=torch.complex64)
    with pytest.raises(DtypeMismatchError, match=r"'weight'.*torch\.complex64"):
        GradientsParams.from_torch(complex_net)

    sparse = torch.nn.Embedding(4, 2, sparse=True)
    sparse(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(DeviceError, match=r"'weight'.*layout torch\.sparse_coo"):
        GradientsParams.from_torch(sparse)

    meta = torch.nn.Linear(2, 2, device="meta")
    meta.weight.grad = torch.zeros(2, 2, device="meta")
    with pytest.raises(DeviceError, match=r"'weight'.*is on meta"):
        GradientsParams.from_torch(meta)

    with pytest.raises(TypeError, match="torch.nn.Module"):
        GradientsParams.from_torch(object())


def test_from_dlpack_refuses_what_numpy_cannot_hold() -> None:
    with pytest.raises(DtypeMismatchError, match="bfloat16"):
        from_dlpack(torch.zeros(2, dtype=torch.bfloat16))
    shared = from_dlpack(torch.arange(3.0))
    assert shared.numpy().tolist() == [0.0, 1.0, 2.0]


def test_to_torch_checks_everything_before_setting_anything() -> None:
    source, target = Net(), Net()
    special_grads(source)
    special_grads(target)
    kept = {name: bits_of(p.grad) for name, p in target.named_parameters()}
    grads = GradientsParams.from_torch(source)

    stranger = GradientsParams.from_torch(source)
    stranger.register(param_id_of("decoder.weight"), from_dlpack(torch.zeros(2)), name="x")
    with pytest.raises(ParamIdMismatchError, match=r"\('x'\) matches no parameter"):
        stranger.to_torch(target)

    wider = Net()
    wider.head = torch.nn.Linear(8, 3, dtype=torch.float64)
    with pytest.raises(ShapeMismatchError, match=r"'head.weight' has \(3, 8\)"):
        grads.to_torch(wider)

    float32_head = Net()
    float32_head.head = torch.nn.Linear(8, 2)
    with pytest.raises(DtypeMismatchError, match=r"'head.weight' has torch.float32"):
        grads.to_torch(float32_head)

    on_meta = Net().to("meta")
    with pytest.raises(DeviceError, match="cannot cross devices"):
        grads.to_torch(on_meta)

    with pytest.raises(ValueError, match="match must be"):
        grads.to_torch(target, match="position")

    assert {name: bits_of(p.grad) for name, p in target.named_parameters()} == kept


def test_to_torch_by_name_after_a_rename() -> None:
    source = Net()
    special_grads(source)
    renamed = torch.nn.Module()
    renamed.add_module("body", Net())
    grads = GradientsParams.from_torch(source)
    with pytest.raises(ParamIdMismatchError, match="match='name'"):
        grads.to_torch(renamed)
    # the names grads records are the source's; restore by them onto a same-named module
    same_names = Net()
    grads.to_torch(same_names, match="name")
    assert bits_of(same_names.scale.grad) == bits_of(source.scale.grad)


def test_core_imports_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # import torch now fails, as where it is absent
        "import gradvault.core as gv\n"
        "try:\n"
        "    gv.GradientsParams.from_torch(object())\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'gradvault[torch]'" in result.stdout


class Bf16Net(torch.nn.Module):
    """bfloat16 parameters, one of them given a transposed (non-contiguous) gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(40, 3, dtype=torch.bfloat16)
        self.gain = torch.nn.Parameter(torch.ones(5, 7, dtype=torch.bfloat16))


def bf16_grads(net: Bf16Net) -> None:
    """Every special bf16 bit pattern (NaN payloads, -0.0, subnormals), then random bits."""
    for seed, param in enumerate(net.parameters()):
        bits = special_values(tuple(param.shape), seed=seed).view(np.int16).copy()
        param.grad = torch.from_numpy(bits).view(torch.bfloat16)
    transposed = special_values((7, 5), seed=9).view(np.int16).copy()
    net.gain.grad = torch.from_numpy(transposed).view(torch.bfloat16).T


def bf16_bits(grad: torch.Tensor) -> np.ndarray:
    return grad.detach().view(torch.int16).numpy().view(bfloat16)


def test_bf16_gradients_are_shared_with_pytorch_not_copied() -> None:
    net = Bf16Net()
    bf16_grads(net)
    grads = GradientsParams.from_torch(net)
    for name, param in net.named_parameters():
        shared = grads.get(param_id_of(name))
        assert shared.dtype == bfloat16 and tuple(shared.shape) == tuple(param.shape)
        view = shared.numpy()
        assert view.ctypes.data == param.grad.data_ptr(), name
        assert view.strides == tuple(2 * s for s in param.grad.stride()), name
        assert same_bits(view, bf16_bits(param.grad)), name
    # a write through PyTorch is seen through gradvault: the same bytes
    net.proj.bias.grad.fill_(1.5)
    assert grads.get(param_id_of("proj.bias")).numpy().astype(np.float32).tolist() == [1.5] * 3


def test_bf16_round_trip_through_pytorch_is_bit_exact_and_shared(tmp_path: Path) -> None:
    source = Bf16Net()
    bf16_grads(source)
    expected = {name: bf16_bits(p.grad).copy() for name, p in source.named_parameters()}

    record = GradientsParams.from_torch(source).try_to_record()
    path = tmp_path / "g.safetensors"
    path.write_bytes(b"".join(bytes(chunk) for chunk in safetensors_chunks(record)))
    restored = GradientsParams.from_record(record_from_safetensors(path))

    target = Bf16Net()
    restored.to_torch(target)
    for name, param in target.named_parameters():
        assert param.grad.dtype == torch.bfloat16, name
        assert same_bits(bf16_bits(param.grad), expected[name]), name
        assert param.grad.data_ptr() == restored.get(param_id_of(name)).numpy().ctypes.data
    # shared, not copied: a write through gradvault's array is seen by PyTorch
    restored.get(param_id_of("proj.bias")).numpy()[...] = np.float32(-2.0)
    assert target.proj.bias.grad.tolist() == [-2.0] * 3


def test_a_record_of_shared_bf16_gradients_is_a_point_in_time_copy() -> None:
    net = Bf16Net()
    bf16_grads(net)
    before = bf16_bits(net.proj.weight.grad).copy()
    record = GradientsParams.from_torch(net).try_to_record()
    net.proj.weight.grad.add_(1.0)
    entry = next(e for e in record if e.name == "proj.weight")
    assert same_bits(entry.array, before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bf16_gradient_on_cuda_is_refused_and_nothing_is_taken() -> None:
    net = Bf16Net().cuda()
    for param in net.parameters():
        param.grad = torch.zeros_like(param)
    with pytest.raises(DtypeMismatchError, match=r"'proj.weight'.*bfloat16 on cuda:0"):
        GradientsParams.from_torch(net)
