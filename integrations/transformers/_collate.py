"""The training collator, noting the random generators' states before each batch it collates.

accelerate's data loader collates one batch ahead of the one it yields (to know which batch
is the last), so the first batch of a window is collated during the previous window's
prefetch: call order ``[CCCCC]ssss[CCCC]ssss`` (C a batch collated, s a training step,
brackets a window's prefetch). A collator that draws random numbers (a masked-LM collator
masks with torch's global generator) therefore gives a window's first batch from generator
states of the window before. :class:`CollateRecorder` keeps, for each batch collated and
not yet taken by a window, the states before its collate; a resume hands those states back
(:meth:`CollateRecorder.replay`), and the batches collated ahead come out as they did.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .._rng import RngStates, generators_at


class CollateRecorder:
    """Calls ``collate_fn``, noting the generators' states before each call.

    Only calls in the process that built it are noted: in a dataloader worker process the
    collator draws from the worker's own generators, which a resume does not restore (see
    docs/INTEGRATIONS.md, Limits).
    """

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn
        self._process = os.getpid()
        self._pending: deque[RngStates] = deque()  # collated, not yet taken by a window
        self._replay: deque[RngStates] = deque()  # states to collate the next batches under
        self._then: RngStates | None = None  # the state the first batch after those starts from

    def __repr__(self) -> str:
        return f"CollateRecorder({self.collate_fn!r})"

    def __call__(self, features: Any) -> Any:
        if os.getpid() != self._process:
            return self.collate_fn(features)
        if self._replay:
            state = self._replay.popleft()
            self._pending.append(state)
            with generators_at(state):  # the generators go on as they were before
                return self.collate_fn(features)
        then = self._then
        if then is not None:
            self._then = None
            then.restore()
        self._pending.append(RngStates.capture())
        return self.collate_fn(features)

    @property
    def ahead(self) -> list[RngStates]:
        """The states before the collates of the batches collated and not yet taken."""
        return list(self._pending)

    def replay(self, states: Iterable[RngStates], then: RngStates) -> None:
        """Collate the next batches under ``states`` (one each, the generators put back after
        each), and the first batch after them from ``then``.

        ``then`` is the state the window's prefetch began from: in the run that saved, the
        batches collated ahead came from the window before, and nothing else drew in between;
        a resumed loader may draw first (a sampler starting its iterator), which ``then``
        undoes. With no state to replay (a window that opens an epoch), nothing is undone.
        """
        self._replay.extend(states)
        self._then = then if self._replay else None

    def take(self, count: int) -> list[RngStates] | None:
        """The states before the collates of the next ``count`` batches yielded, oldest first;
        None when fewer were noted (the dataloader collated them elsewhere)."""
        self._replay.clear()
        self._then = None
        if len(self._pending) < count:
            self._pending.clear()
            return None
        return [self._pending.popleft() for _ in range(count)]

    def reset(self) -> None:
        """Forget the batches collated so far (a new epoch's iterator starts with none)."""
        self._pending.clear()
        self._replay.clear()
        self._then = None
