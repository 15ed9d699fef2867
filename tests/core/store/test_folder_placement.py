"""A local store flags ``.staging/`` so the file system places each snapshot's folders
apart (ext2/3/4's "top of directory hierarchies", ``chattr +T``), and a file system that
refuses the flag loses nothing (docs/FORMAT.md, "Local I/O").

The flag is read and cleared here with the same two ioctls ``lsattr``/``chattr`` use;
where the tests' file system has no such flag the first tests are skipped.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import ParamId, Recorder
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import open_store

#: FS_IOC_GETFLAGS, FS_IOC_SETFLAGS (linux/fs.h: _IOR/_IOW('f', 1/2, long)), FS_TOPDIR_FL
_LONG = ctypes.sizeof(ctypes.c_long)
GET_FLAGS = 2 << 30 | _LONG << 16 | ord("f") << 8 | 1
SET_FLAGS = 1 << 30 | _LONG << 16 | ord("f") << 8 | 2
TOP_DIR = 0x00020000


def folder_flags(folder: Path) -> int:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, GET_FLAGS, flags, True)
        return flags[0]
    finally:
        os.close(fd)


def set_folder_flags(folder: Path, flags: int) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, SET_FLAGS, array.array("i", [flags]), True)
    finally:
        os.close(fd)


@pytest.fixture
def flaggable(tmp_path: Path) -> Path:
    """``tmp_path``, where its file system keeps the flag (skipped elsewhere)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("FS_TOPDIR_FL is a Linux inode flag")
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        set_folder_flags(probe, folder_flags(probe) | TOP_DIR)
    except OSError as error:
        pytest.skip(f"this file system keeps no FS_TOPDIR_FL: {error}")
    assert folder_flags(probe) & TOP_DIR
    return tmp_path


def record(seed: int) -> GradientsParamsRecord:
    values = np.random.default_rng(seed).standard_normal(1 << 12).astype(np.float32)
    return GradientsParamsRecord([GradientRecordEntry.from_array(ParamId(1), "w", values)])


def test_the_first_snapshot_flags_staging_and_nothing_else(flaggable: Path) -> None:
    store = flaggable / "store"
    with Recorder(store) as recorder:
        info = recorder.start_snapshot(record(0), run="r", step=1).result()
        assert recorder.sync.fetch(info.id) == record(0)
    assert folder_flags(store / ".staging") & TOP_DIR
    for unflagged in (store, store / "snapshots", store / "snapshots" / info.id):
        assert not folder_flags(unflagged) & TOP_DIR, unflagged


def test_a_store_made_without_the_flag_gets_it_at_its_next_write(flaggable: Path) -> None:
    store = flaggable / "store"
    with Recorder(store) as recorder:
        first = recorder.start_snapshot(record(0), run="r", step=1).result()
    set_folder_flags(store / ".staging", folder_flags(store / ".staging") & ~TOP_DIR)
    assert not folder_flags(store / ".staging") & TOP_DIR

    with Recorder(store) as reader:  # listing and reading change nothing
        assert [info.id for info in reader.sync.list()] == [first.id]
    assert not folder_flags(store / ".staging") & TOP_DIR

    with Recorder(store) as recorder:
        recorder.start_snapshot(record(1), run="r", step=2).result()
    assert folder_flags(store / ".staging") & TOP_DIR


async def test_a_file_system_that_refuses_the_flag_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every inode-flag call refused (as tmpfs, XFS or btrfs refuse this one): the store
    writes, commits and reads as ever, and warns of nothing."""
    real_ioctl = fcntl.ioctl
    refused: list[int] = []

    def refusing(fd: int, request: int, *args: object) -> object:
        if request in (GET_FLAGS, SET_FLAGS):
            refused.append(request)
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        return real_ioctl(fd, request, *args)  # type: ignore[call-overload]

    monkeypatch.setattr(fcntl, "ioctl", refusing)
    caplog.set_level(logging.WARNING, logger="gradvault")
    store = open_store(tmp_path / "store")
    try:
        info = await store.write_snapshot(record(2), run="r", step=3)
        assert await store.read_snapshot(info.id) == record(2)
        assert [listed.id for listed in await store.list()] == [info.id]
    finally:
        await store.close()
    assert refused == [GET_FLAGS]
    assert caplog.records == []
