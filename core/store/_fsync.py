"""Making a local store's files and folders durable.

Each is fsynced through a descriptor of its own (read-only will do): in the calling thread,
one after the other, while the device's fsyncs are quick, or several at once in threads of
their own while they are slow (:class:`FsyncTogether`). The folders a store's first
snapshot makes are made one by one (:func:`make_folders`), so that each one's entry can be
made durable in the folder that holds it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


def fsync_directory(path: str) -> None:
    """fsync the folder at ``path``."""
    fd = os.open(path, _DIRECTORY_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folders(path: Path) -> list[Path]:
    """Make the folder ``path`` and every missing folder above it (as ``mkdir -p``); the
    folders this call made, outermost first (none where ``path`` was there)."""
    missing = []
    while not path.is_dir() and path != path.parent:
        missing.append(path)
        path = path.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by someone else, who makes it durable
        made.append(folder)
    return made


def fsync_paths(paths: list[str]) -> None:
    """fsync each file or folder of ``paths``, in order (a read-only descriptor will do)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FsyncTogether:
    """fsyncs several files and folders, from any thread: one after the other in the
    calling thread while this device's fsyncs are quick, at once in a few threads of its
    own while they are slow.

    Every fsync on ext4 ends with a flush of the device's write cache, even when the first
    one already made every change durable. Where a flush is slow (1-4 ms each, measured
    on an earlier machine of this project's), the six fsyncs of a small snapshot issued
    together overlap their flushes. Where it is quick (0.07-0.09 ms for a folder or a file
    whose writeback was started, 0.47 ms for the chunk written with ``O_DIRECT``, on ext4
    without a journal), handing an fsync to another thread costs more than it saves: on
    two busy cores each hand-over took ~0.15 ms of CPU, and a commit of the MLP's 8.4 MB
    took 0.33-0.50 ms less CPU with its fsyncs in line, its wall time within 0.3 ms either
    way (docs/FORMAT.md, "Local I/O"). So each round made in line is timed (its opens and
    fsyncs), and the moving average of its mean per path (capped at ``SAMPLE_CAP``)
    decides: in line below ``IN_LINE_BELOW``, together above, with one call in
    ``PROBE_EVERY`` made in line all the same to measure again (rounds made together are
    not timed: their fsyncs wait for each other's flushes, so their times would say
    nothing of one alone). The threads only ever fsync, so a writer thread that waits
    for them cannot deadlock the store's own pool.
    """

    #: Mean fsync time (seconds) under which fsyncs run one after the other in line.
    IN_LINE_BELOW = 0.5e-3
    #: Weight of the latest in-line call's mean fsync time in the moving average.
    WEIGHT = 0.25
    #: A call's mean counts for at most this much (seconds): one stall (writeback of
    #: someone else's files, a busy device) does not send fsyncs to the threads, nor keep
    #: them there for hundreds of commits; fsyncs slow call after call still do.
    SAMPLE_CAP = 2 * IN_LINE_BELOW
    #: While fsyncs run together, one call in this many runs in line, to measure again.
    PROBE_EVERY = 32

    def __init__(self, threads: int = 8) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._calls = 0
        #: moving average of the mean time of one fsync made in line (seconds); 0 at first
        self.mean_fsync_seconds = 0.0

    def in_line(self) -> bool:
        """Whether fsyncs run one after the other in the calling thread now."""
        return self.mean_fsync_seconds < self.IN_LINE_BELOW

    def fsync(self, paths: list[str]) -> None:
        """fsync every path of ``paths`` (in line or all at once, see the class); raises
        the first failure."""
        if not paths:
            return
        with self._lock:
            self._calls += 1
            probe = self._calls % self.PROBE_EVERY == 0
        if len(paths) == 1 or probe or self.in_line():
            start = time.perf_counter()
            fsync_paths(paths)
            mean = min((time.perf_counter() - start) / len(paths), self.SAMPLE_CAP)
            with self._lock:
                self.mean_fsync_seconds += self.WEIGHT * (mean - self.mean_fsync_seconds)
            return
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, "gradvault-fsync")
            executor = self._executor
        futures = [executor.submit(fsync_paths, [path]) for path in paths[1:]]
        try:
            fsync_paths(paths[:1])  # this thread takes one itself
        finally:
            concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    @property
    def started(self) -> bool:
        """Whether fsyncs were ever handed to threads of its own (not closed since)."""
        with self._lock:
            return self._executor is not None

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
