"""``python -m gradvault.client.cli``: the ``gradvault`` command."""

import sys

from gradvault.client.cli import main

sys.exit(main())
