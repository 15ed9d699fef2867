"""The ranks of one collective call, and the steps they take together, each bounded in time.

Every collective step of a snapshot or a restore is an :meth:`Ranks.exchange`: a
``monitored_barrier`` with the call's timeout (a rank that is dead, or has not reached
the step, is named in a :class:`DistributedSnapshotError` on every rank that is there,
instead of a hang), then an all-gather of each rank's small JSON status (no pickle: the
text travels as bytes in tensors). A rank that failed its part of a step says so in its
status, and every rank then raises: all ranks leave a call the same way.

``monitored_barrier`` is gloo's: a group of another backend (NCCL) gets a gloo group of
the same ranks for these steps, made once per group on its first call (``new_group`` is
collective over the default group, which a call on the default group satisfies).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import torch
import torch.distributed as dist

from gradvault.core.errors import DistributedSnapshotError, InvalidArgumentError

#: How long a rank waits at a step for the others (seconds), unless the call says.
DEFAULT_TIMEOUT_SECONDS = 600.0

#: per group of another backend, the gloo group of its ranks that the steps run on
_CONTROL_GROUPS: dict[Any, Any] = {}


class Ranks:
    """This process's place in the group of a collective call: ``rank`` of ``world_size``.

    A process without ``torch.distributed`` initialized (and no ``group``) is rank 0 of 1,
    and its steps exchange nothing.
    """

    def __init__(self, group: Any, rank: int, world_size: int, timeout: float) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self._control = None if group is None else _control_group(group)

    @classmethod
    def of(cls, group: Any, timeout: float) -> Ranks:
        """The ranks of ``group`` (None: the default process group, or this process alone)."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise InvalidArgumentError(f"timeout must be a number of seconds > 0; got {timeout!r}")
        initialized = dist.is_available() and dist.is_initialized()
        if group is None and not initialized:
            return cls(None, 0, 1, float(timeout))
        if not initialized:
            raise InvalidArgumentError(
                "a group was given but torch.distributed is not initialized in this process "
                "(call torch.distributed.init_process_group first)"
            )
        group = dist.group.WORLD if group is None else group
        rank = dist.get_rank(group)
        if rank < 0:
            raise InvalidArgumentError(
                f"this process (global rank {dist.get_rank()}) is not in the group given"
            )
        return cls(group, rank, dist.get_world_size(group), float(timeout))

    def exchange(self, step: str, status: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``status`` (JSON), in rank order, once every rank has reached ``step``.

        Raises DistributedSnapshotError if a rank does not arrive within the timeout or
        leaves the group while the statuses travel.
        """
        if self._control is None or self.world_size == 1:
            return [status]
        try:
            dist.monitored_barrier(
                group=self._control,
                timeout=datetime.timedelta(seconds=self.timeout),
                wait_all_ranks=True,
            )
            return [json.loads(text) for text in self._all_gather_text(json.dumps(status))]
        except RuntimeError as error:  # gloo's errors (DistBackendError is one)
            raise DistributedSnapshotError(
                f"rank {self.rank} of {self.world_size}: not every rank reached {step} within "
                f"{self.timeout:g} s, or one left the group on the way: {_first_line(error)}"
            ) from error

    def _all_gather_text(self, text: str) -> list[str]:
        data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(lengths, torch.tensor([data.numel()]), group=self._control)
        longest = max(int(length.item()) for length in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded, group=self._control)
        return [
            bytes(piece[: int(length.item())].tolist()).decode("utf-8")
            for piece, length in zip(gathered, lengths, strict=True)
        ]

    def agree(self, step: str, error: BaseException | None, **status: Any) -> list[dict[str, Any]]:
        """Every rank's ``status`` after ``step``; raises on every rank if one failed it.

        The rank whose ``error`` it was re-raises it; the others raise
        DistributedSnapshotError quoting each failed rank's message.
        """
        mine = {"error": None if error is None else f"{type(error).__name__}: {error}", **status}
        statuses = self.exchange(step, mine)
        failed = [(rank, found["error"]) for rank, found in enumerate(statuses) if found["error"]]
        if error is not None:
            raise error
        if failed:
            quoted = "; ".join(f"rank {rank}: {message}" for rank, message in failed)
            raise DistributedSnapshotError(
                f"{step} failed on {len(failed)} of {self.world_size} ranks ({quoted})"
            )
        return statuses


def _control_group(group: Any) -> Any:
    """The gloo group the steps of ``group`` run on: ``group`` itself if it is gloo."""
    if dist.get_backend(group) == "gloo":
        return group
    control = _CONTROL_GROUPS.get(group)
    if control is None:
        control = dist.new_group(ranks=dist.get_process_group_ranks(group), backend="gloo")
        _CONTROL_GROUPS[group] = control
    return control


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " / ".join(lines[:3]) if lines else type(error).__name__
