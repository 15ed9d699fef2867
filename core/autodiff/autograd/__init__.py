"""Autograd: the engine, ``grad``, grad modes, ``gradcheck`` and the functional API."""

from __future__ import annotations

from ..function import Function
from ..grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from ..gradients import Gradients
from ..graph import Context, RemovableHandle
from ..op_table import op_table
from . import functional
from .engine import backward, grad
from .gradcheck import gradcheck, gradgradcheck

op_table.register(backward)  # Tensor.backward calls it


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
