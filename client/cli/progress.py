"""Progress bars for transfers: shown once a transfer has taken a second, on a terminal only.

A :class:`TransferProgress` is the ``progress=(done_bytes, total_bytes | None)`` callback
that the clients and the store reads call as bytes move. It draws nothing until the
transfer has lasted :data:`DELAY_SECONDS` (short transfers stay quiet) and nothing at all
when stdout is not a terminal (scripts and logs get no control characters). The bar is
rich's (the ``cli`` extra); without rich installed, transfers run without one.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: A transfer shorter than this never shows a bar.
DELAY_SECONDS = 1.0


class TransferProgress:
    """A bar for one transfer described by ``description``; use it as a context manager.

    ``enabled`` defaults to whether stdout is a terminal; ``console`` is the rich console
    drawn on (default: stdout's).
    """

    def __init__(
        self,
        description: str,
        *,
        enabled: bool | None = None,
        delay: float = DELAY_SECONDS,
        console: Any = None,
    ) -> None:
        self.description = description
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self.delay = delay
        self.console = console
        self._started = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int | None) -> None:
        """Record that ``done`` of ``total`` bytes (None: not known) have moved."""
        if not self.enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._started < self.delay:
                return
            self._bar = _new_bar(self.console)
            if self._bar is None:
                self.enabled = False
                return
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=total)
        self._bar.update(self._task, completed=done, total=total)

    @property
    def shown(self) -> bool:
        """Whether a bar has been drawn."""
        return self._bar is not None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __enter__(self) -> TransferProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _new_bar(console: Any) -> Any:
    try:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
    except ImportError:
        return None
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
