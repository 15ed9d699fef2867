"""The ``gradvault`` command run as a user runs it: a new process per command line.

``gradvault(*args)`` runs ``python -m gradvault ARGS`` and returns its exit status and
output; ``service`` is ``gradvault serve`` itself, a real uvicorn on 127.0.0.1 in its own
process, with a write and a read token, shared by the tests of a module (each test uses
its own run names).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
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


def run_gradvault(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
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


@pytest.fixture
def gradvault():
    return run_gradvault


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


@pytest.fixture(scope="module")
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
