"""The soak's traffic (``bench.soak``): the attackers, the pushers, the legitimate client.

Everything goes to 127.0.0.1 only, every connection has a timeout, and each kind stops at
the soak's deadline. Each kind counts its outcomes in a :class:`Tally`: an answer's
status, or what happened instead ("reset by the service", "timeout", ...).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import ssl
import string
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

import gradvault.core as gv
from gradvault.client import Client
from gradvault.core.records.safetensors_file import safetensors_chunks

HOST = "127.0.0.1"
MIB = 1 << 20
CONNECT_SECONDS = 10
#: how long a request whose whole request was sent waits for its answer
ANSWER_SECONDS = 30
#: how long a login whose body is declared but never sent waits for an answer
UNSENT_BODY_SECONDS = 10
#: how long after the deadline a request in flight may take before it is cancelled
DRAIN_SECONDS = 2
#: the range of a made-up method's length, in characters
METHOD_LENGTHS = (1000, 4000)
#: made-up method requests in flight at most
METHOD_WORKERS = 4
LOGIN_CHUNK = 1 * MIB
LOGIN_KINDS = ("declared", "chunked", "unsent")
#: the legitimate client's snapshot: 4 gradients of 16 Ki float32 (256 KiB)
LEGITIMATE_GRADIENTS, LEGITIMATE_FLOATS = 4, 16 << 10
#: a pusher's snapshot: 2 gradients of 1 Ki float32 (8 KiB)
PUSHER_GRADIENTS, PUSHER_FLOATS = 2, 1 << 10


@dataclass
class Tally:
    """What happened to one kind of traffic: a count per outcome, and a few figures."""

    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def as_json(self, **about: Any) -> dict[str, Any]:
        return {
            **about,
            **self.figures,
            "total": sum(self.outcomes.values()),
            "outcomes": dict(self.outcomes.most_common()),
        }


def _failure(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionResetError | BrokenPipeError):
        return "reset by the service"
    if isinstance(error, asyncio.IncompleteReadError):
        return "closed without an answer"
    return type(error).__name__


def _status(line: bytes) -> str:
    """``'413'`` from ``b'HTTP/1.1 413 Request Entity Too Large'``."""
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return parts[1].decode()
    return "closed without an answer" if not line else "not HTTP"


async def _pause(seconds: float, deadline: float) -> None:
    """Sleep ``seconds``, but never past ``deadline``."""
    await asyncio.sleep(max(0.0, min(seconds, deadline - time.monotonic())))


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(HOST, port), CONNECT_SECONDS)


def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()  # not awaited: a peer that never reads must not hold us


# --------------------------------------------------------------------------- attackers
@dataclass
class SlowHeaders:
    """Connections that send half a request line and hold it; opened again once closed."""

    port: int
    deadline: float
    tally: Tally = field(default_factory=Tally)
    held_now: int = 0
    held_most: int = 0
    #: seconds each connection the service closed had been held
    hold_seconds: list[float] = field(default_factory=list)

    async def connection(self, delay: float) -> None:
        await asyncio.sleep(delay)  # the connections open over the first seconds
        while time.monotonic() < self.deadline:
            try:
                reader, writer = await _connect(self.port)
            except (OSError, TimeoutError) as error:
                self.tally.add(f"connect failed: {_failure(error)}")
                await _pause(1, self.deadline)
                continue
            opened = time.monotonic()
            self.held_now += 1
            self.held_most = max(self.held_most, self.held_now)
            try:
                writer.write(b"GET /v1/snapshots HTT")
                await writer.drain()
                answer = await asyncio.wait_for(
                    reader.read(4096), max(0.0, self.deadline - time.monotonic())
                )
                self.hold_seconds.append(time.monotonic() - opened)
                self.tally.add(
                    "closed by the service" if not answer else f"answered {_status(answer)}"
                )
            except TimeoutError:
                self.tally.add("held to the end")
            except OSError as error:
                self.hold_seconds.append(time.monotonic() - opened)
                self.tally.add(_failure(error))
            finally:
                self.held_now -= 1
                _close(writer)
            await _pause(0.5, self.deadline)  # a service that closes at once is not hammered

    def as_json(self, connections: int) -> dict[str, Any]:
        held = sorted(self.hold_seconds)
        return self.tally.as_json(
            connections=connections,
            held_at_most=self.held_most,
            closed_after_seconds=(
                {"min": held[0], "median": held[len(held) // 2], "max": held[-1]} if held else None
            ),
        )


def _made_up_request(rng: random.Random, port: int) -> bytes:
    method = "".join(rng.choices(string.ascii_uppercase, k=rng.randint(*METHOD_LENGTHS)))
    path = rng.choice(
        ["/healthz", "/v1/snapshots", "/ui/", "/metrics", f"/{rng.getrandbits(64):x}"]
    )
    return f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode()


async def _made_up_methods(
    port: int, deadline: float, rate: float, worker: int, tally: Tally
) -> None:
    """One of METHOD_WORKERS loops: a request at a time, together ``rate`` a second."""
    rng = random.Random(worker)
    period = METHOD_WORKERS / rate
    await asyncio.sleep(worker * period / METHOD_WORKERS)
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            reader, writer = await _connect(port)
        except (OSError, TimeoutError) as error:
            tally.add(f"connect failed: {_failure(error)}")
        else:
            try:
                writer.write(_made_up_request(rng, port))
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), ANSWER_SECONDS)
                tally.add(_status(line))
            except (OSError, TimeoutError) as error:
                tally.add(_failure(error))
            finally:
                _close(writer)
        await _pause(period - (time.monotonic() - started), deadline)


async def _login_once(port: int, kind: str, size: int, tally: Tally) -> None:
    """One oversized ``POST /ui/login``; its outcome and the body bytes sent are counted."""
    reader, writer = await _connect(port)
    sent = 0
    #: the whole body is in the connection's buffer: an answer now comes after it
    whole_body_written = False
    head = (
        f"POST /ui/login HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n"
        + ("Transfer-Encoding: chunked\r\n" if kind == "chunked" else f"Content-Length: {size}\r\n")
        + "\r\n"
    )
    chunk = memoryview(b"token=" + b"a" * (LOGIN_CHUNK - 6))

    async def send_body() -> None:
        nonlocal sent, whole_body_written
        writer.write(head.encode())
        if kind == "unsent":
            writer.write(chunk[:1024])
            sent = 1024
            tally.figures["body_bytes_sent"] += sent
            await writer.drain()
            return
        while sent < size:
            piece = chunk[: min(LOGIN_CHUNK, size - sent)]
            if kind == "chunked":
                writer.write(b"%x\r\n" % len(piece))
                writer.write(piece)
                writer.write(b"\r\n")
            else:
                writer.write(piece)
            sent += len(piece)
            tally.figures["body_bytes_sent"] += len(piece)
            if kind == "chunked" and sent >= size:
                writer.write(b"0\r\n\r\n")
            whole_body_written = sent >= size
            await writer.drain()

    sending = asyncio.create_task(send_body())
    try:
        wait = UNSENT_BODY_SECONDS if kind == "unsent" else ANSWER_SECONDS
        line = await asyncio.wait_for(reader.readline(), wait)
        when = "after the whole body" if whole_body_written else "before the body ended"
        outcome = f"{_status(line)} {when}" if line else "closed without an answer"
    except (OSError, TimeoutError) as error:
        outcome = (
            f"no answer in {UNSENT_BODY_SECONDS} s"
            if isinstance(error, TimeoutError) and kind == "unsent"
            else _failure(error)
        )
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        _close(writer)
    tally.add(f"{kind}: {outcome}")


async def _login_bodies(
    port: int, deadline: float, sizes: tuple[int, int], interval: float, tally: Tally
) -> None:
    rng = random.Random(1)
    number = 0
    while time.monotonic() < deadline:
        kind = LOGIN_KINDS[number % len(LOGIN_KINDS)]
        number += 1
        try:
            await _login_once(port, kind, rng.randint(*sizes), tally)
        except (OSError, TimeoutError) as error:
            tally.add(f"{kind}: connect failed: {_failure(error)}")
        await _pause(interval, deadline)


def small_record(seed: int, gradients: int, floats: int) -> gv.GradientsParamsRecord:
    """A record of ``gradients`` float32 gradients of ``floats`` values each, from ``seed``."""
    rng = np.random.default_rng(seed)
    return gv.GradientsParamsRecord(
        [
            gv.GradientRecordEntry.from_array(
                gv.ParamId(), f"layer{i}.weight", rng.standard_normal(floats, np.float32)
            )
            for i in range(gradients)
        ]
    )


async def _pusher(
    url: str, token: str, number: int, body: bytes, deadline: float, interval: float,
    tally: Tally, context: ssl.SSLContext,
) -> None:  # fmt: skip
    """Push a small snapshot every ``interval`` seconds; delete the previous one.

    Each pusher has its own connection (httpx's pool looks at every connection it holds
    for each request: one pool of 50 would cost this side more CPU than the requests).
    The pushers share one ``context``: httpx makes one per client otherwise, and loading
    the certificates 50 times would stall the loop for seconds (the URL is plain HTTP).
    """
    await _pause(random.Random(number).uniform(0, interval), deadline)
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {token}"},
        limits=httpx.Limits(max_connections=1),
        timeout=httpx.Timeout(ANSWER_SECONDS, connect=CONNECT_SECONDS),
        verify=context,
    ) as http:
        await _push_until(http, number, body, deadline, interval, tally)


async def _push_until(
    http: httpx.AsyncClient, number: int, body: bytes, deadline: float, interval: float,
    tally: Tally,
) -> None:  # fmt: skip
    previous: str | None = None
    step = 0
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            response = await http.post(
                "/v1/snapshots",
                params={"run": f"soak-pusher-{number}", "step": step},
                content=body,
                headers=headers,
            )
            tally.add(f"push {response.status_code}")
            if response.status_code == 201:
                if previous is not None:
                    deleted = await http.delete(f"/v1/snapshots/{previous}")
                    tally.add(f"delete {deleted.status_code}")
                previous = response.json()["id"]
        except (httpx.HTTPError, ValueError, KeyError) as error:  # ValueError: not JSON
            tally.add(f"push or delete failed: {type(error).__name__}")
        step += 1
        await _pause(interval - (time.monotonic() - started), deadline)


def round_trip(api: Client, step: int, seed: int) -> None:
    """One push, restore and delete by ``api`` (a Client); raises on any difference."""
    pushed = small_record(seed, LEGITIMATE_GRADIENTS, LEGITIMATE_FLOATS)
    summary = api.push(pushed, run="soak-legitimate", step=step)
    restored = api.fetch(summary.id)
    if len(restored) != len(pushed):
        raise AssertionError(f"restored {len(restored)} gradients; pushed {len(pushed)}")
    for entry in pushed:
        back = restored[entry.param_id]
        if (back.name, back.dtype, back.shape) != (entry.name, entry.dtype, entry.shape):
            raise AssertionError(
                f"gradient {entry.name!r} came back as {back.name!r} {back.dtype} "
                f"{back.shape}; pushed {entry.dtype} {entry.shape}"
            )
        if back.array.tobytes() != entry.array.tobytes():
            raise AssertionError(f"gradient {entry.name!r} came back with other bytes")
    api.delete(summary.id)


@dataclass
class Legitimate:
    """The client that must keep working: push, restore, compare, delete, in a loop."""

    url: str
    token: str
    deadline: float
    pause: float
    #: the run's steps go on from here (after the warm-up's)
    first_step: int = 0
    round_trips: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def run(self) -> None:
        timeout = httpx.Timeout(ANSWER_SECONDS, connect=CONNECT_SECONDS)
        with Client(self.url, self.token, timeout=timeout) as api:
            step = self.first_step
            while time.monotonic() < self.deadline:
                started = time.perf_counter()
                try:
                    round_trip(api, step, seed=step)
                except Exception as error:  # noqa: BLE001 - every failure is counted
                    self.errors.append(f"{type(error).__name__}: {error}"[:400])
                else:
                    self.round_trips += 1
                    self.seconds.append(time.perf_counter() - started)
                step += 1
                time.sleep(self.pause)

    def as_json(self) -> dict[str, Any]:
        ordered = sorted(self.seconds)

        def quantile(q: float) -> float | None:
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None

        return {
            "round_trips": self.round_trips,
            "errors": len(self.errors),
            "error_samples": self.errors[:10],
            "round_trip_seconds": {
                "p50": quantile(0.5),
                "p99": quantile(0.99),
                "max": ordered[-1] if ordered else None,
            },
        }


async def run_traffic(
    options: argparse.Namespace, url: str, port: int, token: str, deadline: float
) -> dict[str, Any]:
    """Every attacker and pusher until ``deadline``; their outcomes by kind."""
    slow = SlowHeaders(port, deadline)
    methods, logins, pushers = Tally(), Tally(figures={"body_bytes_sent": 0}), Tally()
    pushed = small_record(7, PUSHER_GRADIENTS, PUSHER_FLOATS)
    body = b"".join(bytes(piece) for piece in safetensors_chunks(pushed))
    context = ssl.create_default_context()
    ramp = min(5.0, options.seconds / 4)
    tasks = [
        *(
            slow.connection(ramp * i / max(1, options.slow_connections))
            for i in range(options.slow_connections)
        ),
        *(
            _made_up_methods(port, deadline, options.method_rate, worker, methods)
            for worker in range(METHOD_WORKERS if options.method_rate > 0 else 0)
        ),
        _login_bodies(
            port,
            deadline,
            (options.login_min_mib * MIB, options.login_max_mib * MIB),
            options.login_interval,
            logins,
        ),
        *(
            _pusher(url, token, n, body, deadline, options.push_interval, pushers, context)
            for n in range(options.pushers)
        ),
    ]
    running = [asyncio.create_task(task) for task in tasks]
    await asyncio.wait(running, timeout=max(0.0, deadline - time.monotonic()) + DRAIN_SECONDS)
    cancelled = sum(not task.done() for task in running)
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return {
        "slow_headers": slow.as_json(options.slow_connections),
        "made_up_methods": methods.as_json(
            per_second=options.method_rate, method_characters=list(METHOD_LENGTHS)
        ),
        "login_bodies": logins.as_json(
            body_mib=[options.login_min_mib, options.login_max_mib],
            kinds=list(LOGIN_KINDS),
        ),
        "pushers": pushers.as_json(
            clients=options.pushers, push_interval_seconds=options.push_interval
        ),
        "tasks_cancelled_after_the_end": cancelled,
    }
