"""First paint of the run page with 10,000 snapshots in one run, in headless chromium.

The store holds one run of 10,000 snapshots of four gradients each (one step in 1,000
has a NaN); the service runs in a subprocess (uvicorn, default settings) on loopback and
Debian's chromium, driven by Playwright, opens ``/ui/run?run=big``. Measured in the page
(Paint Timing, from navigation start): first contentful paint, and the moment the chart
is drawn (its data, 1,000 points per layer, comes from ``/ui/api/run-stats``). The first
load after start-up reads every manifest once ("cold"); later loads answer from the
service's cache ("warm", median of several). The peer is a trivial HTML page served by
the same app, measured in the same browser. Target: first paint under one second.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._timing import Row

SNAPSHOTS = 10_000
NAN_EVERY = 1_000
WARM_LOADS = 7
RUN = "big"
CHROMIUM = Path(os.environ.get("GRADVAULT_CHROMIUM", "/usr/bin/chromium"))
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

_SERVER = """
import sys, uvicorn
from fastapi.responses import HTMLResponse
from gradvault.service import Settings, create_app
app = create_app(Settings(store=sys.argv[1], port=int(sys.argv[2])))

@app.get("/bench/trivial", response_class=HTMLResponse)
async def trivial() -> str:
    return "<!doctype html><title>t</title><link rel=icon href=data:,><p>trivial page</p>"

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""

#: records, in page time (ms from navigation start), the first contentful paint
_WATCH_PAINT = """
new PerformanceObserver((entries) => {
  for (const entry of entries.getEntries()) {
    if (entry.name === 'first-contentful-paint') window.__firstPaintAt = entry.startTime;
  }
}).observe({type: 'paint', buffered: true});
"""

#: records, in page time, when the chart says it is drawn
_WATCH_CHART = """
new MutationObserver((changes, observer) => {
  const chart = document.getElementById('run-chart');
  if (chart && chart.dataset.ready === 'true') {
    window.__chartReadyAt = performance.now();
    observer.disconnect();
  }
}).observe(document, {subtree: true, attributes: true, childList: true});
"""


def _page_time(page: Any, name: str, deadline_seconds: float = 120) -> float:
    """The page-time value the page's watcher stored in ``window[name]``, once it is there."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        value = page.evaluate(f"window.{name}")
        if value is not None:
            return float(value)
        time.sleep(0.02)
    raise RuntimeError(f"the page never set {name}")


async def _fill(store_path: Path) -> float:
    import gradvault.core as gv

    store = gv.open_store(store_path)
    rng = np.random.default_rng(0)
    shapes = {"fc1.weight": (16, 8), "fc1.bias": (16,), "fc2.weight": (4, 16), "fc2.bias": (4,)}
    slots = asyncio.Semaphore(64)

    async def one(step: int) -> None:
        scale = np.float32(1.0 + 0.5 * np.sin(step / 500))
        entries = []
        for i, (name, shape) in enumerate(shapes.items()):
            array = rng.standard_normal(shape, "f4") * scale
            if step % NAN_EVERY == NAN_EVERY // 2 and i == 2:
                array.reshape(-1)[0] = np.nan
            entries.append(gv.GradientRecordEntry.from_array(gv.ParamId(i + 1), name, array))
        async with slots:
            await store.write_snapshot(gv.GradientsParamsRecord(entries), run=RUN, step=step)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(step) for step in range(SNAPSHOTS)))
    finally:
        await store.close()
    return time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_ready(base_url: str, deadline_seconds: float = 180) -> None:
    deadline = time.monotonic() + deadline_seconds
    with httpx.Client(base_url=base_url, timeout=60) as client:
        while time.monotonic() < deadline:
            try:
                if client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError("the service did not become ready")


def _load(browser: Any, url: str, chart: bool) -> dict[str, float]:
    """Open ``url`` in a fresh context; paint times (and chart time) in ms from navigation."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on(
            "console", lambda message: errors.append(message.text) if message.type == "error" else 0
        )
        page.add_init_script(_WATCH_PAINT)
        if chart:
            page.add_init_script(_WATCH_CHART)
        page.goto(url, wait_until="commit")
        found = {"first-contentful-paint": _page_time(page, "__firstPaintAt")}
        if chart:
            found["chart"] = _page_time(page, "__chartReadyAt")
            marked = page.get_attribute("#run-chart", "data-marked-steps")
            expected = str(SNAPSHOTS // NAN_EVERY)
            assert marked == expected, f"{marked} NaN steps marked; expected {expected}"
        assert not errors, errors
        return found
    finally:
        context.close()


def run() -> list[Row]:
    """The run page's first paint, cold and warm, against a trivial page of the same app."""
    print(f"\n## pages: run page of {SNAPSHOTS:,} snapshots, headless chromium, loopback")
    if not CHROMIUM.exists():
        print(f"skipped: Debian chromium is not installed at {CHROMIUM} (`make browser`)")
        return []
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        store_path = Path(folder) / "store"
        fill_seconds = asyncio.run(_fill(store_path))
        print(f"filled in {fill_seconds:.1f} s", flush=True)
        port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(store_path), str(port)], env=env
        )
        try:
            started = time.perf_counter()
            _wait_ready(base_url)
            print(f"service ready in {time.perf_counter() - started:.1f} s", flush=True)
            run_url = f"{base_url}/ui/run?run={RUN}"
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                try:
                    cold = _load(browser, run_url, chart=True)
                    warm = [_load(browser, run_url, chart=True) for _ in range(WARM_LOADS)]
                    peer = [
                        _load(browser, f"{base_url}/bench/trivial", chart=False)
                        for _ in range(WARM_LOADS)
                    ]
                finally:
                    browser.close()
        finally:
            server.terminate()
            server.wait(30)
        return _report(cold, warm, peer)  # before the store's 40,000 files are removed


def _report(
    cold: dict[str, float], warm: list[dict[str, float]], peer: list[dict[str, float]]
) -> list[Row]:
    def median(loads: list[dict[str, float]], key: str) -> float:
        return statistics.median(load[key] for load in loads)

    paint = "first-contentful-paint"
    print(f"{'measurement (from navigation start)':44s} {'ms':>9s}  target")
    print(f"{'run page, first contentful paint, cold':44s} {cold[paint]:9.1f}  < 1000 ms")
    print(f"{'run page, chart drawn, cold':44s} {cold['chart']:9.1f}")
    print(f"{'run page, first contentful paint, warm':44s} {median(warm, paint):9.1f}  < 1000 ms")
    print(f"{'run page, chart drawn, warm':44s} {median(warm, 'chart'):9.1f}")
    print(f"{'trivial HTML page (peer), first paint':44s} {median(peer, paint):9.1f}")
    ratio = median(warm, paint) / median(peer, paint)
    print(f"{'ratio first paint warm / peer':44s} {ratio:8.2f}x", flush=True)
    figure = f"run page of {SNAPSHOTS:,} snapshots, first contentful paint"
    trivial = [load[paint] / 1000 for load in peer]
    return [
        Row(
            f"{figure}, first load",
            [cold[paint] / 1000],
            "trivial page",
            trivial,
            "< 1000 ms",
            absolute=1.0,
        ),
        Row(
            f"{figure}, later loads",
            [load[paint] / 1000 for load in warm],
            "trivial page",
            trivial,
            "< 1000 ms",
            absolute=1.0,
        ),
        Row("run page chart drawn, first load", [cold["chart"] / 1000], "trivial page", trivial),
    ]


if __name__ == "__main__":
    run()
