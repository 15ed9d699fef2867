"""The store a collective call writes to or reads from, named as the rest of gradvault names it.

A service URL is refused: the service takes a snapshot whole in one upload and has no
upload of one rank's shard, so ranks cannot commit one snapshot through it.
"""

from __future__ import annotations

import os

from gradvault.client import Target
from gradvault.core.errors import UnsupportedSetupError


def store_location(target: Target | str | os.PathLike[str]) -> str:
    """The store's path or URL; UnsupportedSetupError for a service URL."""
    where = Target.of(target)
    if where.is_service:
        raise UnsupportedSetupError(
            f"{where.location} is a service URL; the service has no upload of one rank's "
            "shard, so a collective snapshot or restore needs the store itself: a folder "
            "every rank sees, or an s3:// URL (the service lists and serves what the ranks "
            "commit there)"
        )
    return where.location
