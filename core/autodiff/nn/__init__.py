"""Modules with ParamIds: Module, Param and the layers."""

from .layers import GELU, MLP, Dropout, Embedding, LayerNorm, Linear, ReLU, Sequential, Tanh
from .module import Module, ModuleRecord, Param, ParamState

__all__ = [
    "GELU",
    "MLP",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleRecord",
    "Param",
    "ParamState",
    "ReLU",
    "Sequential",
    "Tanh",
]
