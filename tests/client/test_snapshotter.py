"""Snapshotter and AsyncSnapshotter: to a real store and a real service, failing targets,
and a loop that goes on while an upload hangs."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.client import (
    AsyncClient,
    AsyncSnapshotter,
    Client,
    Snapshotter,
    SnapshotterWarning,
)
from gradvault.core import (
    AuthError,
    ClientRequestError,
    GradientsParams,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidFieldError,
    ParamId,
    Recorder,
)

from .conftest import READ_TOKEN, WRITE_TOKEN, ClientUnderTest

WEIGHT = ParamId(0xAB)


class Driver:
    """A Snapshotter (``kind`` "sync") or an AsyncSnapshotter, every call awaited here."""

    def __init__(self, kind: str, target: Any, **options: Any) -> None:
        self.kind = kind
        cls = Snapshotter if kind == "sync" else AsyncSnapshotter
        self.snap: Any = cls(target, **options)

    async def step(self, step: int, grads: Any) -> bool:
        taken = self.snap.step(step, grads)
        return await taken if self.kind == "async" else taken

    async def flush(self) -> None:
        if self.kind == "sync":
            await asyncio.to_thread(self.snap.flush)
        else:
            await self.snap.flush()

    async def close(self) -> Any:
        if self.kind == "sync":
            return await asyncio.to_thread(self.snap.close)
        return await self.snap.aclose()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def training_gradients() -> tuple[GradientsParams, gv.Tensor]:
    weight = gv.zeros(64, 3)
    grads = GradientsParams()
    grads.register(WEIGHT, weight, name="layer.weight")
    return grads, weight


async def test_every_n_steps_to_a_store(
    kind: str, store_url: str, connection_options: dict[str, object]
) -> None:
    grads, weight = training_gradients()
    snap = Driver(
        kind, store_url, run="s", every=3, tags={"lr": "0.1"}, recorder_options=connection_options
    )
    taken = []
    for step in range(8):
        weight.add_(1.0)  # the loop writes the gradient in place, as accumulation does
        taken.append(await snap.step(step, grads))
        await snap.flush()
    summary = await snap.close()
    assert taken == [True, False, False, True, False, False, True, False]
    assert (summary.taken, summary.committed, summary.failed, summary.skipped) == (3, 3, 0, 0)
    assert summary.last is not None and summary.last.step == 6

    async with Recorder(store_url, **connection_options) as recorder:
        listed = await recorder.list(run="s")
        assert [info.step for info in listed] == [6, 3, 0]
        for info in listed:
            record = await recorder.fetch(info.id)
            np.testing.assert_array_equal(record[WEIGHT].array, np.full((64, 3), info.step + 1))
        assert (await recorder.info(listed[0].id))["tags"] == {"lr": "0.1"}


async def test_every_n_steps_to_a_service(
    client_kind: str, service_url: str, run_named: Callable[[str], str]
) -> None:
    grads, weight = training_gradients()
    snap = Driver(client_kind, service_url, run=run_named("svc"), every=2, token=WRITE_TOKEN)
    for step in range(5):
        weight.add_(1.0)
        await snap.step(step, grads)
        await snap.flush()
    summary = await snap.close()
    assert (summary.committed, summary.failed) == (3, 0)

    reader = ClientUnderTest(client_kind, service_url, READ_TOKEN)
    try:
        listed = await reader.list(run=run_named("svc"))
        assert [s.step for s in listed] == [4, 2, 0]
        record = await reader.call("fetch", listed[0].id)
        np.testing.assert_array_equal(record[WEIGHT].array, np.full((64, 3), 5.0))
    finally:
        await reader.close()


async def test_a_client_or_recorder_passed_in_is_used_and_left_open(
    kind: str, service_url: str, tmp_path: Path, run_named: Callable[[str], str]
) -> None:
    grads, _ = training_gradients()
    client: Any = (Client if kind == "sync" else AsyncClient)(service_url, WRITE_TOKEN)
    recorder = Recorder(tmp_path / "snapshotter-store")  # not the service's store
    try:
        for target in (client, recorder):
            snap = Driver(kind, target, run=run_named("given"))
            await snap.step(0, grads)
            assert (await snap.close()).committed == 1
        assert len(await recorder.list(run=run_named("given"))) == 1
        pages = client.list(run=run_named("given"))
        listed = list(pages) if kind == "sync" else [s async for s in pages]
        assert len(listed) == 1  # the client still works: it was not closed
    finally:
        await recorder.aclose()
        if kind == "sync":
            client.close()
        else:
            await client.aclose()


class BlackHole:
    """A loopback server that accepts connections and never answers, until released."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connected = threading.Event()
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(connection)
            self.connected.set()

    def release(self) -> None:
        """Drop every connection and stop listening: the uploads fail."""
        for end in [self._listener, *self._connections]:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()
        self._thread.join(10)


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.release()


async def test_the_loop_goes_on_while_an_upload_hangs(kind: str, black_hole: BlackHole) -> None:
    grads, weight = training_gradients()
    snap = Driver(kind, black_hole.url, run="h", client_options={"retries": 0})
    assert await snap.step(0, grads)
    assert await asyncio.to_thread(black_hole.connected.wait, 30)
    for step in (1, 2, 3):  # step 0's upload is still waiting for an answer
        weight.add_(1.0)
        assert await snap.step(step, grads)
    during = snap.snap.summary
    assert (during.taken, during.committed, during.failed, during.skipped) == (4, 0, 0, 2)

    black_hole.release()
    with pytest.warns(SnapshotterWarning, match=r"run 'h': 2 snapshot\(s\) failed"):
        summary = await snap.close()
    assert (summary.taken, summary.committed, summary.failed, summary.skipped) == (4, 0, 2, 2)
    assert [step for step, _ in summary.errors] == [0, 3]  # the newest went next
    assert all(isinstance(error, ClientRequestError) for _, error in summary.errors)


async def test_a_failing_store_is_reported_and_training_goes_on(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder would be")
    grads, _ = training_gradients()
    snap = Driver(kind, blocker / "store", run="f", every=1)
    for step in range(3):
        assert await snap.step(step, grads)
        await snap.flush()
    with pytest.warns(SnapshotterWarning, match="3 snapshot"):
        summary = await snap.close()
    assert (summary.committed, summary.failed) == (0, 3)
    assert "snapshot of step 0 failed; training goes on" in caplog.text
    assert blocker.read_text() == "a file where the store's folder would be"


async def test_raise_on_failure_raises_the_failures_as_a_group(kind: str, service_url: str) -> None:
    grads, _ = training_gradients()
    snap = Driver(kind, service_url, run="denied", token=READ_TOKEN, raise_on_failure=True)
    for step in range(2):
        await snap.step(step, grads)
        await snap.flush()  # training went on past the first failure
    with pytest.warns(SnapshotterWarning), pytest.raises(ExceptionGroup) as caught:
        await snap.close()
    assert len(caught.value.exceptions) == 2
    assert all(isinstance(error, AuthError) for error in caught.value.exceptions)


async def test_an_error_in_the_loop_is_not_masked_by_the_failures(
    kind: str, service_url: str
) -> None:
    grads, _ = training_gradients()
    with pytest.warns(SnapshotterWarning), pytest.raises(RuntimeError, match="the loop broke"):
        if kind == "sync":
            with Snapshotter(service_url, run="x", token=READ_TOKEN, raise_on_failure=True) as s:
                s.step(0, grads)
                await asyncio.to_thread(s.flush)
                raise RuntimeError("the loop broke")
        else:
            async with AsyncSnapshotter(
                service_url, run="x", token=READ_TOKEN, raise_on_failure=True
            ) as a:
                await a.step(0, grads)
                await a.flush()
                raise RuntimeError("the loop broke")


async def test_bad_arguments_are_refused_clearly(kind: str, tmp_path: Path) -> None:
    cls = Snapshotter if kind == "sync" else AsyncSnapshotter
    for every in (0, -2, 1.5, True):
        with pytest.raises(InvalidFieldError, match="every is a number of steps >= 1"):
            cls(tmp_path / "s", run="r", every=every)
    with pytest.raises(InvalidFieldError, match="run must be"):
        cls(tmp_path / "s", run="", every=1)
    other_client: Any = (
        AsyncClient("http://127.0.0.1:9") if kind == "sync" else Client("http://127.0.0.1:9")
    )
    with pytest.raises(TypeError, match="uploads with"):
        cls(other_client, run="r")

    snap = Driver(kind, tmp_path / "s", run="r")
    with pytest.raises(InvalidFieldError, match="step must be"):
        await snap.step(-1, training_gradients()[0])
    with pytest.raises(TypeError, match=r"step\(\) takes GradientsParams"):
        await snap.step(0, {"w": np.zeros(3)})
    assert (await snap.close()).taken == 0
    with pytest.raises(InvalidFieldError, match="closed"):
        await snap.step(0, training_gradients()[0])


async def test_a_torch_module_is_snapshotted_bit_for_bit(kind: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    expected = {name: p.grad.numpy().tobytes() for name, p in model.named_parameters()}
    snap = Driver(kind, tmp_path / "store", run="torch")
    await snap.step(0, model)
    model.weight.grad.add_(1.0)  # after the capture: not in the snapshot
    assert (await snap.close()).committed == 1
    async with Recorder(tmp_path / "store") as recorder:
        (info,) = await recorder.list(run="torch")
        record = await recorder.fetch(info.id)
    assert {e.name: bytes(e.data) for e in record} == expected


# ---------------------------------------------------------------------- its target
async def test_snapshotter_takes_a_service_url_in_capitals(kind: str, service_url: str) -> None:
    """URL schemes have no case; the command line's --url never minded it."""
    grads, _ = training_gradients()
    snap = Driver(kind, service_url.replace("http://", "HTTP://"), run="caps", token=WRITE_TOKEN)
    await snap.step(0, grads)
    summary = await snap.close()
    assert (summary.committed, summary.failed) == (1, 0)


async def test_snapshotter_takes_the_token_from_the_environment(
    kind: str, service_url: str, monkeypatch: pytest.MonkeyPatch, run_named: Callable[[str], str]
) -> None:
    """As the command line and the Hugging Face callback do: $GRADVAULT_TOKEN."""
    monkeypatch.setenv("GRADVAULT_TOKEN", WRITE_TOKEN)
    grads, _ = training_gradients()
    snap = Driver(kind, service_url, run=run_named("env-token"))
    await snap.step(0, grads)
    summary = await snap.close()
    assert (summary.committed, summary.failed) == (1, 0), summary.errors
    reader = ClientUnderTest(kind, service_url, WRITE_TOKEN)
    try:
        assert [s.step for s in await reader.list(run=run_named("env-token"))] == [0]
    finally:
        await reader.close()


@pytest.mark.parametrize("cls", [Snapshotter, AsyncSnapshotter])
def test_snapshotter_refuses_a_bad_target_when_made(cls: type, tmp_path: Path) -> None:
    """Not at each upload in the background: a service URL without a host, a token that
    a store would silently drop, a scheme that is neither."""
    with pytest.raises(InvalidArgumentError, match="a service URL names its host"):
        cls("http://", run="r")
    with pytest.raises(InvalidArgumentError, match="a token is for a service URL"):
        cls(tmp_path / "store", run="r", token="t0k")
    with pytest.raises(InvalidArgumentError, match="got 'ftp://host/x'"):
        cls("ftp://host/x", run="r")
    with pytest.raises(InvalidArgumentTypeError, match="got int 3"):
        cls(3, run="r")
