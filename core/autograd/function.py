"""Graph nodes: ``Function`` (an op's forward and backward side by side) and its ``Node``.

A Function subclass defines ``forward(ctx, *args)`` on raw arrays (Tensor arguments arrive
as Tensors so that the op can save them) and ``backward(ctx, grad)`` written with Tensor
operations, so that with ``create_graph=True`` the backward pass is itself recorded and
higher derivatives work. The graph walk lives in ``engine.py``, apart from the rules.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bfloat16 import COMPUTE_DTYPE, bfloat16, is_floating, rounded, rounds_result, widened
from ..errors import AutogradError, InplaceModificationError
from .grad_mode import _state

if TYPE_CHECKING:
    from ..tensor import Tensor


class Context:
    """What a Function's forward keeps for its backward."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._saved: tuple[tuple[Tensor, int], ...] = ()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.bfloat16_inputs: tuple[bool, ...] = ()  # set when forward computed in float32

    def save_for_backward(self, *tensors: Tensor) -> None:
        """Keep ``tensors`` for backward; changing one of them in place later is an error.

        An inference tensor cannot be saved (PyTorch's rule): it has no version counter
        that could tell its later in-place changes.
        """
        for t in tensors:
            if t is not None and t._inference:
                raise AutogradError(
                    f"inference tensors cannot be saved for backward ({self._node.name}): a "
                    f"tensor of shape {tuple(t.shape)} was made under inference_mode; clone "
                    "it outside inference_mode to use it in autograd"
                )
        self._saved = tuple((t, t._version if t is not None else 0) for t in tensors)

    def save_output(self) -> None:
        """Keep the op's output too (it is appended to ``saved_tensors`` once known)."""
        self._node.saves_output = True

    @property
    def saved_tensors(self) -> tuple[Tensor, ...]:
        """The saved tensors; raises if the graph was freed or one was modified in place."""
        if self._node.released:
            raise AutogradError(
                f"trying to backward through the graph a second time (node {self._node.name}); "
                "its saved tensors were freed after the first backward. Pass retain_graph=True "
                "to the first backward if you need to backward twice."
            )
        for index, (tensor, version) in enumerate(self._saved):
            if tensor is None:  # not needed by this backward (its partner needs no grad)
                continue
            current = tensor._version
            if current != version:
                op = tensor._storage.last_op or "an in-place operation"
                raise InplaceModificationError(
                    f"one of the tensors needed for gradient computation was modified by an "
                    f"in-place operation ({op}): saved tensor {index} of {self._node.name}, "
                    f"shape {tuple(tensor.shape)}, is at version {current}; expected version "
                    f"{version}. Use the out-of-place op or clone the tensor first."
                )
        return tuple(tensor for tensor, _ in self._saved)


Hook = Callable[["Tensor"], "Tensor | None"]


class RemovableHandle:
    """What ``register_hook`` returns: ``remove()`` unregisters the hook (PyTorch's handle).

    Also a context manager that removes the hook on exit. Removing twice does nothing.
    """

    __slots__ = ("_hooks", "id")
    _next_id = 0

    def __init__(self, hooks: dict[int, Hook], hook: Hook) -> None:
        RemovableHandle._next_id += 1
        self.id = RemovableHandle._next_id
        self._hooks = hooks
        hooks[self.id] = hook

    def remove(self) -> None:
        """Unregister the hook: later backward passes no longer call it."""
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


class Node:
    """A recorded op: its backward rule, the edges to its inputs' nodes and their shapes."""

    __slots__ = (
        "name",
        "function",
        "ctx",
        "next_nodes",
        "input_shapes",
        "released",
        "saves_output",
        "tensor_hooks",
        "retained",
        "sequence",
        "__weakref__",
    )

    _counter = 0

    def __init__(self, function: type[Function] | None, name: str) -> None:
        self.name = name
        self.function = function
        self.ctx: Context | None = None
        self.next_nodes: tuple[Node | None, ...] = ()
        self.input_shapes: tuple[tuple[int, ...], ...] = ()
        self.released = False
        self.saves_output = False
        self.tensor_hooks: dict[int, Hook] = {}  # RemovableHandle id -> hook
        self.retained: weakref.ref[Tensor] | None = None
        Node._counter += 1
        self.sequence = Node._counter

    def apply(self, grad: Tensor) -> tuple[Tensor | None, ...]:
        """Gradients for each input given the gradient of the output."""
        assert self.function is not None and self.ctx is not None
        rounds = self.ctx.bfloat16_inputs  # bf16: compute in float32, round each result
        if rounds and grad.dtype == bfloat16:
            grad = grad.to(dtype=COMPUTE_DTYPE)
        grads = self.function.backward(self.ctx, grad)
        if not isinstance(grads, tuple):
            grads = (grads,)
        if rounds:
            grads = tuple(
                g.to(dtype=bfloat16) if g is not None and bf16 and g.dtype != bfloat16 else g
                for g, bf16 in zip(grads, rounds, strict=False)
            )
        return grads

    def release(self) -> None:
        """Free the saved tensors (the graph cannot be walked through this node again)."""
        if self.ctx is not None and self.ctx._saved:
            self.ctx._saved = ()
            self.released = True

    def register_hook(self, hook: Hook) -> RemovableHandle:
        """Call ``hook(grad)`` on the gradient of this node's output; it may return a new one."""
        return RemovableHandle(self.tensor_hooks, hook)

    def __repr__(self) -> str:
        return f"<{self.name}>"


class AccumulateGrad(Node):
    """The node of a leaf that requires grad: sums incoming gradients into ``leaf.grad``."""

    __slots__ = ("variable",)

    def __init__(self, leaf: Tensor) -> None:
        super().__init__(None, "AccumulateGrad")
        self.variable = weakref.ref(leaf)


class Function:
    """Base of every differentiable op. Subclasses define ``forward`` and ``backward``.

    ``computes`` is False for ops that only move data (views, copies, casts): on bfloat16
    inputs every other op computes in float32 and rounds (``core/bfloat16.py``).
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
        from ..tensor import Tensor, _leaf_node  # noqa: PLC0415 - circular at import time

        tensor_inputs = [a for a in args if isinstance(a, Tensor)]
        rounds = cls.computes and rounds_result(tensor_inputs)
        if rounds:  # bf16 inputs: forward sees exact float32 stand-ins; its result is rounded
            args = tuple(
                widened(a) if isinstance(a, Tensor) and a.dtype == bfloat16 else a for a in args
            )
        record = (
            cls.differentiable
            and _state.grad_enabled
            and not _state.inference
            and any(t.requires_grad for t in tensor_inputs)
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
                return Tensor._make(data)
            node.ctx = ctx
            node.next_nodes = tuple(
                (t.grad_fn if t.grad_fn is not None else _leaf_node(t)) if t.requires_grad else None
                for t in tensor_inputs
            )
            node.input_shapes = tuple(tuple(t.shape) for t in tensor_inputs)
            out = Tensor._make(data, requires_grad=True, grad_fn=node)
            if node.saves_output:
                ctx._saved = ctx._saved + ((out, out._version),)
            return out
        with np.errstate(all="ignore"):
            data = _as_array(cls.forward(_FreeContext(), *args, **kwargs))
            if rounds and data.dtype == COMPUTE_DTYPE:
                data = rounded(data)
        return Tensor._make(data)


def _as_array(data: Any) -> Any:
    # NumPy reductions return scalars (np.float32); a Tensor always holds an array
    return np.asarray(data) if isinstance(data, np.generic) else data


class _FreeContext(Context):
    """The context handed to forward when nothing is recorded: saving is a no-op."""

    def __init__(self) -> None:
        self._saved = ()
        self.needs_input_grad = ()

    def save_for_backward(self, *tensors: Tensor) -> None:
        return None

    def save_output(self) -> None:
        return None
