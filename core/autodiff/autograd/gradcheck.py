"""Numerical checks of analytic gradients: ``gradcheck`` and ``gradgradcheck`` (float64)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import AutogradError, GradcheckError
from ...records.dtypes import is_floating
from .. import backend
from ..factories import zeros_like
from ..grad_mode import enable_grad
from ..tensor import Tensor, array_of, float64, wrap
from ._arguments import as_tuple
from .engine import grad


def _prepare(inputs: Any) -> tuple[Any, ...]:
    prepared = []
    for t in as_tuple(inputs):
        if isinstance(t, Tensor) and is_floating(t.dtype):  # bfloat16 too: checked in float64
            # C-contiguous, so that perturbing the flat view perturbs the input itself
            xp = backend.xp_of(array_of(t))
            copy = wrap(xp.array(array_of(t), dtype=float64, order="C", copy=True))
            copy.requires_grad_(t.requires_grad)
            prepared.append(copy)
        else:
            prepared.append(t)
    return tuple(prepared)


def _flat_outputs(fn: Callable[..., Any], inputs: tuple[Any, ...]) -> list[Any]:
    return [o for o in as_tuple(fn(*inputs)) if isinstance(o, Tensor) and o.dtype.kind == "f"]


def _numerical(
    fn: Callable[..., Any], inputs: tuple[Any, ...], index: int, eps: float, out_sizes: list[int]
) -> np.ndarray:
    t = inputs[index]
    jac = np.zeros((t.numel(), sum(out_sizes)))
    for j in range(t.numel()):
        original = array_of(t).reshape(-1)[j].item()
        values = []
        for delta in (eps, -eps):
            with t.writable("gradcheck") as flat:  # C-contiguous: reshape is a view
                flat.reshape(-1)[j] = original + delta
            outs = _flat_outputs(fn, inputs)
            values.append(
                np.concatenate(
                    [backend.to_host(array_of(o)).reshape(-1).astype(np.float64) for o in outs]
                )
                if outs
                else np.zeros(0)
            )
        with t.writable("gradcheck") as flat:
            flat.reshape(-1)[j] = original
        jac[j] = (values[0] - values[1]) / (2 * eps)
    return jac


def _analytic(
    fn: Callable[..., Any], inputs: tuple[Any, ...], diff_indices: list[int]
) -> tuple[list[np.ndarray], list[int]]:
    with enable_grad():
        outs = _flat_outputs(fn, inputs)
    sizes = [o.numel() for o in outs]
    jacs = [np.zeros((inputs[i].numel(), sum(sizes))) for i in diff_indices]
    column = 0
    for o in outs:
        for k in range(o.numel()):
            if o.requires_grad:
                one_hot = backend.xp_of(array_of(o)).zeros(o.numel(), dtype=o.dtype)
                one_hot[k] = 1
                seed = wrap(one_hot.reshape(o.shape))
                grads = grad(
                    o, [inputs[i] for i in diff_indices], seed, retain_graph=True, allow_unused=True
                )
                for jac, g in zip(jacs, grads, strict=True):
                    if g is not None:
                        jac[:, column] = backend.to_host(array_of(g)).reshape(-1)
            column += 1
    return jacs, sizes


def gradcheck(
    fn: Callable[..., Any],
    inputs: Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    check_second_order: bool = False,
) -> bool:
    """True when ``fn``'s analytic gradients match central finite differences in float64.

    Floating inputs are copied to float64 first; only inputs with ``requires_grad`` are
    checked. With ``check_second_order`` the gradients' own gradients are checked too
    (``gradgradcheck``). A mismatch raises ``GradcheckError`` naming the input and the worst
    element, or returns False when ``raise_exception=False``.
    """
    inputs = _prepare(inputs)
    diff_indices = [i for i, t in enumerate(inputs) if getattr(t, "requires_grad", False)]
    if not diff_indices:
        raise AutogradError("gradcheck needs at least one input with requires_grad=True")
    analytic, sizes = _analytic(fn, inputs, diff_indices)
    for jac, i in zip(analytic, diff_indices, strict=True):
        numeric = _numerical(fn, inputs, i, eps, sizes)
        if not np.allclose(jac, numeric, rtol=rtol, atol=atol, equal_nan=True):
            worst = np.unravel_index(np.nanargmax(np.abs(jac - numeric)), jac.shape)
            message = (
                f"gradient of input {i} (shape {inputs[i].shape}) disagrees with finite "
                f"differences: at (input element, output element) {tuple(map(int, worst))} "
                f"analytic {jac[worst]:.10g}, numerical {numeric[worst]:.10g}"
            )
            if raise_exception:
                raise GradcheckError(message)
            return False
    if check_second_order:
        return gradgradcheck(
            fn, inputs, eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception
        )
    return True


def gradgradcheck(
    fn: Callable[..., Any],
    inputs: Any,
    grad_outputs: Any = None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    seed: int = 0,
) -> bool:
    """``gradcheck`` of the vector-Jacobian product of ``fn`` (second-order gradients)."""

    inputs = _prepare(inputs)
    diff = [t for t in inputs if getattr(t, "requires_grad", False)]
    with enable_grad():
        outs = _flat_outputs(fn, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(seed)
        grad_outputs = tuple(
            Tensor(rng.standard_normal(o.shape), dtype=float64, device=o.device).requires_grad_()
            for o in outs
        )
    grad_outputs = _prepare(grad_outputs)
    count = len(inputs)

    def first_derivative(*args: Any) -> tuple[Any, ...]:
        with enable_grad():
            values = _flat_outputs(fn, args[:count])
            kept = [(o, v) for o, v in zip(values, args[count:], strict=True) if o.requires_grad]
            targets = [t for t in args[:count] if getattr(t, "requires_grad", False)]
            if not kept:
                return tuple(zeros_like(t) for t in targets)
            grads = grad(
                [o for o, _ in kept],
                targets,
                [v for _, v in kept],
                create_graph=True,
                allow_unused=True,
            )
        return tuple(
            g if g is not None else zeros_like(t) for g, t in zip(grads, targets, strict=True)
        )

    del diff
    return gradcheck(
        first_derivative,
        inputs + tuple(grad_outputs),
        eps=eps,
        atol=atol,
        rtol=rtol,
        raise_exception=raise_exception,
    )
