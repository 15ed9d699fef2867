"""``python -m gradvault.cli``: the ``gradvault`` command."""

import sys

from gradvault.cli import main

sys.exit(main())
