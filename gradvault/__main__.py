"""``python -m gradvault``: the ``gradvault`` command (:mod:`gradvault.cli`)."""

import sys

from gradvault.cli import main

sys.exit(main())
