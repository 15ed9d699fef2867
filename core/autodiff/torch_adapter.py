"""PyTorch modules' gradients as :class:`GradientsParams` and back, memory shared (DLPack).

Install the extra (``pip install 'gradvault[torch]'``); torch is imported only when one
of these functions is called, so ``gradvault.core`` imports without it.

A PyTorch parameter has no id of its own, so its ParamId is derived from its name in
``module.named_parameters()`` (:func:`param_id_of`): the same name gives the same id in
every process and every version of gradvault, and the ids of a module's parameters are
the ones its snapshots hold. Renaming a parameter changes its id; restore by name then.

Nothing is copied on the way: ``from_torch`` wraps each ``param.grad`` through DLPack
(a NumPy view of host memory, a CuPy view of CUDA memory) and ``to_torch`` gives each
parameter a ``.grad`` on the gradient tensor's own buffer. A record taken of gradients
from ``from_torch`` copies their bytes, since PyTorch can write them afterwards.

bfloat16 gradients are shared too, on the cpu: DLPack carries them but NumPy cannot take
them, so they cross as their 16-bit patterns, ``t.view(torch.int16).numpy()`` viewed as
``ml_dtypes.bfloat16``, and back as ``torch.from_numpy(a.view(np.int16))`` viewed as
``torch.bfloat16``: same buffer, every bit kept. CuPy has no bfloat16, so a bf16
gradient on cuda is refused (convert it to float32 first).
"""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    DeviceError,
    DtypeMismatchError,
    InvalidArgumentError,
    ParamIdMismatchError,
    ShapeMismatchError,
)
from ..records.dtypes import BFLOAT16_NAME, bfloat16
from ..records.param_id import ParamId
from ..records.record_rules import SUPPORTED_DTYPES
from .factories import from_dlpack
from .tensor import Tensor, wrap_shared

if TYPE_CHECKING:
    from .gradients_params import GradientsParams

#: BLAKE2b's personalization for parameter names: these ids are apart from any other hash
PARAM_ID_PERSON = b"gradvault.torch"

_DEVICES = ("cpu", "cuda")


def param_id_of(name: str) -> ParamId:
    """The ParamId of the PyTorch parameter named ``name`` (``"encoder.0.weight"``).

    The first 8 bytes, read big-endian, of BLAKE2b over the name's UTF-8 bytes with
    ``digest_size=8`` and ``person=b"gradvault.torch"``.
    """
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=PARAM_ID_PERSON)
    return ParamId(int.from_bytes(digest.digest(), "big"))


def _torch() -> Any:
    try:
        import torch  # the optional extra, imported only when used
    except ImportError as error:
        raise ImportError(
            "the PyTorch adapter needs torch; install the extra: pip install 'gradvault[torch]'"
        ) from error
    return torch


def is_torch_module(value: object) -> bool:
    """Whether ``value`` is a ``torch.nn.Module`` (never imports torch to find out)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _check_module(module: object, torch: Any) -> None:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module; got {type(module).__name__}")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _shareable(name: str, grad: Any, torch: Any) -> Any:
    """``grad`` ready to be wrapped without a copy, or the error that says why it cannot."""
    pid = param_id_of(name)
    if grad.layout != torch.strided:
        raise DeviceError(
            f"gradient of {name!r} (param {pid}) has layout {grad.layout}; only dense "
            "(torch.strided) gradients can be shared"
        )
    if grad.device.type not in _DEVICES:
        raise DeviceError(
            f"gradient of {name!r} (param {pid}) is on {grad.device}; gradvault shares "
            "cpu and cuda memory only"
        )
    if _dtype_name(grad.dtype) not in SUPPORTED_DTYPES:
        raise DtypeMismatchError(
            f"gradient of {name!r} (param {pid}) has dtype {grad.dtype}; a snapshot holds "
            f"one of {', '.join(SUPPORTED_DTYPES)}"
        )
    if _dtype_name(grad.dtype) == BFLOAT16_NAME and grad.device.type != "cpu":
        raise DtypeMismatchError(
            f"gradient of {name!r} (param {pid}) is bfloat16 on {grad.device}; CuPy has no "
            "bfloat16, so only cpu bfloat16 gradients can be shared: convert it to float32 "
            "(.float() keeps every value) or move it to the cpu"
        )
    return grad.detach()


def _from_torch_grad(grad: Any, torch: Any) -> Tensor:
    """A tensor on ``grad``'s memory: DLPack, or the int16 view for a cpu bf16 gradient."""
    if grad.dtype == torch.bfloat16:  # NumPy takes no bf16 through DLPack: its bits, viewed
        return wrap_shared(grad.view(torch.int16).numpy().view(bfloat16))
    return from_dlpack(grad)


def _to_torch_grad(grad: Tensor, torch: Any) -> Any:
    """A torch tensor on ``grad``'s memory: DLPack, or the int16 view for a bf16 gradient."""
    if grad.dtype == bfloat16:  # a cpu array (bf16 tensors never leave the cpu)
        return torch.from_numpy(grad.detach().numpy().view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(grad.detach())


def torch_gradients(module: Any) -> list[tuple[ParamId, Tensor, str]]:
    """(ParamId, shared tensor, name) of every parameter of a ``torch.nn.Module`` with a ``.grad``.

    What ``GradientsParams.from_torch`` registers. Keyed by :func:`param_id_of` of each
    parameter's name. Every gradient is checked before any is taken: a sparse one, one on
    a device other than cpu or cuda, one of a dtype a snapshot cannot hold (complex), or a
    bfloat16 one on cuda raises DeviceError or DtypeMismatchError naming the parameter.
    A cpu bfloat16 gradient is shared through its int16 view (the module's docstring).
    """
    torch = _torch()
    _check_module(module, torch)
    shared = [
        (name, _shareable(name, param.grad, torch))
        for name, param in module.named_parameters()
        if param.grad is not None
    ]
    return [(param_id_of(name), _from_torch_grad(grad, torch), name) for name, grad in shared]


def to_torch(module: Any, grads: GradientsParams, *, match: str = "id") -> None:
    """Set each parameter's ``.grad`` of a ``torch.nn.Module`` to its gradient in ``grads``.

    ``match="id"`` finds a parameter's gradient by :func:`param_id_of` of its name;
    ``match="name"`` by the name ``grads`` records. The ``.grad`` shares the gradient's
    memory (a bfloat16 gradient's through its int16 view). Everything is checked before
    anything is set: a gradient that matches no parameter (ParamIdMismatchError), or
    whose shape, dtype or device is not the parameter's (ShapeMismatchError,
    DtypeMismatchError, DeviceError: it would need a copy; restore onto the parameters'
    device) leaves every ``.grad`` as it was.
    Parameters with no gradient in ``grads`` keep their ``.grad``.
    """
    if match not in ("id", "name"):
        raise InvalidArgumentError(f"match must be 'id' or 'name'; got {match!r}")
    torch = _torch()
    _check_module(module, torch)
    params = dict(module.named_parameters())
    by_key = {(param_id_of(name) if match == "id" else name): name for name in params}
    assignments = []
    for pid, grad in grads.items():
        recorded = grads.name(pid)
        name = by_key.get(pid if match == "id" else recorded)
        if name is None:
            raise ParamIdMismatchError(
                f"gradient for param {pid} ({recorded!r}) matches no parameter of the "
                f"module by {match}"
                + ("; pass match='name' if the parameters were renamed" if match == "id" else "")
            )
        param = params[name]
        if tuple(grad.shape) != tuple(param.shape):
            raise ShapeMismatchError(
                f"gradient for param {pid} ({recorded!r}) has shape {tuple(grad.shape)}; the "
                f"module's parameter {name!r} has {tuple(param.shape)}"
            )
        if str(grad.dtype) != _dtype_name(param.dtype):
            raise DtypeMismatchError(
                f"gradient for param {pid} ({recorded!r}) has dtype {grad.dtype}; the "
                f"module's parameter {name!r} has {param.dtype}"
            )
        if str(grad.device) != str(_device_text(param.device)):
            raise DeviceError(
                f"gradient for param {pid} ({recorded!r}) is on {grad.device}; the module's "
                f"parameter {name!r} is on {param.device}, and sharing cannot cross devices: "
                "restore the gradients onto the parameters' device"
            )
        assignments.append((param, grad))
    for param, grad in assignments:
        param.grad = _to_torch_grad(grad, torch)


def _device_text(device: Any) -> str:
    """A torch device as gradvault writes devices (``cpu``, ``cuda:N``)."""
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    return device.type
