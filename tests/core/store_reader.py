"""A separate process that reads a store on request, so that a hang or a crash fails a test.

``python -m tests.core.store_reader [ADDRESS_SPACE_BYTES]`` caps its own address space
(RLIMIT_AS) when given a limit, prints ``ready``, then answers one JSON line per JSON
request line on stdin. Each request names a store (``url``, ``options``) and an ``op``:
``list``, ``info``, ``read_snapshot``, ``read_gradient`` (``param_id``), ``restore`` (the
recorder's restore, whose tensors the process then holds) or ``held`` (the held tensors
again, read after whatever the test did to the store's files meanwhile). A fresh store
serves every request, so nothing is cached between them.

An answer is ``{"result": ...}`` or ``{"error": class name, "gradvault": bool, "message"}``,
plus ``rss_before`` (the resident set as the request came) and ``peak_rss`` (its
highest while the request was served), in bytes. Gradients are
answered as ``[param_id, name, dtype, shape, sha256 of their raw bytes]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import gradvault.core as gv
from gradvault.core.errors import GradvaultError
from gradvault.core.store import open_store

_held: gv.GradientsParams | None = None


def digest(array: Any) -> str:
    """The sha256 of an array's raw bytes (no copy of a contiguous array; as bytes, since
    a bfloat16 array offers no buffer of its own)."""
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8)).hexdigest()


def _entry(param_id: object, name: str, array: Any) -> list:
    return [str(param_id), name, str(array.dtype), list(array.shape), digest(array)]


async def _perform(request: dict[str, Any]) -> Any:
    global _held
    op = request["op"]
    if op == "held":
        assert _held is not None
        return [_entry(pid, _held.name(pid), _held.get(pid).numpy()) for pid in _held]
    url, options = request["url"], request.get("options", {})
    if op == "restore":
        recorder = gv.Recorder(url, **options)
        try:
            _held = await recorder.restore(request["id"])
        finally:
            await recorder.aclose()
        return [_entry(pid, _held.name(pid), _held.get(pid).numpy()) for pid in _held]
    async with open_store(url, **options) as store:
        if op == "list":
            return [info.id for info in await store.list()]
        if op == "info":
            return (await store.info(request["id"]))["id"]
        if op == "read_snapshot":
            record = await store.read_snapshot(request["id"])
            return [_entry(e.param_id, e.name, e.array) for e in record]
        if op == "read_gradient":
            e = await store.read_gradient(request["id"], request["param_id"])
            return _entry(e.param_id, e.name, e.array)
    raise ValueError(f"unknown op {op!r}")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise LookupError(field)


def _reset_peak() -> int:
    """Restart the peak resident set at the current one (Linux); the current one.

    getrusage's ru_maxrss cannot serve: it keeps the high-water mark of the process this
    one was forked from (the test's, as large as its arrays), and it never goes down.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass  # then the peak since start: the imports, no more
    return _status_bytes("VmRSS")


def _peak() -> int:
    return _status_bytes("VmHWM")


def main() -> None:
    if len(sys.argv) > 1:
        limit = int(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        before = _reset_peak()
        try:
            answer: dict[str, Any] = {"result": asyncio.run(_perform(request))}
        except Exception as error:  # every failure is reported to the test
            answer = {
                "error": type(error).__name__,
                "gradvault": isinstance(error, GradvaultError),
                "message": str(error),
            }
        answer["rss_before"], answer["peak_rss"] = before, _peak()
        print(json.dumps(answer), flush=True)


class ReaderProcess:
    """The test's side: starts the reader (again, once it died) and asks it with a timeout.

    A request that gets no answer within ``timeout`` seconds kills the reader and fails
    the test as a hang; a reader that dies (a signal such as SIGBUS) fails it as a crash.
    """

    def __init__(self, address_space: int | None = None) -> None:
        self._address_space = address_space
        self._process: subprocess.Popen[str] | None = None
        self._stderr: Any = None

    def _start(self) -> subprocess.Popen[str]:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        limit = [] if self._address_space is None else [str(self._address_space)]
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.core.store_reader", *limit],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", self._stderr_tail()
        return process

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-3000:]

    def ask(self, request: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            self._process = self._start()
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise AssertionError(f"{request['op']} gave no answer within {timeout} s: {request}")
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            self._process = None
            raise AssertionError(
                f"the reader died (exit status {code}) during {request}:\n{self._stderr_tail()}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


if __name__ == "__main__":
    main()
