"""gradvault.integrations: gradvault inside other training frameworks.

Each integration is a subpackage with an extra of its own (``gradvault[hf]`` for
:mod:`gradvault.integrations.transformers`); docs/INTEGRATIONS.md describes them.
"""
