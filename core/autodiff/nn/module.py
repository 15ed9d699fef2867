"""Param and Module: parameters with ParamIds, registered by attribute assignment."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DtypeMismatchError, MissingGradientError, ShapeMismatchError
from ...records.param_id import ParamId
from .. import backend
from ..factories import tensor
from ..tensor import Tensor


class Param(Tensor):
    """A leaf tensor that requires grad, named by a ``ParamId`` (``param.id``).

    Like ``torch.nn.Parameter``, a Param is a Tensor and takes part in ops directly.
    """

    __slots__ = ("id",)

    def __init__(
        self,
        data: Any,
        *,
        id: ParamId | None = None,
        requires_grad: bool = True,
    ) -> None:
        self.init_leaf_from(data if isinstance(data, Tensor) else tensor(data))
        self.requires_grad_(requires_grad)
        self.id = id if id is not None else ParamId()

    def __repr__(self) -> str:
        return f"Param(id={self.id}, shape={self.shape}, dtype={self.dtype}, device={self.device})"


@dataclass(frozen=True)
class ParamState:
    """One parameter in a ModuleRecord: its id and a host copy of its value."""

    id: ParamId
    value: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class ModuleRecord:
    """Parameter values and ParamIds of a module, keyed by module path (``"fc1.weight"``)."""

    params: dict[str, ParamState]

    def __len__(self) -> int:
        return len(self.params)


class Module:
    """Base class of layers and models, as in PyTorch: define ``forward``, call ``module(x)``."""

    # set in __init__ through object.__setattr__ (this class's own __setattr__ files them)
    _params: dict[str, Param]
    _modules: dict[str, Module]
    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_params" not in self.__dict__:
            raise AttributeError(
                f"assign {name!r} after calling super().__init__() in {type(self).__name__}"
            )
        self._params.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Param):
            self._params[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._params.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every submodule, with their paths."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def children(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, Param]]:
        """Every Param with its module path; a Param shared by two modules appears once."""
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for path, module in modules:
            for name, param in module._params.items():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{path}.{name}" if path else name), param

    def parameters(self, recurse: bool = True) -> Iterator[Param]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def param_ids(self) -> dict[ParamId, str]:
        """Each ParamId of this module mapped to its path."""
        return {p.id: name for name, p in self.named_parameters()}

    def num_params(self) -> int:
        """Number of scalar parameters."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ state
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def to(self, device: backend.Device | str) -> Module:
        """Move every parameter (and its gradient) to ``device`` in place; returns self."""
        dev = backend.device(device)
        for p in self.parameters():
            p.move_to_(dev)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad``: to None, or to zeros in place."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    def state_record(self) -> ModuleRecord:
        """Host copies of every parameter's value with its ParamId."""
        return ModuleRecord(
            {name: ParamState(p.id, p.host_copy()) for name, p in self.named_parameters()}
        )

    def load_record(self, record: ModuleRecord, *, strict: bool = True) -> Module:
        """Load values AND ParamIds from ``record``; returns self.

        Gradients saved against the recorded ids then match this module's parameters.
        """
        params = dict(self.named_parameters())
        if strict:
            missing = sorted(set(params) - set(record.params))
            unexpected = sorted(set(record.params) - set(params))
            if missing or unexpected:
                raise MissingGradientError(
                    f"module record does not match {type(self).__name__}: missing "
                    f"{missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
                )
        for name, state in record.params.items():
            p = params.get(name)
            if p is None:
                continue
            if tuple(state.value.shape) != p.shape:
                raise ShapeMismatchError(
                    f"param {name!r} has shape {p.shape}; the record says "
                    f"{tuple(state.value.shape)}"
                )
            if state.value.dtype != p.dtype:
                raise DtypeMismatchError(
                    f"param {name!r} has dtype {p.dtype}; the record says {state.value.dtype}"
                )
            p.set_values_("load_record", backend.to_device(state.value.copy(), p.device))
            p.id = state.id
        return self

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        lines.append(")")
        return "\n".join(lines) if len(lines) > 2 else f"{type(self).__name__}({self.extra_repr()})"

    def extra_repr(self) -> str:
        return ""
