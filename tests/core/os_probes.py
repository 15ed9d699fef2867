"""What the kernel sees of a test: mapped file pages resident, a file's pages in the page
cache, and the fsync/rename order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def page_cached(path: Path, offset: int) -> bool:
    """Whether the page of ``path`` at ``offset`` is in the page cache: a read with
    RWF_NOWAIT, which reads only what is cached (a miss starts reading that page and a few
    after it: ask once per page)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], offset, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def mapped_rss(path: Path) -> int:
    """Bytes of the file at ``path`` resident in this process through its mappings."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def record_fsyncs_and_renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """From now on (until ``monkeypatch.undo()``), every ``os.fsync`` and ``os.rename`` in
    order, after it returned: ("fsync", the path of the descriptor) or ("rename", source)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def recording_rename(source: object, destination: object) -> None:
        real_rename(source, destination)
        events.append(("rename", str(source)))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    return events
