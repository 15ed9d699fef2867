"""The spool sweep: a service SIGKILLed mid-upload leaves its spool file; the next service
to start on that spool folder removes it, and so does ``gradvault gc``; a file that a live
service is still writing is left alone by both."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.records.safetensors_file import safetensors_chunks
from gradvault.service.spool import SPOOL_PREFIX, SPOOL_SUFFIX, spool_locks, sweep_spool

from .processes import ServiceProcess

#: a bound on waiting for the service to spool the first bytes (not a timing assertion)
SPOOL_DEADLINE_SECONDS = 60


def _upload_body() -> bytes:
    gradient = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    record = GradientsParamsRecord([GradientRecordEntry.from_array(ParamId(7), "w", gradient)])
    return b"".join(bytes(piece) for piece in safetensors_chunks(record))


def _spool_files(spool: Path) -> list[Path]:
    return sorted(spool.glob(f"{SPOOL_PREFIX}*{SPOOL_SUFFIX}"))


@contextmanager
def _upload_in_flight(
    service: ServiceProcess, spool: Path
) -> Iterator[tuple[socket.socket, bytes]]:
    """An upload whose first bytes the service has spooled and whose rest is held back:
    the connection and the bytes still to send."""
    body = _upload_body()
    port = int(service.base_url.rsplit(":", 1)[1])
    connection = socket.create_connection(("127.0.0.1", port))
    head = (
        "POST /v1/snapshots?run=spool&step=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sent = len(body) // 2
    connection.sendall(head + body[:sent])
    deadline = time.monotonic() + SPOOL_DEADLINE_SECONDS
    while not any(path.stat().st_size for path in _spool_files(spool)):
        assert time.monotonic() < deadline, "the service never spooled the upload"
        time.sleep(0.05)
    try:
        yield connection, body[sent:]
    finally:
        connection.close()


def _kill(service: ServiceProcess) -> None:
    os.kill(service.pid, signal.SIGKILL)
    assert service.stop() == -signal.SIGKILL


def _service(store: Path, spool: Path) -> ServiceProcess:
    return ServiceProcess(str(store), env={"GRADVAULT_SPOOL_DIR": str(spool)})


def test_a_restart_sweeps_the_spool_file_of_a_service_killed_mid_upload(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    killed = _service(tmp_path / "store", spool)
    with _upload_in_flight(killed, spool):
        left = _spool_files(spool)
        _kill(killed)
    assert _spool_files(spool) == left and len(left) == 1  # the crash leaves it
    with _service(tmp_path / "store", spool) as restarted:
        assert _spool_files(spool) == []
        log = "".join(restarted.log)
    assert f"spool sweep: removed {left[0]}" in log


def test_a_starting_service_leaves_a_live_services_upload_alone(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    with _service(tmp_path / "store", spool) as writing:
        with _upload_in_flight(writing, spool) as (connection, rest):
            held = _spool_files(spool)
            with _service(tmp_path / "store", spool) as starting:
                assert "spool sweep" not in "".join(starting.log)
            assert _spool_files(spool) == held  # still there, still being written
            connection.sendall(rest)
            answer = connection.recv(4096)
        assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
    assert _spool_files(spool) == []


def _gc(store: Path, spool: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    return subprocess.run(
        [sys.executable, "-m", "gradvault", "gc", "--store", str(store), "--spool-dir", str(spool)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_gc_says_what_it_removed_from_the_spool_and_spares_live_uploads(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    spool, live_spool = tmp_path / "spool", tmp_path / "live-spool"
    spool.mkdir()
    live_spool.mkdir()
    killed = _service(store, spool)
    with _upload_in_flight(killed, spool):
        orphan = _spool_files(spool)[0]
        size = orphan.stat().st_size
        _kill(killed)
    with _service(store, live_spool) as live, _upload_in_flight(live, live_spool):
        held = _spool_files(live_spool)
        swept = _gc(store, spool)
        spared = _gc(store, live_spool)
        assert _spool_files(live_spool) == held
    assert swept.returncode == 0, swept.stderr
    assert _spool_files(spool) == []
    assert swept.stdout.splitlines()[1] == (
        f"removed 1 orphaned upload(s) ({size} bytes) from the spool folder {spool}: {orphan.name}"
    )
    assert spared.returncode == 0, spared.stderr
    assert spared.stdout.splitlines()[1] == (
        f"removed 0 orphaned upload(s) (0 bytes) from the spool folder {live_spool}"
    )


def test_the_sweep_leaves_other_files_links_and_this_process_own_uploads(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    orphan = spool / f"{SPOOL_PREFIX}orphan{SPOOL_SUFFIX}"
    orphan.write_bytes(b"x" * 10)
    other = spool / "notes.txt"
    other.write_text("not an upload")
    target = tmp_path / "elsewhere.safetensors"
    target.write_text("kept")
    (spool / f"{SPOOL_PREFIX}link{SPOOL_SUFFIX}").symlink_to(target)
    own = spool_locks.create(str(spool))
    try:
        swept = sweep_spool(str(spool))
        assert [(found.path, found.size) for found in swept] == [(str(orphan), 10)]
        assert os.path.exists(own) and other.exists() and target.read_text() == "kept"
    finally:
        os.remove(own)
        spool_locks.release(own)
    assert sweep_spool(str(tmp_path / "no-such-folder")) == []
