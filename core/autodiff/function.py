"""``Function``: an op's forward and backward side by side, recorded as a graph ``Node``.

A Function subclass defines ``forward(ctx, *args)`` on raw arrays (Tensor arguments arrive
as Tensors so that the op can save them) and ``backward(ctx, grad)`` written with Tensor
operations, so that with ``create_graph=True`` the backward pass is itself recorded and
higher derivatives work. The graph walk lives in ``autograd/engine.py``, apart from the
rules; ``sum_to_shape`` is the one place that undoes broadcasting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AutogradError
from ..records.dtypes import COMPUTE_DTYPE, bfloat16, is_floating
from .bfloat16 import rounded, rounds_result, widened
from .grad_mode import is_recording
from .graph import Context, Node
from .tensor import Tensor, leaf_node, wrap


def sum_to_shape(grad: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``grad`` summed over the dimensions that broadcasting added or stretched to get ``shape``."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra < 0:
        raise AutogradError(f"gradient of shape {tuple(grad.shape)} cannot reduce to {shape}")
    dims = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    if extra:
        grad = grad.reshape(shape)
    return grad


class Function:
    """Base of every differentiable op. Subclasses define ``forward`` and ``backward``.

    ``computes`` is False for ops that only move data (views, copies, casts): on bfloat16
    inputs every other op computes in float32 and rounds (``core/autodiff/bfloat16.py``).
    """

    differentiable = True
    computes = True

    @staticmethod
    def forward(ctx: Context, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, grad: Tensor) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Tensor:
        """Run forward; record a node when grad mode is on and an input requires grad.

        Nothing is recorded inside ``inference_mode`` (even under ``enable_grad()``), nor
        for an integer or bool result: as in PyTorch, such results never require grad.
        Like PyTorch, ops produce inf and nan silently (NumPy's warnings are off inside).
        """
        tensor_inputs = [a for a in args if isinstance(a, Tensor)]
        rounds = cls.computes and rounds_result(tensor_inputs)
        if rounds:  # bf16 inputs: forward sees exact float32 stand-ins; its result is rounded
            args = tuple(
                widened(a) if isinstance(a, Tensor) and a.dtype == bfloat16 else a for a in args
            )
        record = (
            cls.differentiable and is_recording() and any(t.requires_grad for t in tensor_inputs)
        )
        if record:
            node = Node(cls, cls.__name__ + "Backward")
            ctx = Context(node)
            ctx.needs_input_grad = tuple(t.requires_grad for t in tensor_inputs)
            with np.errstate(all="ignore"):
                data = _as_array(cls.forward(ctx, *args, **kwargs))
                if rounds:
                    ctx.bfloat16_inputs = tuple(t.dtype == bfloat16 for t in tensor_inputs)
                    data = rounded(data) if data.dtype == COMPUTE_DTYPE else data
            if not is_floating(data.dtype) and data.dtype.kind != "c":  # int, bool cut the graph
                return wrap(data)
            node.ctx = ctx
            node.next_nodes = tuple(
                (t.grad_fn if t.grad_fn is not None else leaf_node(t)) if t.requires_grad else None
                for t in tensor_inputs
            )
            node.input_shapes = tuple(tuple(t.shape) for t in tensor_inputs)
            out = wrap(data, requires_grad=True, grad_fn=node)
            if node.saves_output:
                ctx._saved = ctx._saved + ((out, out.version),)
            return out
        with np.errstate(all="ignore"):
            data = _as_array(cls.forward(_FreeContext(), *args, **kwargs))
            if rounds and data.dtype == COMPUTE_DTYPE:
                data = rounded(data)
        return wrap(data)


def _as_array(data: Any) -> Any:
    # NumPy reductions return scalars (np.float32); a Tensor always holds an array
    return np.asarray(data) if isinstance(data, np.generic) else data


class _FreeContext(Context):
    """The context handed to forward when nothing is recorded: saving is a no-op."""

    def __init__(self) -> None:
        self._saved = ()
        self.needs_input_grad = ()

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        return None

    def save_output(self) -> None:
        return None
