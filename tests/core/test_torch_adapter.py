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
    from_dlpack,
)
from gradvault.core.safetensors_file import record_from_safetensors, safetensors_chunks
from gradvault.core.torch_adapter import param_id_of

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
        "from gradvault.core.torch_adapter import param_id_of\n"
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
    bf16 = torch.nn.Linear(2, 2, dtype=torch.bfloat16)
    bf16.weight.grad = torch.zeros(2, 2, dtype=torch.bfloat16)
    with pytest.raises(DtypeMismatchError, match=r"'weight'.*torch\.bfloat16"):
        GradientsParams.from_torch(bf16)

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
