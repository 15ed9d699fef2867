"""A local commit's last fsyncs: in the committing thread while fsyncs are quick, in
threads of their own while they are slow (the local backend's ``fsyncs``).

The fsyncs are counted, not made (a unit test of the choice), and a fake clock says how
long each took, so nothing here depends on this machine's disk or timing.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gradvault.core.store import open_store


class FakeFsyncs:
    """os.fsync replaced: each call advances a fake clock by ``seconds`` and records the
    path and the thread it ran in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seconds = 0.0
        self.now = 0.0
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._monkeypatch = monkeypatch

    def fsync(self, fd: int) -> None:
        with self._lock:
            self.now += self.seconds
            self.calls.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name))

    def clock(self) -> float:
        return self.now

    def round(self, fsyncs: object, paths: list[str]) -> list[tuple[str, str]]:
        """One call of ``fsyncs.fsync(paths)`` with the fakes in place; its fsyncs."""
        self.calls = []
        with self._monkeypatch.context() as patch:
            patch.setattr(os, "fsync", self.fsync)
            patch.setattr(time, "perf_counter", self.clock)
            fsyncs.fsync(paths)  # type: ignore[attr-defined]
        return self.calls


@pytest.fixture
def paths(tmp_path: Path) -> list[str]:
    """A chunk, a document and their folder, as a commit's first round has them."""
    folder = tmp_path / "packed"
    folder.mkdir()
    for name in ("c.0", "zarr.json"):
        (folder / name).write_bytes(b"x")
    return [str(folder / "c.0"), str(folder / "zarr.json"), str(folder)]


def test_quick_fsyncs_run_in_line_and_slow_ones_together(
    tmp_path: Path, paths: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    fsyncs = store.backend.fsyncs  # type: ignore[attr-defined]
    fsyncs.PROBE_EVERY = 4
    fake = FakeFsyncs(monkeypatch)
    me = threading.current_thread().name
    try:
        fake.seconds = 0.1e-3  # quick: every fsync in this thread, in order
        for _ in range(5):
            calls = fake.round(fsyncs, paths)
            assert calls == [(path, me) for path in paths]
        assert fsyncs.in_line()
        assert 0 < fsyncs.mean_fsync_seconds <= 0.1e-3

        fake.seconds = 50e-3  # one stall: still in line after it
        fake.round(fsyncs, paths)
        assert fsyncs.in_line()
        fake.seconds = 0.1e-3
        fake.round(fsyncs, paths)

        fake.seconds = 4e-3  # slow call after call: the calls that measure it are in line ...
        for _ in range(5):
            assert {thread for _, thread in fake.round(fsyncs, paths)} == {me}
            if not fsyncs.in_line():
                break
        assert not fsyncs.in_line()
        together = [fake.round(fsyncs, paths) for _ in range(8)]
        for calls in together:  # ... every fsync made once per call, however it is made
            assert sorted(path for path, _ in calls) == sorted(paths)
        threads = [{thread for _, thread in calls} for calls in together]
        # all but the probes (one call in PROBE_EVERY) hand fsyncs to the threads
        handed = [names for names in threads if names != {me}]
        assert len(handed) >= 5
        assert all(any(name.startswith("gradvault-fsync") for name in names) for names in handed)

        fake.seconds = 0.05e-3  # quick again: the probes bring it back in line
        for _ in range(40):
            fake.round(fsyncs, paths)
        assert fsyncs.in_line()
        assert {thread for _, thread in fake.round(fsyncs, paths)} == {me}
    finally:
        fsyncs.close()


def test_a_missing_path_fails_the_round_in_line_and_together(
    tmp_path: Path, paths: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    fsyncs = store.backend.fsyncs  # type: ignore[attr-defined]
    gone = [*paths, str(tmp_path / "gone")]
    try:
        with pytest.raises(FileNotFoundError):
            fsyncs.fsync(gone)
        fsyncs.mean_fsync_seconds = 1.0  # as if this device's fsyncs were slow
        assert not fsyncs.in_line()
        with pytest.raises(FileNotFoundError):
            fsyncs.fsync(gone)
    finally:
        fsyncs.close()
