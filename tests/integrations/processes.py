"""Training phases in processes of their own, started without importing transformers anew.

A phase (``tests/integrations/hf_run.py``) run as ``python -m tests.integrations.hf_run``
spends most of its time importing torch, transformers and accelerate. Here each phase is
still its own process, with its own pid, killed by a real SIGKILL or stopped by a real
SIGTERM, but forked from a server process (multiprocessing's ``forkserver``) that has
imported ``hf_run`` once and has run nothing: the phase starts where a fresh interpreter
would be after its imports, with the environment, working folder and command line it is
given, its stdout and stderr its own.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: one server per test process, which imports hf_run (and so transformers) when it starts
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["tests.integrations.hf_run"])


def _ensure_server() -> None:
    """Start the server from the repository's root, where its preload finds ``tests``
    (Python 3.11's server takes its import path from its working folder)."""
    previous = os.getcwd()
    os.chdir(REPO)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.chdir(previous)


def _run_phase(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    stdout: Connection | None,
    stdout_path: str | None,
    stderr_path: str | None,
) -> None:
    """In the phase's process: its streams, folder and environment, then ``hf_run.main``."""
    if stdout is not None:
        os.dup2(stdout.fileno(), 1)
        stdout.close()
    for path, fd in ((stdout_path, 1), (stderr_path, 2)):
        if path is not None:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
    if stdout is None and stdout_path is None:
        _to_devnull(1)
    if stderr_path is None:
        _to_devnull(2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    from tests.integrations import hf_run  # imported by the server already: no cost

    sys.argv = [hf_run.__file__, *argv]  # as ``python -m`` sets it
    sys.exit(hf_run.main(argv))


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run the phase ``argv`` to its end; its exit status (negative: the signal that ended
    it, as ``subprocess`` gives it), stdout and stderr."""
    with _streams_folder() as folder:
        out, err = folder / "stdout", folder / "stderr"
        process = _CONTEXT.Process(
            target=_run_phase, args=(argv, str(cwd), env, None, str(out), str(err))
        )
        _ensure_server()
        process.start()
        code = _wait(process, timeout, argv)
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


@contextmanager
def _streams_folder() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="phase-") as folder:
        yield Path(folder)


@contextmanager
def started(argv: list[str], *, cwd: Path, env: dict[str, str]) -> Iterator[Phase]:
    """Start the phase ``argv`` with its stdout on a pipe and its stderr discarded; killed
    on the way out if still running."""
    reader, writer = _CONTEXT.Pipe(duplex=False)
    process = _CONTEXT.Process(target=_run_phase, args=(argv, str(cwd), env, writer, None, None))
    _ensure_server()
    process.start()
    writer.close()  # the phase holds the only write end: its exit is the pipe's end
    stdout = open(os.dup(reader.fileno()), encoding="utf-8")  # noqa: SIM115 - closed below
    reader.close()
    phase = Phase(process, stdout, argv)
    try:
        yield phase
    finally:
        stdout.close()
        if process.is_alive():
            process.kill()
        process.join()


class Phase:
    """A started phase: its pid, its stdout's lines, its exit status."""

    def __init__(self, process: BaseProcess, stdout: Iterator[str], argv: list[str]) -> None:
        self._process, self.stdout, self._argv = process, stdout, argv

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def wait(self, timeout: float) -> int:
        return _wait(self._process, timeout, self._argv)


def _wait(process: BaseProcess, timeout: float, argv: list[str]) -> int:
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise subprocess.TimeoutExpired(argv, timeout)
    return process.exitcode
