"""The spool folder: upload files that the process writing them holds locked, and the sweep
that removes the ones no live process holds.

An upload is spooled to ``gradvault-upload-*.safetensors`` in the spool folder (the
system's temporary folder unless ``spool_dir`` says otherwise) and removed once committed
or refused. A service killed meanwhile (SIGKILL, the OOM killer, a power cut) leaves its
file behind; nothing else would ever remove it, and a spool folder that fills refuses
every later upload (507).

Which files are orphans is decided by a lock, not by a pid or an age: the process that
creates a spool file takes an exclusive ``flock`` on it at once and keeps the descriptor
until the file is removed. The kernel lets the lock go when that process ends, however it
ends, so a file whose lock can be taken belongs to nobody. Several service processes may
share one spool folder: each sweeps at start-up and removes only files without a holder,
never another live process's upload. A sweeper that takes the lock checks the name still
names the file it locked before it removes it, and a writer that finds its new file swept
in the instant before it locked it makes another.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from dataclasses import dataclass

SPOOL_PREFIX = "gradvault-upload-"
SPOOL_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class SweptFile:
    """A spool file the sweep removed: its path and its size in bytes."""

    path: str
    size: int


def spool_folder(spool_dir: str | None) -> str:
    """The folder uploads are spooled to: ``spool_dir``, or the system's temporary folder."""
    return spool_dir if spool_dir is not None else tempfile.gettempdir()


def _same_file(path: str, descriptor: int) -> bool:
    """Whether ``path`` still names the file open as ``descriptor``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class SpoolLocks:
    """The spool files this process holds: each one's locked descriptor, by path."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._guard = threading.Lock()

    def create(self, spool_dir: str | None) -> str:
        """A new, empty spool file in ``spool_dir``, locked by this process until
        :meth:`release`; OSError if the folder cannot hold one."""
        while True:
            descriptor, path = tempfile.mkstemp(
                prefix=SPOOL_PREFIX, suffix=SPOOL_SUFFIX, dir=spool_dir
            )
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except BaseException:
                os.close(descriptor)
                raise
            if _same_file(path, descriptor):
                with self._guard:
                    self._held[path] = descriptor
                return path
            os.close(descriptor)  # a sweep took it before the lock did: make another

    def release(self, path: str) -> None:
        """Let the lock on ``path`` go (after the file is removed); unknown paths are fine."""
        with self._guard:
            descriptor = self._held.pop(path, None)
        if descriptor is not None:
            os.close(descriptor)

    def holds(self, path: str) -> bool:
        """Whether this process holds ``path``."""
        with self._guard:
            return path in self._held


#: the spool files of this process (a lock belongs to the process, so one registry does)
spool_locks = SpoolLocks()


def _sweep_one(path: str) -> SweptFile | None:
    """Remove ``path`` if no process holds its lock; what was removed, or None."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # gone meanwhile, a link, or not ours to read
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a live process is writing it
        if not _same_file(path, descriptor):
            return None
        size = os.fstat(descriptor).st_size
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return SweptFile(path, size)
    finally:
        os.close(descriptor)


def sweep_spool(spool_dir: str | None) -> list[SweptFile]:
    """Remove every upload spool file in the spool folder that no live process holds
    (left by a process that died mid-upload); the files removed.

    Other files in the folder, links and folders are left alone; a folder that is not
    there has nothing to sweep.
    """
    folder = spool_folder(spool_dir)
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    swept = []
    for entry in entries:
        name = entry.name
        if not (name.startswith(SPOOL_PREFIX) and name.endswith(SPOOL_SUFFIX)):
            continue
        if not entry.is_file(follow_symlinks=False) or spool_locks.holds(entry.path):
            continue
        removed = _sweep_one(entry.path)
        if removed is not None:
            swept.append(removed)
    return swept
