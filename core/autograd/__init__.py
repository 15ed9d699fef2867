"""Autograd: the engine, ``grad``, grad modes, ``gradcheck`` and the functional API."""

from __future__ import annotations

from typing import Any

from ..errors import AutogradError, ConflictingOptionsError
from ._arguments import as_tuple
from .engine import run_backward
from .function import Context, Function, RemovableHandle
from .grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .gradients import Gradients


def _seeds(outputs: tuple[Any, ...], given: Any, name: str) -> list[Any]:
    """The gradient to start from at each output: ``given``, or ones for scalar outputs."""
    from ..factories import ones_like
    from ..tensor import Tensor

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
    from ..factories import zeros_like

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
    from ..tensor import leaf_node

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


from . import functional  # noqa: E402
from .gradcheck import gradcheck, gradgradcheck  # noqa: E402

__all__ = [
    "Context",
    "Function",
    "Gradients",
    "RemovableHandle",
    "backward",
    "enable_grad",
    "functional",
    "grad",
    "gradcheck",
    "gradgradcheck",
    "inference_mode",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "no_grad",
    "set_grad_enabled",
]
