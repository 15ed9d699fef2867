"""Ctrl-C during ``gradvault demo`` (``make run``): one line, exit status 130.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group: the demo and the
trainer process it runs. The demo runs here in a process group of its own, and SIGINT goes
to that group once the trainer process has started (its first line is printed).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import clean_environment

DEADLINE_SECONDS = 180

# ``python -m gradvault`` with SIGINT at its default disposition and unblocked, as a shell
# starts a foreground job: a disposition of SIG_IGN, or a blocked mask, would otherwise pass
# from the test process (whatever an earlier test in it left) through exec to the demo,
# which would then never see the Ctrl-C.
AS_A_TERMINAL_STARTS_IT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
    "os.execv(sys.executable, [sys.executable, '-m', 'gradvault', *sys.argv[1:]])",
]


@pytest.mark.parametrize(
    "trainer_line", ["the trainer, a new process", "resume in a fresh process"]
)
def test_ctrl_c_in_the_demo_is_one_line_and_exit_130(tmp_path: Path, trainer_line: str) -> None:
    process = subprocess.Popen(
        [*AS_A_TERMINAL_STARTS_IT, "demo", "--service-store", str(tmp_path / "s")],
        env=clean_environment(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
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
        # the trainer's own lines start with its pid; SIGINT once it is running
        while not (seen and seen[-1].startswith("  [pid ") and trainer_line in "".join(seen)):
            line = lines.get(timeout=DEADLINE_SECONDS)
            assert line is not None, "".join(seen) + process.stderr.read()
            seen.append(line)
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(DEADLINE_SECONDS)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    errors = process.stderr.read()
    here = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert (code, errors) == (130, "gradvault demo: interrupted\n"), (errors, here)
