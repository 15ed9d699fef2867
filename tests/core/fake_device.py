"""A fake device for the streamed device-to-host path: NumPy arrays play device buffers.

Its copies land only when their event is waited for (as an asynchronous copy completes
some time after it is issued), and it records every operation, so the tests see the
order in which slots are filled, waited for, handed over and reused.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class FakeDevice:
    """A DeviceCopier whose copies land only when waited for; it logs what happens.

    Each ``("copy", event, offset, length, slot address, source id)`` and ``("wait",
    event)`` is logged; ``peak_in_flight`` is the most copies ever issued and not yet
    waited for. ``fail_at`` (a source's ``id`` and a byte offset) makes the wait for the
    copy holding that byte raise RuntimeError, as a failed device copy would.
    """

    def __init__(self, fail_at: tuple[int, int] | None = None) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.allocated = 0
        self.peak_in_flight = 0
        self.fail_at = fail_at
        self._pending: dict[int, tuple[np.ndarray, int, int, memoryview]] = {}
        self._next_event = 0

    def pinned(self, nbytes: int) -> memoryview:
        self.allocated += nbytes
        return memoryview(np.full(nbytes, 0xEE, np.uint8))

    def copy_async(self, source: Any, offset: int, length: int, target: memoryview) -> int:
        event = self._next_event
        self._next_event += 1
        self._pending[event] = (source, offset, length, target)
        self.peak_in_flight = max(self.peak_in_flight, len(self._pending))
        self.log.append(("copy", event, offset, length, address_of(target), id(source)))
        return event

    def wait(self, event: int) -> None:
        source, offset, length, target = self._pending.pop(event)
        self.log.append(("wait", event))
        if self.fail_at is not None:
            source_id, failing_byte = self.fail_at
            if source_id == id(source) and offset <= failing_byte < offset + length:
                raise RuntimeError(f"device copy failed (fake fault at byte {failing_byte})")
        target[:] = (
            np.ascontiguousarray(source).reshape(-1).view(np.uint8)[offset : offset + length]
        )

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def copies_of(self, source: Any) -> list[tuple[int, int]]:
        """``(offset, length)`` of every copy of ``source``, in the order they were issued."""
        return [(e[2], e[3]) for e in self.log if e[0] == "copy" and e[5] == id(source)]


def address_of(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)
