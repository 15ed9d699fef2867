"""The graph walk: one engine for ``backward`` and ``autograd.grad``.

The rules live with their ops (``Function.backward``); this module only orders the nodes,
sums the gradients arriving at each one, undoes broadcasting (``sum_to_shape``, the one
place that does it), runs hooks, frees the graph and delivers gradients to ``.grad``
(laid out and accumulated as PyTorch's AccumulateGrad does).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from ...errors import AutogradError, ConflictingOptionsError, InvalidArgumentTypeError
from .. import backend
from ..factories import ones_like, zeros_like
from ..function import Function, sum_to_shape
from ..grad_mode import set_grad_enabled
from ..gradients import Gradients
from ..graph import AccumulateGrad, Context, Hook, Node
from ..tensor import Tensor, array_of, leaf_node
from ._arguments import as_tuple


def _root_node(tensor: Tensor, index: int) -> Node:
    if not tensor.requires_grad:
        raise AutogradError(
            f"element {index} of tensors does not require grad and does not have a grad_fn "
            f"(shape {tuple(tensor.shape)})"
        )
    return tensor.grad_fn if tensor.grad_fn is not None else leaf_node(tensor)


def _needed(roots: Sequence[Node], targets: set[Node] | None) -> dict[Node, int]:
    """Dependency counts of the nodes to run: all reachable ones, or those leading to targets."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack = [(node, False) for node in roots]
    while stack:  # iterative post-order DFS: deep graphs must not hit the recursion limit
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child in node.next_nodes if child is not None)
    useful: set[Node] = set()
    for node in order:  # children come before parents in post-order
        if (
            targets is None
            or node in targets
            or any(child in useful for child in node.next_nodes if child is not None)
        ):
            useful.add(node)
    counts: dict[Node, int] = {node: 0 for node in useful}
    for node in useful:
        for child in node.next_nodes:
            if child is not None and child in useful:
                counts[child] += 1
    return counts


def run_backward(
    outputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor],
    *,
    retain_graph: bool,
    create_graph: bool,
    capture: Sequence[Tensor] | None = None,
    accumulate: bool = True,
) -> tuple[dict[Node, Tensor], dict[int, tuple[Tensor, Tensor]]]:
    """Walk the graph from ``outputs``.

    Returns the gradient that reached each node in ``capture`` (keyed by node) and the
    gradients delivered to leaves in this pass (keyed by ``id(leaf)``: ``(leaf, grad)``).
    With ``accumulate`` the leaves' ``.grad`` is summed into; ``capture`` limits the walk to
    the part of the graph that reaches the captured tensors.
    """
    roots = [_root_node(t, index) for index, t in enumerate(outputs)]
    capture_nodes: set[Node] | None = None
    if capture is not None:
        capture_nodes = set()
        for t in capture:
            if not t.requires_grad:
                raise AutogradError(
                    f"one of the differentiated tensors (shape {tuple(t.shape)}) does not "
                    "require grad"
                )
            capture_nodes.add(_root_node(t, 0))
    counts = _needed(roots, capture_nodes)
    buffers: dict[Node, Tensor] = {}
    for node, root_grad in zip(roots, grad_outputs, strict=True):
        if node in counts:
            buffers[node] = root_grad if node not in buffers else buffers[node] + root_grad
    captured: dict[Node, Tensor] = {}
    delivered: dict[int, tuple[Tensor, Tensor]] = {}
    # newest node first, like PyTorch's sequence-number order
    ready = [(-node.sequence, node) for node in dict.fromkeys(roots) if counts.get(node, 1) == 0]
    heapq.heapify(ready)
    with set_grad_enabled(create_graph):  # the rules record a graph only for create_graph
        while ready:
            _, node = heapq.heappop(ready)
            grad = buffers.pop(node, None)
            if grad is None:
                continue
            leaf = node.variable() if isinstance(node, AccumulateGrad) else None
            hooks = leaf.grad_hooks if leaf is not None else node.tensor_hooks
            if hooks:
                grad = _call_hooks(hooks, grad)
            if node.retained is not None:
                owner = node.retained()
                if owner is not None and owner.grad_fn is node:
                    _retain_into(owner, grad, create_graph)
            if capture_nodes is not None and node in capture_nodes:
                captured[node] = grad
            if isinstance(node, AccumulateGrad):
                if leaf is not None:
                    delivered[id(leaf)] = (leaf, grad)
                    if accumulate and (capture_nodes is None or node in capture_nodes):
                        _accumulate_into(leaf, grad, create_graph)
                continue
            input_grads = node.apply(grad)
            if not retain_graph:
                node.release()
            for child, shape, child_grad in zip(
                node.next_nodes, node.input_shapes, input_grads, strict=False
            ):
                if child is None or child not in counts:
                    continue
                if child_grad is not None:
                    child_grad = sum_to_shape(child_grad, shape)
                    previous = buffers.get(child)
                    buffers[child] = child_grad if previous is None else previous + child_grad
                counts[child] -= 1
                if counts[child] == 0:
                    heapq.heappush(ready, (-child.sequence, child))
    return captured, delivered


def _call_hooks(hooks: dict[int, Hook], grad: Tensor) -> Tensor:
    """Run the tensor hooks in order; each may return a replacement of the same kind."""
    for hook in tuple(hooks.values()):  # a hook may remove itself
        replaced = hook(grad)
        if replaced is None:
            continue
        name = getattr(hook, "__qualname__", None) or repr(hook)
        if not isinstance(replaced, Tensor):
            raise InvalidArgumentTypeError(
                f"hook {name!r} returned a {type(replaced).__name__}; expected a Tensor "
                f"(shape {tuple(grad.shape)}, dtype {grad.dtype}) or None"
            )
        for what, found, expected in (
            ("shape", tuple(replaced.shape), tuple(grad.shape)),
            ("dtype", replaced.dtype, grad.dtype),
            ("device", replaced.device, grad.device),
        ):
            if found != expected:
                raise AutogradError(
                    f"hook {name!r} changed the gradient's {what}: it returned {what} "
                    f"{found}; the gradient it was given has {what} {expected}"
                )
        grad = replaced
    return grad


# ---------------------------------------------------------------------- delivering .grad
# PyTorch's gradient layout contract: a leaf's first gradient is created with the leaf's
# strides when the leaf is dense (its elements fill its memory once, in some order of
# dims), row-major otherwise; in-place accumulation then keeps that layout.
def _is_dense(array: Any) -> bool:
    """True when ``array`` covers its memory exactly once (any order of dims, no gaps)."""
    flags = array.flags
    if flags.c_contiguous or flags.f_contiguous:
        return True
    expected = array.itemsize
    for stride, size in sorted(
        (stride, size) for stride, size in zip(array.strides, array.shape, strict=True) if size != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _obeys_layout(grad: Any, like: Any | None) -> bool:
    """Whether ``grad`` already has the layout the contract asks for (``like=None``: C order)."""
    if like is None or not _is_dense(like):
        return bool(grad.flags.c_contiguous)
    if grad.flags.c_contiguous and like.flags.c_contiguous:
        return True
    return all(
        size == 1 or grad_stride == like_stride
        for size, grad_stride, like_stride in zip(
            grad.shape, grad.strides, like.strides, strict=True
        )
    )


class LayoutCopy(Function):
    """A gradient copied into a new buffer laid out as the contract asks (PyTorch's copy)."""

    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, grad: Tensor, like: Any | None) -> Any:
        xp = backend.xp_of(array_of(grad))
        if like is not None and _is_dense(like):
            out = xp.empty_like(like, dtype=grad.dtype, order="K")
        else:
            out = backend.empty(xp, grad.shape, grad.dtype)
        out[...] = array_of(grad)
        return out

    @staticmethod
    def backward(ctx: Context, grad: Tensor) -> Tensor:
        return grad


def _first_grad(grad: Tensor, like: Any | None, create_graph: bool) -> Tensor:
    """The tensor that becomes ``.grad`` when there was none (laid out like ``like``).

    With ``create_graph`` it is a copy that the graph goes through, so the caller's seed
    is never aliased. Otherwise, when ``grad`` already has the layout, a copy-on-write twin
    of it: no bytes are copied, and a write to either (the seed, the pass's ``Gradients``,
    another leaf fed by the same op) moves that one to its own buffer. Called during the
    walk, where grad mode is ``create_graph``.
    """
    if not create_graph and _obeys_layout(array_of(grad), like):
        return grad.twin()
    return LayoutCopy.apply(grad, like)


def _accumulate_into(leaf: Tensor, grad: Tensor, create_graph: bool) -> None:
    """Sum ``grad`` into a leaf's ``.grad`` (PyTorch's AccumulateGrad).

    The first gradient takes the leaf's layout. Later ones are added in place (the same
    ``.grad`` object, its layout kept, even when it has history of its own), except with
    ``create_graph``, where ``.grad`` is replaced by the recorded sum.
    """
    if grad.dtype != leaf.dtype:
        grad = grad.to(dtype=leaf.dtype)
    existing = leaf.grad
    if existing is None:
        leaf.grad = _first_grad(grad, array_of(leaf), create_graph)
    elif create_graph:
        leaf.grad = existing + grad
    else:
        existing.accumulate_(grad)


def _retain_into(tensor: Tensor, grad: Tensor, create_graph: bool) -> None:
    """Set the ``.grad`` of a non-leaf that retains it (also ``backward(inputs=[...])``).

    As in PyTorch, the first gradient is row-major and later ones replace ``.grad`` with
    the sum rather than writing into it.
    """
    if grad.dtype != tensor.dtype:
        grad = grad.to(dtype=tensor.dtype)
    existing = tensor.grad
    tensor.grad = _first_grad(grad, None, create_graph) if existing is None else existing + grad


def _seeds(outputs: tuple[Any, ...], given: Any, name: str) -> list[Any]:
    """The gradient to start from at each output: ``given``, or ones for scalar outputs."""

    seeds = as_tuple(given) if given is not None else (None,) * len(outputs)
    if len(seeds) != len(outputs):
        raise AutogradError(f"{name} has {len(seeds)} entries; there are {len(outputs)} outputs")
    prepared = []
    for out, seed in zip(outputs, seeds, strict=True):
        if seed is None:
            if out.numel() != 1:
                raise AutogradError(
                    f"grad can be implicitly created only for scalar outputs; an output has "
                    f"shape {out.shape}: pass {name}"
                )
            seed = ones_like(out)
        elif not isinstance(seed, Tensor):
            seed = Tensor(seed, dtype=out.dtype, device=out.device)
        elif seed.shape != out.shape:
            raise AutogradError(
                f"{name} entry has shape {seed.shape}; its output has shape {out.shape}"
            )
        elif seed.device != out.device:
            raise AutogradError(
                f"{name} entry is on {seed.device}; its output is on {out.device}: move it there"
            )
        prepared.append(seed)
    return prepared


def grad(
    outputs: Any,
    inputs: Any,
    grad_outputs: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool | None = None,
    materialize_grads: bool = False,
) -> tuple[Any, ...]:
    """Gradients of ``outputs`` with respect to ``inputs``, leaving every ``.grad`` untouched.

    Returns a tuple with one entry per input; an input the outputs do not depend on gives
    None with ``allow_unused=True`` (zeros with ``materialize_grads=True``) and raises
    otherwise.
    """
    if materialize_grads and allow_unused is False:
        raise ConflictingOptionsError(
            "materialize_grads=True fills unused inputs with zeros, which needs "
            "allow_unused=True (or not passed); got allow_unused=False"
        )
    outputs = as_tuple(outputs)
    inputs = as_tuple(inputs)
    if allow_unused is None:
        allow_unused = materialize_grads
    seeds = _seeds(outputs, grad_outputs, "grad_outputs")
    if retain_graph is None:
        retain_graph = create_graph
    captured, _ = run_backward(
        list(outputs),
        seeds,
        retain_graph=retain_graph,
        create_graph=create_graph,
        capture=list(inputs),
        accumulate=False,
    )
    result = []
    for index, t in enumerate(inputs):
        node = t.grad_fn if t.grad_fn is not None else leaf_node(t)
        g = captured.get(node)
        if g is None:
            if materialize_grads:
                g = zeros_like(t)
            elif not allow_unused:
                raise AutogradError(
                    f"input {index} (shape {t.shape}) was not used in the graph; pass "
                    "allow_unused=True if this is what you want"
                )
        result.append(g)
    return tuple(result)


def backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> Gradients:
    """Accumulate the gradients of ``tensors`` into the leaves' ``.grad`` (PyTorch's form).

    Returns the gradients of this pass, as ``Tensor.backward`` does.
    """
    outputs = as_tuple(tensors)
    prepared = _seeds(outputs, grad_tensors, "grad_tensors")
    if retain_graph is None:
        retain_graph = create_graph
    targets = None
    if inputs is not None:
        targets = list(as_tuple(inputs))
        if not targets:
            raise AutogradError(
                "the inputs argument to backward() cannot be empty; pass None to reach every leaf"
            )
        for t in targets:  # a non-leaf input keeps its .grad from now on, as in PyTorch
            if t.grad_fn is not None:
                t.retain_grad()
    _, delivered = run_backward(
        list(outputs),
        prepared,
        retain_graph=retain_graph,
        create_graph=create_graph,
        capture=targets,
    )
    return Gradients(delivered.values())
