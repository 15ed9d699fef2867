"""What the integrations need of the other processes of a run: one agreement per micro-batch.

With one process (``torch.distributed`` not initialized, or a world of one) nothing is
exchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def several_processes() -> bool:
    """Whether this process trains with others in the default process group."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flag: bool, device: Any = "cpu") -> bool:
    """Whether ``flag`` is true on any rank of the default group (collective when there
    are several: every rank calls it at the same point, with ``device`` one its backend
    reduces on, cuda for NCCL)."""
    if not several_processes():
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


__all__ = ["any_rank", "several_processes"]
