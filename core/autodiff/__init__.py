"""gradvault.core.autodiff: tensors, their graph and autograd engine, ops, modules and optimizers.

PyTorch's autograd semantics on NumPy (CPU) and CuPy (GPU). It builds on
:mod:`gradvault.core.records` (ParamIds and records) and knows nothing of the store. The
public names are re-exported by :mod:`gradvault.core`; the layers inside are drawn in
docs/ARCHITECTURE.md.
"""
