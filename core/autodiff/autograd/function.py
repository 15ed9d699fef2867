"""``gradvault.core.autodiff.autograd.function``: the names PyTorch's ``torch.autograd.function``
users reach for, defined in ``core/autodiff/function.py`` and ``core/autodiff/graph.py``."""

from ..function import Function
from ..graph import AccumulateGrad, Context, Hook, Node, RemovableHandle

__all__ = ["AccumulateGrad", "Context", "Function", "Hook", "Node", "RemovableHandle"]
