"""gradvault.client.cli: the ``gradvault`` command (``python -m gradvault`` runs it too).

``main(argv)`` runs one command line and returns its exit status: 0 done, 1 failed,
2 a usage error. docs/CLI.md describes every command.
"""

from .main import main

__all__ = ["main"]
