"""Take the README's picture of the run page: a real training run, served, in chromium.

    python scripts/ui_screenshot.py [--out docs/img/run-page.png]

Trains the core's demo MLP for 60 steps, snapshots the accumulated gradients of every
step with a Recorder into a temporary store (step 40's with a NaN in one gradient, as a
diverging layer would leave), serves the store with uvicorn on 127.0.0.1 and saves a
screenshot of ``/ui/run?run=demo`` taken by Debian's chromium (headless).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from gradvault.client.cli.demo_task import train
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, Recorder
from gradvault.service import Settings, create_app

CHROMIUM = "/usr/bin/chromium"
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
STEPS = 60
NAN_STEP = 40


def _record_run(store: Path) -> None:
    with Recorder(store) as recorder:
        handles = []

        def snapshot(step: int, micro: int, model: Any, accumulator: Any) -> None:
            if micro != 3:
                return
            record = accumulator.current().try_to_record()
            if step == NAN_STEP:
                entries = list(record)
                array = np.array(entries[2].array, copy=True)
                array.reshape(-1)[:8] = np.nan
                entries[2] = GradientRecordEntry.from_array(
                    entries[2].param_id, entries[2].name, array
                )
                record = GradientsParamsRecord(entries)
            handles.append(recorder.start_snapshot(record, run="demo", step=step))

        train(steps=STEPS, on_micro_batch=snapshot)
        for handle in handles:
            handle.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/img/run-page.png"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "store"
        _record_run(store)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(create_app(Settings(store=str(store))), log_level="warning")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1000, "height": 670})
                page.goto(f"http://127.0.0.1:{port}/ui/run?run=demo")
                page.wait_for_selector("#run-chart[data-ready=true]")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.should_exit = True
            thread.join(30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
