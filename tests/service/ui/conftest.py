"""The pages under test: snapshots of a real training run, a real uvicorn, Debian's chromium.

``trained_store`` trains the core's demo MLP for a few steps and snapshots the
accumulated gradients of every step with the core's Recorder (run ``mlp``); one step's
snapshot has a NaN injected into one gradient. ``open_service`` and
``protected_service`` serve that store on 127.0.0.1; ``long_run`` serves 30 synthetic
snapshots whose norms are known in advance; ``browser`` is chromium driven by
Playwright. Browser tests skip, saying why, only where chromium cannot be present (it
is not installed and ``make browser`` could not install it); screenshots go to
``tests/service/ui/artifacts/`` (ignored by git).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.client.cli.demo_task import train
from gradvault.core import (
    GradientRecordEntry,
    GradientsParamsRecord,
    ParamId,
    Recorder,
    SnapshotInfo,
    open_store,
)
from gradvault.service import Settings, create_app
from tests.service.conftest import UvicornThread

CHROMIUM = Path(os.environ.get("GRADVAULT_CHROMIUM", "/usr/bin/chromium"))
#: flags for a headless chromium that reaches nothing but the service under test
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parent / "artifacts"
RUN = "mlp"
STEPS = 8
NAN_STEP = 5
ODD_RUN = "<script>alert(1)</script> & /slashes?"
READ_TOKEN = "ui-read-token-1"
WRITE_TOKEN = "ui-write-token-1"


@dataclass(frozen=True)
class TrainedStore:
    """A store folder holding a training run's snapshots, one of them with a NaN."""

    path: Path
    snapshots: list[SnapshotInfo]  # in step order
    nan_snapshot: SnapshotInfo
    layer_names: list[str]


def _with_nan(record: GradientsParamsRecord) -> GradientsParamsRecord:
    """``record`` with a NaN in the middle of its second gradient (a diverged layer)."""
    entries = list(record)
    hit = entries[1]
    array = np.array(hit.array, copy=True)
    array.reshape(-1)[array.size // 2] = np.nan
    entries[1] = GradientRecordEntry.from_array(hit.param_id, hit.name, array)
    return GradientsParamsRecord(entries, metadata=record.metadata)


@pytest.fixture(scope="session")
def trained_store(tmp_path_factory: pytest.TempPathFactory) -> TrainedStore:
    path = tmp_path_factory.mktemp("ui") / "store"
    micro_batches = 2
    with Recorder(path) as recorder:
        handles = []
        names: list[str] = []

        def snapshot(step: int, micro: int, model: Any, accumulator: Any) -> None:
            if micro == micro_batches - 1:  # the whole window, as the optimizer sees it
                record = accumulator.current().try_to_record()
                names[:] = [entry.name for entry in record]
                if step == NAN_STEP:
                    record = _with_nan(record)
                handles.append(recorder.start_snapshot(record, run=RUN, step=step))

        train(steps=STEPS, micro_batches=micro_batches, hidden=16, on_micro_batch=snapshot)
        infos = [handle.result() for handle in handles]
        # a handle, not recorder.sync: a browser's event loop may already run in this thread
        recorder.start_snapshot(probe_record(), run="probe", step=0).result()
    return TrainedStore(path, infos, infos[NAN_STEP], names)


def probe_record() -> GradientsParamsRecord:
    """A small record of a second run, so the overview lists two runs."""
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(7), "probe.weight", np.ones((2, 3), np.float32))]
    )


@dataclass
class Served:
    """A service on loopback over the trained store."""

    base_url: str
    settings: Settings


def serve_store(store: Path, **settings: Any) -> Iterator[Served]:
    """Serve ``store`` on 127.0.0.1 with ``settings`` until the generator is closed."""
    config = Settings(store=str(store), index_refresh_seconds=0, **settings)
    server = UvicornThread(create_app(config))
    server.start()
    try:
        yield Served(server.base_url, config)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def open_service(trained_store: TrainedStore) -> Iterator[Served]:
    yield from serve_store(trained_store.path)


@pytest.fixture(scope="module")
def protected_service(trained_store: TrainedStore) -> Iterator[Served]:
    yield from serve_store(trained_store.path, tokens=f"{READ_TOKEN}:read,{WRITE_TOKEN}:write")


def _record(step: int, nan: bool = False) -> GradientsParamsRecord:
    """Two gradients whose norms grow with ``step`` (the second one 10x the first)."""
    first = np.full(4, step + 1, np.float32)
    second = np.full(9, 10 * (step + 1), np.float32)
    if nan:
        second[3] = np.nan
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(1), "a.weight", first),
            GradientRecordEntry.from_array(ParamId(2), "b.weight", second),
        ]
    )


async def _fill(path: Path, steps: int, nan_steps: set[int], run: str) -> None:
    store = open_store(path)
    try:
        for step in range(steps):
            await store.write_snapshot(_record(step, step in nan_steps), run=run, step=step)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """30 snapshots of run ``long`` (NaN at step 17) and one of a run with an odd name."""
    path = tmp_path_factory.mktemp("long") / "store"
    # in a thread of its own: a browser's event loop may already run in this one
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, _fill(path, 30, {17}, "long")).result()
        thread.submit(asyncio.run, _fill(path, 1, set(), ODD_RUN)).result()
    yield from serve_store(path)


#: gradients in the wide snapshot: two full pages of the table and part of a third
WIDE_GRADIENTS = 1234
#: the position of its one gradient with a NaN
WIDE_NAN_POSITION = 700


@dataclass(frozen=True)
class WideSnapshot:
    """A service over one snapshot of more gradients than a page of its table holds.

    Gradient ``i`` is ``layer{i:04d}.weight``, four values of ``i + 1`` (L2 norm
    ``2 * (i + 1)``) and ParamId ``i + 1``; the one at ``WIDE_NAN_POSITION`` has a NaN.
    """

    served: Served
    snapshot_id: str


@pytest.fixture(scope="module")
def wide_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WideSnapshot]:
    path = tmp_path_factory.mktemp("wide") / "store"
    entries = []
    for i in range(WIDE_GRADIENTS):
        values = np.full(4, i + 1, np.float32)
        if i == WIDE_NAN_POSITION:
            values[2] = np.nan
        entries.append(
            GradientRecordEntry.from_array(ParamId(i + 1), f"layer{i:04d}.weight", values)
        )

    async def fill() -> str:
        store = open_store(path)
        try:
            info = await store.write_snapshot(GradientsParamsRecord(entries), run="wide", step=0)
        finally:
            await store.close()
        return info.id

    # in a thread of its own: a browser's event loop may already run in this one
    with ThreadPoolExecutor(1) as thread:
        snapshot_id = thread.submit(asyncio.run, fill()).result()
    for served in serve_store(path):
        yield WideSnapshot(served, snapshot_id)


def _chromium_missing_reason() -> str | None:
    if not CHROMIUM.exists():
        how = "run `make browser` as root" if shutil.which("apt-get") else "no apt-get here"
        return f"Debian chromium is not installed at {CHROMIUM} ({how})"
    return None


# module scope: Playwright's sync API keeps an event loop running in this thread while the
# browser is open, which async tests and sync facades elsewhere must not find
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = _chromium_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (the dev extra has it)"
    )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class PageWatch:
    """A browser page that records console errors, page errors and failed requests."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on(
            "console",
            lambda message: (
                self.problems.append(
                    f"console {message.type}: {message.text} at {message.location.get('url')}"
                )
                if message.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", self._request_failed)

    def _request_failed(self, request: Any) -> None:
        # ERR_ABORTED: the page navigated on before it came (the icon of a page left at once)
        if request.failure != "net::ERR_ABORTED":
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def page(browser: Any) -> Iterator[PageWatch]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    context.set_default_timeout(30_000)
    watch = PageWatch(context.new_page())
    try:
        yield watch
    finally:
        context.close()
