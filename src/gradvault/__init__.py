"""gradvault: async gradient snapshot and restore.

The package's parts live in folders at the repository's root and are linked here, so
that the installed package (editable or not) is one plain folder tree that Python and
static tools follow alike: :mod:`gradvault.core` (autodiff, records, the store and the
recorder), :mod:`gradvault.service` (the HTTP service), :mod:`gradvault.client` (the
clients and the ``gradvault`` command) and :mod:`gradvault.integrations` (trainers).
Importing this package imports none of them.
"""
