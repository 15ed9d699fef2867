"""Layers: Linear, Embedding, LayerNorm, Dropout, Sequential and MLP, with PyTorch's arguments."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from .. import ops
from ..factories import generator, ones, zeros
from ..tensor import DeviceLike, DTypeLike, Tensor, as_dtype, wrap
from .module import Module, Param


def _uniform(shape: tuple[int, ...], bound: float, dtype: DTypeLike, device: DeviceLike) -> Param:
    data = generator().uniform(-bound, bound, size=shape).astype(as_dtype(dtype) or np.float32)
    return Param(wrap(data).to(device) if device else wrap(data))


class Linear(Module):
    """``y = x @ weight.T + bias``; weight (out_features, in_features), PyTorch's init."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        dtype: DTypeLike = None,
        device: DeviceLike = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound, dtype, device)
        self.bias = _uniform((out_features,), bound, dtype, device) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim`` (N(0, 1) init)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        dtype: DTypeLike = None,
        device: DeviceLike = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        data = generator().standard_normal((num_embeddings, embedding_dim))
        self.weight = Param(wrap(data.astype(as_dtype(dtype) or np.float32)).to(device or "cpu"))

    def forward(self, indices: Tensor) -> Tensor:
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentTypeError(f"Embedding needs integer indices; got {indices.dtype}")
        return self.weight[indices]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise over the last dims, then scale and shift (PyTorch's LayerNorm)."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        dtype: DTypeLike = None,
        device: DeviceLike = None,
    ) -> None:
        super().__init__()
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.normalized_shape, self.eps = shape, eps
        self.weight = Param(ones(shape, dtype=dtype, device=device)) if elementwise_affine else None
        self.bias = (
            Param(zeros(shape, dtype=dtype, device=device)) if elementwise_affine and bias else None
        )

    def forward(self, x: Tensor) -> Tensor:
        dims = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        centered = x - ops.mean(x, dims, keepdim=True)
        variance = ops.mean(centered * centered, dims, keepdim=True)
        out = centered / (variance + self.eps).sqrt()
        if self.weight is not None:
            out = out * self.weight
        if self.bias is not None:
            out = out + self.bias
        return out


class Dropout(Module):
    """Zero elements with probability ``p`` while training, scaling the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise InvalidArgumentError(f"dropout probability must be in [0, 1]; got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if self.p == 1:
            return x * 0
        keep = generator().random(x.shape) >= self.p
        mask = (keep / (1 - self.p)).astype(x.dtype)
        return x * wrap(mask).to(x.device)


class Sequential(Module):
    """Modules applied in order; they are named "0", "1", ..."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for index, module in enumerate(modules):
            setattr(self, str(index), module)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]


class _Activation(Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: Tensor) -> Tensor:
        return getattr(ops, self.name)(x)

    def __repr__(self) -> str:
        return f"{self.name.upper() if self.name == 'relu' else self.name.capitalize()}()"


def ReLU() -> Module:  # PyTorch's class name
    return _Activation("relu")


def GELU() -> Module:
    return _Activation("gelu")


def Tanh() -> Module:
    return _Activation("tanh")


class MLP(Module):
    """Linear layers with an activation between them: in -> hidden... -> out."""

    def __init__(
        self,
        in_features: int,
        hidden_features: Sequence[int],
        out_features: int,
        activation: str = "relu",
        dropout: float = 0.0,
        *,
        dtype: DTypeLike = None,
        device: DeviceLike = None,
    ) -> None:
        super().__init__()
        sizes = [in_features, *hidden_features, out_features]
        layers: list[Module] = []
        for index, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
            layers.append(Linear(n_in, n_out, dtype=dtype, device=device))
            if index < len(sizes) - 2:
                layers.append(_Activation(activation))
                if dropout:
                    layers.append(Dropout(dropout))
        self.layers = Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
