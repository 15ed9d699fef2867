"""Faults on a real network: the service killed mid-download and started again, a byte
flipped on the way, a 503 or 429 in front of it. The service runs as its own process, or
behind a loopback proxy."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from gradvault.core import (
    ChecksumMismatchError,
    GradientRecordEntry,
    GradientsParamsRecord,
    ParamId,
)
from gradvault.core.records.safetensors_file import record_from_safetensors
from tests.service.processes import ServiceProcess

from .conftest import WRITE_TOKEN, ClientUnderTest

SAFETENSORS_ROUTE = "/v1/snapshots/{snapshot_id}/safetensors"
#: big enough that the loopback socket buffers hold only a small part of it
BIG_FLOATS = 6 * 1024 * 1024  # 24 MiB of float32
KILL_AFTER_BYTES = 2 * 1024 * 1024
#: 16 bytes found once in the stream: the proxy flips the last of them
MARKER = bytes(range(0xE0, 0xF0))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def big_record() -> GradientsParamsRecord:
    rng = np.random.default_rng(7)
    big = rng.standard_normal(BIG_FLOATS, "f4")
    marked = np.frombuffer(MARKER * 4, dtype="f4").copy()
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(0xB16), "big.weight", big),
            GradientRecordEntry.from_array(ParamId(0x5A1), "small.bias", marked),
        ]
    )


def requests_of(metrics_text: str, status: int) -> float:
    """How many safetensors downloads a service's /metrics counts with ``status``."""
    for line in metrics_text.splitlines():
        if (
            line.startswith("gradvault_http_requests_total{")
            and f'route="{SAFETENSORS_ROUTE}"' in line
            and f'status="{status}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Restarter:
    """A ``progress`` callback that kills the service once ``after`` bytes have arrived
    and starts it again on the same port before the client reads on."""

    def __init__(
        self, service: ServiceProcess, start: Callable[[], ServiceProcess], after: int
    ) -> None:
        self.service, self.start, self.after = service, start, after
        self.dones: list[int] = []
        self.restarted = False

    def __call__(self, done: int, total: int | None) -> None:
        self.dones.append(done)
        if not self.restarted and done >= self.after:
            self.restarted = True
            os.kill(self.service.pid, signal.SIGKILL)
            self.service.stop()
            self.service = self.start()


async def test_the_service_killed_mid_download_and_restarted_the_client_resumes(
    client_kind: str, store_url: str, connection_options: dict[str, object], tmp_path: Path
) -> None:
    port = free_port()

    def start() -> ServiceProcess:
        return ServiceProcess(store_url, store_options=connection_options, port=port)

    first = await asyncio.to_thread(start)
    restarter = Restarter(first, start, KILL_AFTER_BYTES)
    api = ClientUnderTest(client_kind, first.base_url, None, backoff_seconds=0.05)
    try:
        record = big_record()
        summary = await api.call("push", record, run="big", step=1)
        path = tmp_path / "big.safetensors"
        await api.call("download", summary.id, path, progress=restarter)
        assert restarter.restarted

        async with httpx.AsyncClient(base_url=first.base_url, timeout=60) as plain:
            whole = await plain.get(SAFETENSORS_ROUTE.format(snapshot_id=summary.id))
            metrics = (await plain.get("/metrics")).text
        assert path.read_bytes() == whole.content
        got = record_from_safetensors(path)
        assert [bytes(e.data) for e in got] == [bytes(e.data) for e in record]
        # the restarted service was asked for the rest only, once
        assert requests_of(metrics, 206) == 1
        assert requests_of(metrics, 200) == 1  # the plain whole download above
        assert restarter.dones == sorted(restarter.dones)  # never back to 0
        assert restarter.dones[-1] == len(whole.content)
    finally:
        await api.close()
        await asyncio.to_thread(restarter.service.stop)


class Proxy:
    """A loopback TCP proxy to ``upstream``: it answers its first connection with
    ``first_answer`` (raw HTTP) if given, and flips one bit of the last byte of MARKER in
    what the service sends back, once."""

    def __init__(self, upstream_port: int, first_answer: bytes | None = None) -> None:
        self.upstream_port = upstream_port
        self.first_answer = first_answer
        self.connections = 0
        self.flipped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.first_answer is not None and self.connections == 1:
                self._answer(client, self.first_answer)
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            for source, sink, flips in ((client, upstream, False), (upstream, client, True)):
                thread = threading.Thread(
                    target=self._pipe, args=(source, sink, flips), daemon=True
                )
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _answer(client: socket.socket, answer: bytes) -> None:
        request = b""
        while b"\r\n\r\n" not in request and (chunk := client.recv(1 << 16)):
            request += chunk
        client.sendall(answer)
        _shut(client)
        client.close()

    def _pipe(self, source: socket.socket, sink: socket.socket, flips: bool) -> None:
        sent_tail = b""  # the last bytes sent, where a marker split across reads begins
        try:
            while chunk := source.recv(1 << 16):
                if flips and not self.flipped.is_set():
                    at = (sent_tail + chunk).find(MARKER)
                    if at >= 0:  # the marker's last byte is always in this chunk
                        last = at + len(MARKER) - 1 - len(sent_tail)
                        chunk = chunk[:last] + bytes([chunk[last] ^ 0x01]) + chunk[last + 1 :]
                        self.flipped.set()
                    sent_tail = (sent_tail + chunk)[-(len(MARKER) - 1) :]
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            _shut(source, sink)

    def close(self) -> None:
        self._listener.close()
        _shut(*self._sockets)
        for end in self._sockets:
            end.close()
        for thread in self._threads:
            thread.join(10)


def _shut(*ends: socket.socket) -> None:
    for end in ends:
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture
def proxy(service_url: str) -> Iterator[Proxy]:
    running = Proxy(int(service_url.rsplit(":", 1)[1]))
    yield running
    running.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
        b"Connection: close\r\n\r\n",
    ],
    ids=["503", "429"],
)
async def test_a_503_or_429_in_front_of_the_service_is_retried(
    client_kind: str, service_url: str, answer: bytes, run_named: Callable[[str], str]
) -> None:
    direct = ClientUnderTest(client_kind, service_url, WRITE_TOKEN)
    summary = await direct.call("push", small_record(), run=run_named("retried"), step=0)
    await direct.close()
    in_front = Proxy(int(service_url.rsplit(":", 1)[1]), first_answer=answer)
    api = ClientUnderTest(client_kind, f"http://127.0.0.1:{in_front.port}", WRITE_TOKEN)
    try:
        listed = await api.list(run=run_named("retried"))
        assert [s.id for s in listed] == [summary.id]
        assert in_front.connections == 2  # the refused try, then the one that got through
    finally:
        await api.close()
        in_front.close()


def small_record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(0x51), "w", np.arange(8, dtype="f4"))]
    )


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
async def test_a_byte_flipped_on_the_way_is_detected_and_nothing_is_left(
    client_kind: str, service_url: str, proxy: Proxy, tmp_path: Path, suffix: str
) -> None:
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                ParamId(0x5A1), "small.bias", np.frombuffer(MARKER * 4, "f4")
            ),
            GradientRecordEntry.from_array(ParamId(0xB16), "w", np.arange(64, dtype="f4")),
        ]
    )
    direct = ClientUnderTest(client_kind, service_url, WRITE_TOKEN)
    through_proxy = ClientUnderTest(client_kind, f"http://127.0.0.1:{proxy.port}", WRITE_TOKEN)
    try:
        summary = await direct.call("push", record, run="flip", step=0)
        folder = tmp_path / "out"
        folder.mkdir()
        destination = folder / f"kept{suffix}"
        destination.write_bytes(b"what was here before")
        with pytest.raises(
            ChecksumMismatchError, match=rf"{summary.id}.*00000000000005a1"
        ) as caught:
            await through_proxy.call("download", summary.id, destination)
        assert proxy.flipped.is_set()
        assert "'small.bias'" in str(caught.value)
        assert destination.read_bytes() == b"what was here before"
        assert sorted(p.name for p in folder.iterdir()) == [destination.name]  # no .part
        # the same download without the proxy is whole
        await direct.call("download", summary.id, destination)
        assert destination.read_bytes() != b"what was here before"
    finally:
        await direct.close()
        await through_proxy.close()
