"""The graph walk: one engine for ``backward`` and ``autograd.grad``.

The rules live with their ops (``Function.backward``); this module only orders the nodes,
sums the gradients arriving at each one, undoes broadcasting (``sum_to_shape``, the one
place that does it), runs hooks, frees the graph and delivers gradients to leaves.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import AutogradError
from .function import AccumulateGrad, Node
from .grad_mode import _state

if TYPE_CHECKING:
    from ..tensor import Tensor


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


def _root_node(tensor: Tensor) -> Node:
    from ..tensor import _leaf_node  # noqa: PLC0415

    if not tensor.requires_grad:
        raise AutogradError(
            "element 0 of tensors does not require grad and does not have a grad_fn"
        )
    return tensor.grad_fn if tensor.grad_fn is not None else _leaf_node(tensor)


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
    roots = [_root_node(t) for t in outputs]
    capture_nodes: set[Node] | None = None
    if capture is not None:
        capture_nodes = set()
        for t in capture:
            if not t.requires_grad:
                raise AutogradError(
                    f"one of the differentiated tensors (shape {tuple(t.shape)}) does not "
                    "require grad"
                )
            capture_nodes.add(_root_node(t))
    counts = _needed(roots, capture_nodes)
    buffers: dict[Node, Tensor] = {}
    for node, grad in zip(roots, grad_outputs, strict=True):
        if node in counts:
            buffers[node] = grad if node not in buffers else buffers[node] + grad
    captured: dict[Node, Tensor] = {}
    delivered: dict[int, tuple[Tensor, Tensor]] = {}
    # newest node first, like PyTorch's sequence-number order
    ready = [(-node.sequence, node) for node in dict.fromkeys(roots) if counts.get(node, 1) == 0]
    heapq.heapify(ready)
    saved_mode = _state.grad_enabled
    _state.grad_enabled = create_graph
    try:
        while ready:
            _, node = heapq.heappop(ready)
            grad = buffers.pop(node, None)
            if grad is None:
                continue
            leaf = node.variable() if isinstance(node, AccumulateGrad) else None
            for hook in leaf._hooks if leaf is not None else node.tensor_hooks:
                replaced = hook(grad)
                if replaced is not None:
                    grad = replaced
            if node.retained is not None:
                owner = node.retained()
                if owner is not None and owner.grad_fn is node:
                    _accumulate_into(owner, grad, create_graph)
            if capture_nodes is not None and node in capture_nodes:
                captured[node] = grad
            if isinstance(node, AccumulateGrad):
                if leaf is not None:
                    delivered[id(leaf)] = (leaf, grad)
                    if accumulate and (capture is None or node in capture_nodes):
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
    finally:
        _state.grad_enabled = saved_mode
    return captured, delivered


def _accumulate_into(tensor: Tensor, grad: Tensor, create_graph: bool) -> None:
    """Sum ``grad`` into ``tensor.grad`` (PyTorch's AccumulateGrad).

    The first gradient is stored without a copy where it can be: its buffer may also be
    the caller's seed, another leaf's gradient or what this pass returns, so ``.grad`` is
    a copy-on-write twin of it (``Tensor._twin``: a copy when views or arrays of it are out,
    or when it is a broadcast); the first write to either moves that one to its own buffer.
    """
    if grad.dtype != tensor.dtype:
        grad = grad.to(dtype=tensor.dtype)
    existing = tensor.grad
    if existing is None:
        # with create_graph, .grad is the gradient itself: it carries the graph
        tensor._grad = grad if create_graph else grad._twin()
    elif create_graph or existing.requires_grad:
        tensor._grad = existing + grad
    else:
        existing._accumulate_(grad._data)
