"""gradvault.core.records: ParamIds, records and their rules, and safetensors files.

What a snapshot holds, apart from any tensor type or store: the record of a module's
gradients (names, dtypes, shapes, bytes), the rules a record obeys, and the safetensors
file format it is exported to. It imports nothing from :mod:`gradvault.core.autodiff` or
:mod:`gradvault.core.store`; both build on it.
"""
