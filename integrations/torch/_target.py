"""Where a collective call writes or reads: a store, or the service, named as the rest of
gradvault names them (:class:`gradvault.client.Target`).

A store is opened by each rank with ``store_options``; the service is reached with a
token (``token=``, else ``$GRADVAULT_TOKEN``), and store options mean nothing to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gradvault.client import Target
from gradvault.core.errors import InvalidArgumentError


def call_target(
    target: Target | str | os.PathLike[str],
    token: str | None,
    store_options: Mapping[str, Any] | None,
) -> tuple[Target, dict[str, Any]]:
    """The call's target and its store options; InvalidArgumentError for store options
    given with a service URL (the service opens its own store)."""
    where = Target.of(target, token)
    options = dict(store_options or {})
    if where.is_service and options:
        raise InvalidArgumentError(
            f"store_options are for a store this process opens; {where.location} is a "
            "service URL, which opens its own store"
        )
    return where, options
