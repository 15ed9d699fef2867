"""``python -m gradvault``: the ``gradvault`` command (:mod:`gradvault.client.cli`)."""

import sys

from gradvault.client.cli import main

sys.exit(main())
