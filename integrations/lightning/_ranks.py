"""What the callback needs of the other processes: every rank's value of something.

With one process (no process group, or a group of one) nothing is exchanged.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def gather_from_ranks(trainer: Any, value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), by rank; collective when there are several."""
    if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


__all__ = ["gather_from_ranks"]
