"""``gradvault demo``: the resumed run is bit-identical, through a service it starts (as
``make demo`` and ``make run`` use it) or one it is given."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from .conftest import WRITE_TOKEN, ServeProcess, clean_environment

DEADLINE_SECONDS = 180


def check_bit_identical(out: str) -> None:
    assert "bit-identical: yes" in out, out
    figures = re.search(r"(\d+) tensors, ([\d,]+) values, ([\d,]+) bytes compared: 0 values", out)
    assert figures is not None, out
    assert figures[1] == "6" and figures[2] == "6,532" and figures[3] == "26,128"
    ours, theirs = re.search(r"sha256 ([0-9a-f]{16}) vs ([0-9a-f]{16})", out).groups()
    assert ours == theirs
    lost = float(re.search(r"already read does, ends ([0-9.e+-]+) away", out)[1])
    assert lost > 0  # losing the window's micro-batches would not have been identical
    assert "the trainer was killed (SIGKILL) after micro-batch 3 of 4 of step 6" in out
    assert re.search(r"restored snapshot \w{26} from http://127\.0\.0\.1:\d+", out)


def test_demo_on_a_service_it_starts(gradvault, gradvault_process, tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = gradvault_process("demo", "--service-store", str(store))
    assert result.code == 0, result.out + result.err
    check_bit_identical(result.out)
    assert "the trainer pushed 13 snapshots; keeping the newest 3, retention deleted 10:" in (
        result.out
    )
    run = re.search(r"run: (demo-[\d-]+)", result.out)[1]
    listing = json.loads(gradvault("ls", "--store", str(store), "--run", run, "--json").out)
    assert [s["step"] for s in listing] == [6, 5, 5]
    resumed_from = re.search(r"the resume read (\w{26})", result.out)[1]
    assert listing[0]["id"] == resumed_from
    assert "$ gradvault ls --url http://127.0.0.1:" in result.out
    assert f"gradvault serve --store {store}" in result.out


def test_demo_against_a_given_service(gradvault_process, service: ServeProcess) -> None:
    result = gradvault_process("demo", "--url", service.url, "--token", WRITE_TOKEN)
    assert result.code == 0, result.out + result.err
    check_bit_identical(result.out)
    assert f"service: {service.url}" in result.out


def test_demo_keeps_serving_until_ctrl_c(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gradvault", "demo", "--keep-serving"],
        env=clean_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while not seen or not seen[-1].startswith("access log"):
            line = lines.get(timeout=DEADLINE_SECONDS)
            assert line is not None, "".join(seen) + process.stderr.read()
            seen.append(line)
        out = "".join(seen)
        check_bit_identical(out)
        url = re.search(r"service:  (http://127\.0\.0\.1:\d+)", out)[1]
        assert f"API docs: {url}/docs" in out
        assert httpx.get(f"{url}/docs", timeout=30).status_code == 200
        assert f"web page: {url}/ui" in out
        page = httpx.get(f"{url}/ui", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert httpx.get(f"{url}/v1/snapshots", timeout=30).json()["data"]
        logged = [json.loads(lines.get(timeout=DEADLINE_SECONDS)) for _ in range(3)]
        assert [(entry["path"], entry["status"]) for entry in logged] == [
            ("/docs", 200),
            ("/ui", 200),
            ("/v1/snapshots", 200),
        ]  # the access log follows, one JSON object per request
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate(timeout=DEADLINE_SECONDS)
            raise AssertionError(
                f"no exit {DEADLINE_SECONDS} s after SIGINT; stderr:\n{stderr}"
            ) from None
    errors = process.stderr.read()
    assert code == 0, errors
    assert "Traceback" not in errors and "ERROR" not in errors, errors
    assert lines.get(timeout=DEADLINE_SECONDS) == "stopping the service\n"
