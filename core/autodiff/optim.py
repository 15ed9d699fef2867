"""Optimizers stepping with GradientsParams, as in Burn: ``optimizer.step(lr, module, grads)``.

The update rules follow PyTorch's ``SGD``, ``Adam`` and ``AdamW`` (same formulas, same
order of operations); state is keyed by ParamId and recordable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ..errors import ParamIdMismatchError, ShapeMismatchError
from ..records.param_id import ParamId
from . import backend
from .gradients_params import GradientsParams
from .nn.module import Module
from .tensor import array_of

M = TypeVar("M", bound=Module)


@dataclass(frozen=True)
class OptimizerRecord:
    """Optimizer state: hyperparameters and, per ParamId, named host arrays and a step count."""

    kind: str
    hyperparameters: dict[str, Any]
    state: dict[ParamId, dict[str, np.ndarray]] = field(repr=False)
    steps: dict[ParamId, int] = field(repr=False)


class Optimizer:
    """Base: per-ParamId state, ``step``, ``state_record`` and ``load_record``."""

    kind = "optimizer"

    def __init__(self) -> None:
        self._state: dict[ParamId, dict[str, Any]] = {}
        self._steps: dict[ParamId, int] = {}

    def hyperparameters(self) -> dict[str, Any]:
        raise NotImplementedError

    def _update(self, lr: float, p: Any, grad: Any, state: dict[str, Any], step: int) -> None:
        raise NotImplementedError

    def step(self, lr: float, module: M, grads: GradientsParams) -> M:
        """Update ``module``'s parameters in place from ``grads``; returns the module."""
        for name, param in module.named_parameters():
            grad = grads.get(param.id)
            if grad is None:
                continue
            if grad.shape != param.shape:
                raise ShapeMismatchError(
                    f"gradient for param {param.id} ({name!r}) has shape {grad.shape}; the "
                    f"parameter has {param.shape}"
                )
            g = (
                array_of(grad)
                if grad.device == param.device
                else backend.to_device(array_of(grad), param.device)
            )
            if g.dtype != param.dtype:
                g = g.astype(param.dtype)
            state = self._state.setdefault(param.id, {})
            step = self._steps.get(param.id, 0) + 1
            self._steps[param.id] = step
            with param.writable("optimizer.step") as values:
                self._update(lr, values, g, state, step)
        return module

    def state_record(self) -> OptimizerRecord:
        """Host copies of the state, keyed by ParamId."""
        return OptimizerRecord(
            self.kind,
            self.hyperparameters(),
            {
                pid: {k: backend.to_host(v).copy() for k, v in s.items()}
                for pid, s in self._state.items()
            },
            dict(self._steps),
        )

    def load_record(self, record: OptimizerRecord, module: Module | None = None) -> Optimizer:
        """Restore state from ``record``; with ``module``, every id must be one of its params."""
        if record.kind != self.kind:
            raise ParamIdMismatchError(
                f"optimizer record is for {record.kind}; this optimizer is {self.kind}"
            )
        devices: dict[ParamId, backend.Device] = {}
        if module is not None:
            devices = {p.id: p.device for p in module.parameters()}
            unknown = [str(pid) for pid in record.state if pid not in devices]
            if unknown:
                raise ParamIdMismatchError(
                    f"optimizer state for params {unknown[:5]} matches no parameter of the "
                    "module; load the model record first"
                )
        self._state = {
            pid: {
                k: backend.to_device(v.copy(), devices.get(pid, backend.CPU)) for k, v in s.items()
            }
            for pid, s in record.state.items()
        }
        self._steps = dict(record.steps)
        return self


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and weight decay (PyTorch's rule)."""

    kind = "sgd"

    def __init__(
        self,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__()
        self.momentum, self.weight_decay = momentum, weight_decay
        self.dampening, self.nesterov = dampening, nesterov

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "dampening": self.dampening,
            "nesterov": self.nesterov,
        }

    def _update(self, lr: float, p: Any, grad: Any, state: dict[str, Any], step: int) -> None:
        if self.weight_decay:
            grad = grad + self.weight_decay * p
        if self.momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = grad.copy()
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * grad
            state["momentum_buffer"] = buf
            grad = grad + self.momentum * buf if self.nesterov else buf
        p -= lr * grad


class Adam(Optimizer):
    """Adam (L2 weight decay added to the gradient), PyTorch's formulation."""

    kind = "adam"
    decoupled = False

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay

    def hyperparameters(self) -> dict[str, Any]:
        return {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def _update(self, lr: float, p: Any, grad: Any, state: dict[str, Any], step: int) -> None:
        xp = backend.xp_of(p)
        beta1, beta2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                p *= 1 - lr * self.weight_decay
            else:
                grad = grad + self.weight_decay * p
        m = state.setdefault("exp_avg", xp.zeros_like(p))
        v = state.setdefault("exp_avg_sq", xp.zeros_like(p))
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * grad * grad
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        denom = xp.sqrt(v) / math.sqrt(bias_correction2) + self.eps
        p -= (lr / bias_correction1) * (m / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as in PyTorch)."""

    kind = "adamw"
    decoupled = True

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(betas, eps, weight_decay)
