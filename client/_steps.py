"""The I/O a client's logic asks for, one step at a time (the logic itself does none).

Every method of :class:`gradvault.client.Client` and :class:`gradvault.client.AsyncClient`
is one generator of :class:`~gradvault.client._base.BaseClient` (written once): it yields
a step, the client performs it (blocking, or awaited) and sends back the outcome, or throws
back the exception it raised, so the logic's own ``try``/``except``/``finally`` see it
exactly where the I/O happened. A client adds only :meth:`perform` for each step and the
loop that drives the generator; retries, resumption, verification and retention are
decided in one place for both.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import httpx

from gradvault.core import GradientsParams

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """Send ``request``; the answer (its body left unread when ``stream``)."""

    request: httpx.Request
    stream: bool


@dataclass(frozen=True)
class Discard:
    """Read an error answer's body (for its message) and close the answer."""

    response: httpx.Response


@dataclass(frozen=True)
class Close:
    """Close a streamed answer, whatever is left of its body unread."""

    response: httpx.Response


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` before the next try (through the client's ``_sleep``)."""

    seconds: float


@dataclass(frozen=True)
class Receive:
    """Write a streamed answer's body to ``file`` piece by piece, telling ``moved(count)``
    after each piece is written."""

    response: httpx.Response
    file: BinaryIO
    moved: Callable[[int], None]


@dataclass(frozen=True)
class Blocking:
    """Call ``function(*args)``, which touches files or the CPU at length; its result.

    The blocking client calls it; the asyncio client runs it in a thread.
    """

    function: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Capture:
    """Take a snapshot record of ``grads`` (``try_to_record``; ``to_record_async`` in the
    asyncio client, whose device reads run in a thread)."""

    grads: GradientsParams


Step = Send | Discard | Close | Sleep | Receive | Blocking | Capture
#: A client's logic: yields steps, is sent each step's outcome, returns the method's result.
Steps = Generator[Step, Any, T]
