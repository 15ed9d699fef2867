"""The autograd graph: ``Node`` (one recorded op), ``AccumulateGrad`` (a leaf's node), the
``Context`` a Function's forward fills for its backward, and hook handles.

These sit below ``tensor.py``: a Tensor holds its ``grad_fn`` node; the Function that
records nodes (``function.py``) and the engine that walks them (``autograd/engine.py``)
sit above it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..errors import AutogradError, InplaceModificationError
from ..records.dtypes import COMPUTE_DTYPE, bfloat16

if TYPE_CHECKING:
    from .function import Function
    from .tensor import Tensor


class Context:
    """What a Function's forward keeps for its backward."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._saved: tuple[tuple[Tensor | None, int], ...] = ()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.bfloat16_inputs: tuple[bool, ...] = ()  # set when forward computed in float32

    if TYPE_CHECKING:
        # forward keeps what its backward needs as attributes of its own (``ctx.dim = dim``),
        # as PyTorch's ctx does: any name may be set and read
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        """Keep ``tensors`` for backward; changing one of them in place later is an error.

        An inference tensor cannot be saved (PyTorch's rule): it has no version counter
        that could tell its later in-place changes.
        """
        for t in tensors:
            if t is not None and t.is_inference():
                raise AutogradError(
                    f"inference tensors cannot be saved for backward ({self._node.name}): a "
                    f"tensor of shape {tuple(t.shape)} was made under inference_mode; clone "
                    "it outside inference_mode to use it in autograd"
                )
        self._saved = tuple((t, t.version if t is not None else 0) for t in tensors)

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
            current = tensor.version
            if current != version:
                op = tensor.last_inplace_op or "an in-place operation"
                raise InplaceModificationError(
                    f"one of the tensors needed for gradient computation was modified by an "
                    f"in-place operation ({op}): saved tensor {index} of {self._node.name}, "
                    f"shape {tuple(tensor.shape)}, is at version {current}; expected version "
                    f"{version}. Use the out-of-place op or clone the tensor first."
                )
        # a slot saved as None (its partner needs no grad) stays None: only the rule that
        # saved it reads it
        return cast("tuple[Tensor, ...]", tuple(tensor for tensor, _ in self._saved))


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
