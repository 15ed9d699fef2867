"""The ``gradvault`` command run as a user runs it, in this process or in a new one.

``gradvault(*args)`` runs ``gradvault.client.cli.main(ARGS)`` in this process, as a fresh
process would: the environment (``env``, by default this one without any GRADVAULT_*
variable) and working folder (``cwd``) it is given, stdout and stderr captured, a fresh
process's warning filters and its bare root logger (so a warning or a logged error reaches
stderr as it would there); it returns the exit status and output, and fails the test if
the command left anything behind in this process (an environment variable, the working
folder, a logging handler, a signal handler, a running event loop, a thread).
``gradvault_process(*args)`` runs ``python -m gradvault ARGS`` in a new process: kept for
what only a process shows (the console script, signals, the umask, a terminal, the demo's
processes, a real ``serve``). ``service`` is ``gradvault serve`` itself, a real uvicorn on
127.0.0.1 in its own process, with a write and a read token, shared by the whole session
(each test uses its own run names).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.client.cli import main
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.file_mode import current_umask
from gradvault.core.records.safetensors_file import safetensors_chunks

WRITE_TOKEN = "cli-test-write-token"
READ_TOKEN = "cli-test-read-token"
COMMAND_TIMEOUT_SECONDS = 180
STARTUP_DEADLINE_SECONDS = 60
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without any GRADVAULT_* variable, plus ``extra``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    environment.update(extra)
    return environment


@dataclass
class Result:
    """What one command line did: exit status, stdout, stderr."""

    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_gradvault_process(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Result:
    """``python -m gradvault ARGS`` in a new process."""
    done = subprocess.run(
        [sys.executable, "-m", "gradvault", *args],
        env=env if env is not None else clean_environment(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


#: the warning filters of a Python process started without -W, -X dev or PYTHONWARNINGS
_FRESH_PROCESS_WARNING_FILTERS: list[tuple[str, type[Warning], str]] = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
]


def _write_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """Print a warning on (the captured) stderr, as a fresh process does."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _process_state() -> dict[str, Any]:
    """What one command line could leave behind in this process."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {
        "environment": dict(os.environ),
        "working folder": os.getcwd(),
        "logging handlers": {
            logger.name: list(logger.handlers)
            for logger in loggers
            if isinstance(logger, logging.Logger) and logger.handlers
        },
        "signal handlers": {number: signal.getsignal(number) for number in signal.valid_signals()},
        "event loop policy": asyncio.get_event_loop_policy(),
        "umask": current_umask(),
    }


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_gradvault(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    """``gradvault.client.cli.main(ARGS)`` in this process, as a fresh process would run it."""
    before = _process_state()
    threads_before = set(threading.enumerate())
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(clean_environment() if env is None else env)
        if cwd is not None:
            os.chdir(cwd)
        # a fresh process's root logger has no handler: what is logged at WARNING and above
        # goes to stderr through logging's last resort, as it would there
        root.handlers = []
        root.setLevel(logging.WARNING)
        with warnings.catch_warnings(), redirect_stdout(out), redirect_stderr(err):
            warnings.resetwarnings()
            for action, category, module in reversed(_FRESH_PROCESS_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _write_warning
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse's --help and --version
                code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
                if isinstance(exit.code, str):
                    print(exit.code, file=sys.stderr)
        left = {
            "root logging handlers": root.handlers[:],
            "running event loop": _running_loop(),
        }
    finally:
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        os.chdir(before["working folder"])
        os.environ.clear()
        os.environ.update(before["environment"])
    after = _process_state()
    changed = {
        name: (before[name], after[name])
        for name in before
        if name not in ("environment", "working folder") and before[name] != after[name]
    }
    left["threads started"] = set(threading.enumerate()) - threads_before
    assert not changed, f"gradvault {' '.join(args)} left this process changed: {changed}"
    assert left == {
        "root logging handlers": [],
        "running event loop": None,
        "threads started": set(),
    }, left
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def gradvault():
    """Run a command line in this process (see :func:`run_gradvault`)."""
    return run_gradvault


@pytest.fixture
def gradvault_process():
    """Run a command line in a new process (see :func:`run_gradvault_process`)."""
    return run_gradvault_process


class ServeProcess:
    """``gradvault serve ARGS`` in its own process; ``url`` once it listens."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gradvault", "serve", "--port", "0", *args],
            env=env if env is not None else clean_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.port: int | None = None
        listening = threading.Event()

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                match = _LISTENING.search(line)
                if match and self.port is None:
                    self.port = int(match[1])
                    listening.set()
            listening.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not listening.wait(STARTUP_DEADLINE_SECONDS) or self.port is None:
            self.stop(signal.SIGKILL)
            raise RuntimeError("gradvault serve did not start:\n" + "".join(self.log))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, signum: int = signal.SIGINT) -> int:
        """Send ``signum`` and wait; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(STARTUP_DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(STARTUP_DEADLINE_SECONDS)
        return self.process.returncode


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``gradvault serve`` with a write and a read token over a fresh local store."""
    store = tmp_path_factory.mktemp("served") / "store"
    served = ServeProcess(
        "--store",
        str(store),
        "--tokens",
        f"{WRITE_TOKEN}:write,{READ_TOKEN}:read",
        "--index-refresh-seconds",
        "0",
    )
    yield served
    assert served.stop() == 0, "".join(served.log)


def make_record(seed: int = 0, nonfinite: bool = False) -> GradientsParamsRecord:
    """Three gradients (float32, float64, a scalar); with ``nonfinite``, a NaN and two Infs."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    if nonfinite:
        weight[0, 0] = np.nan
        weight[1, 1] = np.inf
        weight[2, 2] = -np.inf
    arrays = {
        "fc.weight": weight,
        "fc.bias": rng.standard_normal(4),
        "scale": np.array(rng.standard_normal(), dtype=np.float32),
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()]
    )


def write_safetensors(path: Path, record: GradientsParamsRecord) -> Path:
    with open(path, "wb") as file:
        for chunk in safetensors_chunks(record):
            file.write(chunk)
    return path


@pytest.fixture
def gradients_file(tmp_path: Path) -> tuple[Path, GradientsParamsRecord]:
    record = make_record(seed=1)
    return write_safetensors(tmp_path / "grads.safetensors", record), record
