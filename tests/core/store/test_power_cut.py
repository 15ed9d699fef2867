"""A power cut right after a write returns, on a real ext4 without a journal.

The store lives on ext4 made without a journal (as this project's machines have it) in an
image file mounted through a loop device. Right after a write returns, the image file is
copied: the copy holds what the device was sent, and nothing of what the kernel still
keeps in memory, which a power cut would lose. The copy is mounted as it is (such a file
system mounts without a check) and, copied again, after the check an operator runs
(``e2fsck -f -y``: on this file system no fsync writes the allocation bitmaps, so there
is always something to repair). Either way every committed snapshot must be there once,
under ``snapshots/`` only (a second name of its folder left in ``.staging/`` would be
emptied by gc as an abandoned write), survive gc, and read back bit for bit; so must a
store's first snapshot and the folders it made, a recorder's queued snapshots with their
retention, and a delete stay done. And where an older commit left such a name (one that
fsynced ``snapshots/`` alone), gc leaves it. Needs root (mount, loop devices) and
e2fsprogs; skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import ParamId, Recorder
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, new_snapshot_id, open_store

TOOLS = ("mkfs.ext4", "e2fsck", "losetup", "mount", "umount")
IMAGE_BYTES = 64 << 20

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid")
    or os.geteuid() != 0
    or any(shutil.which(tool) is None for tool in TOOLS),
    reason="needs root, loop devices and e2fsprogs (mkfs.ext4, losetup, mount)",
)


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr.strip()}"
    return done.stdout.strip()


def _loop_device(image: Path) -> str:
    """A free loop device now backed by ``image`` (tried again where another process took
    the same free device first)."""
    for _ in range(5):
        done = subprocess.run(
            ["losetup", "--find", "--show", str(image)], capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0:
            return done.stdout.strip()
    pytest.skip(f"no loop device to be had here: {done.stderr.strip()}")


def _repair(image: Path) -> None:
    """``e2fsck -f -y`` of ``image``: exit 0 (clean) or 1 (repaired), not 4 (left broken)."""
    done = subprocess.run(
        ["e2fsck", "-f", "-y", str(image)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1), f"e2fsck -y exited {done.returncode}: {done.stdout}"


@contextlib.contextmanager
def _mounted(image: Path, folder: Path) -> Iterator[Path]:
    """``image`` mounted at ``folder`` through a loop device of its own."""
    folder.mkdir(exist_ok=True)
    device = _loop_device(image)
    try:
        _run("mount", "-t", "ext4", device, str(folder))
        try:
            yield folder
        finally:
            _run("umount", str(folder))
    finally:
        _run("losetup", "--detach", device)


def _cut(image: Path, tmp_path: Path) -> Path:
    """A copy of ``image`` as the device holds it now: the power cut."""
    cut = tmp_path / "cut.img"
    shutil.copyfile(image, cut)
    return cut


def _after(cut: Path, tmp_path: Path) -> Iterator[Path]:
    """The store's folder in ``cut`` mounted as it is, then in a copy checked and
    repaired (``e2fsck -f -y``)."""
    repaired = tmp_path / "repaired.img"
    shutil.copyfile(cut, repaired)
    _repair(repaired)
    for name, copy in (("as-is", cut), ("repaired", repaired)):
        with _mounted(copy, tmp_path / name) as folder:
            yield folder


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the mounted folder of a fresh ext4 without a journal, its image file)."""
    image = tmp_path / "disk.img"
    with open(image, "wb") as file:
        file.truncate(IMAGE_BYTES)
    _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image))
    with _mounted(image, tmp_path / "disk") as folder:
        yield folder, image


def _record(seed: int, length: int = 1 << 14) -> GradientsParamsRecord:
    rng = np.random.default_rng(seed)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                ParamId(1), "w", rng.standard_normal(length).astype("f4")
            ),
            GradientRecordEntry.from_array(ParamId(2), "b", rng.standard_normal(8).astype("f4")),
        ]
    )


def _other_names(root: Path) -> list[str]:
    """The ``.staging/`` entries that are another name of a committed folder (a snapshot's,
    or a rank's in it)."""
    committed = set()
    for snapshot in (root / "snapshots").iterdir():
        folders = [snapshot, *(snapshot / "ranks").glob("*")] if snapshot.is_dir() else []
        committed.update(os.lstat(folder).st_ino for folder in folders if folder.is_dir())
    return [entry.name for entry in os.scandir(root / ".staging") if entry.inode() in committed]


async def _commit(store: SnapshotStore, kind: str) -> str:
    """Write the snapshot of ``kind``; its id."""
    if kind == "one step":  # a snapshot of one chunk, written and committed in one call
        info = store.write_snapshot_blocking(_record(1), run="r", step=1)
    elif kind == "on the loop":  # several chunks: written, then committed in its turn
        info = await store.write_snapshot(_record(2, 1 << 16), run="r", step=2)
    elif kind == "into a spare folder":  # a deleted snapshot's folder written again
        doomed = store.write_snapshot_blocking(_record(3), run="r", step=3)
        assert doomed is not None
        await store.delete(doomed.id)
        os.sync()  # the spare folder's name is on the device
        info = store.write_snapshot_blocking(_record(4), run="r", step=4)
    else:  # "sharded": two ranks, the second commits the set
        snapshot_id = new_snapshot_id()
        for rank in range(2):
            written = await store.write_shard(
                _record(10 + rank),
                snapshot_id=snapshot_id,
                rank=rank,
                world_size=2,
                run="r",
                step=5,
            )
        info = written.snapshot
    assert info is not None
    return info.id


async def _contents(store: SnapshotStore) -> dict[tuple[str, int | None], GradientsParamsRecord]:
    """Every committed snapshot's gradients, each rank's of a sharded one."""
    found = {}
    for info in await store.list():
        for rank in range(info.world_size) if info.world_size else [None]:
            found[(info.id, rank)] = await store.read_snapshot(info.id, rank=rank)
    return found


@pytest.mark.parametrize("kind", ["one step", "on the loop", "into a spare folder", "sharded"])
async def test_a_power_cut_after_a_commit_returns_loses_nothing(
    disk: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    folder, image = disk
    store = open_store(folder / "store", chunk_bytes=1 << 17)
    assert store.write_snapshot_blocking(_record(0), run="r", step=0) is not None
    os.sync()  # everything before the commit under test is on the device
    snapshot_id = await _commit(store, kind)
    cut = _cut(image, tmp_path)  # what the device holds the moment the write returned
    expected = await _contents(store)
    assert len(expected) == (3 if kind == "sharded" else 2)
    assert snapshot_id in {found for found, _ in expected}
    await store.close()

    for after in _after(cut, tmp_path):
        assert _other_names(after / "store") == []
        restored = open_store(after / "store")
        await restored.gc(grace_seconds=0)
        assert await _contents(restored) == expected
        await restored.close()


async def test_gc_leaves_a_stale_staging_name_of_a_committed_folder(
    disk: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit that fsynced ``snapshots/`` alone after its rename (as releases before
    ``.staging/`` was fsynced too did), then a power cut: the committed folder has a second
    name in ``.staging/``. gc must leave that name alone, and the snapshot must read."""
    folder, image = disk
    root = folder / "store"
    store = open_store(root)
    info = store.write_snapshot_blocking(_record(0), run="r", step=0)
    assert info is not None
    expected = await store.read_snapshot(info.id)
    await store.close()
    committed, staged = root / "snapshots" / info.id, root / ".staging" / info.id
    os.rename(committed, staged)
    os.sync()  # staged, as a commit finds it before its rename
    os.rename(staged, committed)
    descriptor = os.open(root / "snapshots", os.O_RDONLY)
    try:
        os.fsync(descriptor)  # the rename made durable in snapshots/ only
    finally:
        os.close(descriptor)
    cut = _cut(image, tmp_path)

    with _mounted(cut, tmp_path / "after") as after:
        assert _other_names(after / "store") == [info.id]  # the state this test is about
        restored = open_store(after / "store")
        assert await restored.gc(grace_seconds=0) == []
        assert "is another name of the committed folder" in caplog.text
        assert await restored.read_snapshot(info.id) == expected
        await restored.close()


async def test_a_power_cut_after_the_first_snapshot_keeps_the_folders_it_made(
    disk: tuple[Path, Path], tmp_path: Path
) -> None:
    """The first snapshot of a store two folders below the disk's root makes those
    folders, the store's own and its documents: all of them durable once it returns."""
    folder, image = disk
    os.sync()
    store = open_store(folder / "a" / "b" / "store")
    info = store.write_snapshot_blocking(_record(0), run="r", step=0)
    assert info is not None
    cut = _cut(image, tmp_path)
    expected = await _contents(store)
    await store.close()

    for after in _after(cut, tmp_path):
        restored = open_store(after / "a" / "b" / "store")
        assert await _contents(restored) == expected
        await restored.close()


@pytest.mark.parametrize("spare", [True, False], ids=["kept-spare", "removed"])
async def test_a_power_cut_after_a_delete_returns_keeps_it_deleted(
    disk: tuple[Path, Path], tmp_path: Path, spare: bool
) -> None:
    """A delete that returned stays done: the snapshot is not listed after the cut, and
    the one kept reads. Its folder is kept as a spare (a store that commits in one step
    keeps up to ``spare_folders``) or removed."""
    folder, image = disk
    store = open_store(folder / "store")
    kept = store.write_snapshot_blocking(_record(0), run="r", step=1)
    doomed = store.write_snapshot_blocking(_record(1), run="r", step=2)
    assert kept is not None and doomed is not None
    store.backend.spare_folders = 2 if spare else 0  # type: ignore[attr-defined]
    os.sync()
    await store.delete(doomed.id)
    cut = _cut(image, tmp_path)
    staged = os.listdir(folder / "store" / ".staging")
    assert any(name.startswith(".spare-") for name in staged) is spare
    expected = await _contents(store)
    await store.close()
    assert doomed.id not in {found for found, _ in expected}

    for after in _after(cut, tmp_path):
        restored = open_store(after / "store")
        assert await _contents(restored) == expected
        # the deleted folder is named in .staging/, where gc takes it (not lost nameless)
        removed = await restored.gc(grace_seconds=0)
        assert [name for name in removed if name.startswith(doomed.id)], removed
        assert await _contents(restored) == expected
        await restored.close()


def test_a_power_cut_after_queued_snapshots_return_keeps_every_one(
    disk: tuple[Path, Path], tmp_path: Path
) -> None:
    """A recorder's snapshots started back to back (queued, each renamed in its turn, with
    ``keep_last`` deleting the oldest after each) are all durable once their handles
    return: the cut holds exactly what the store listed."""
    folder, image = disk
    with Recorder(folder / "store", keep_last=3) as recorder:
        handles = [recorder.start_snapshot(_record(seed), run="r", step=seed) for seed in range(6)]
        infos = [handle.result(60) for handle in handles]
        cut = _cut(image, tmp_path)
        listed = [info.id for info in recorder.sync.list()]
    assert sorted(listed) == [info.id for info in infos[-3:]]  # keep_last=3: the newest three

    for after in _after(cut, tmp_path):
        assert _other_names(after / "store") == []
        with Recorder(after / "store") as restored:
            assert [info.id for info in restored.sync.list()] == listed
            for info, seed in zip(infos[-3:], range(3, 6), strict=True):
                assert restored.sync.fetch(info.id) == _record(seed)
