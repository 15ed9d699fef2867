"""A PyTorch module's gradients pushed, then restored into a fresh module, bit-identical."""

from __future__ import annotations

import pytest

from gradvault.core import GradientsParams, ParamIdMismatchError
from gradvault.core.autodiff.torch_adapter import param_id_of
from tests.core.autodiff.test_torch_adapter import Net, bits_of, special_grads

from .conftest import ClientUnderTest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


async def test_push_from_torch_then_restore_into_a_torch_module(api: ClientUnderTest) -> None:
    source = Net()
    special_grads(source)
    expected = {name: bits_of(param.grad) for name, param in source.named_parameters()}
    summary = await api.call("push", GradientsParams.from_torch(source), run="torch", step=3)

    target = Net()
    grads = await api.call("restore", summary.id, "cpu", module=target)
    for name, param in target.named_parameters():
        assert bits_of(param.grad) == expected[name], name
        assert param.grad.data_ptr() == grads.get(param_id_of(name)).numpy().ctypes.data

    stranger = torch.nn.Linear(2, 2)
    with pytest.raises(ParamIdMismatchError, match="matches no parameter"):
        await api.call("restore", summary.id, "cpu", module=stranger)
    assert stranger.weight.grad is None
