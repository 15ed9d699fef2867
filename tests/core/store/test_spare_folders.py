"""Spare folders: a local store that commits snapshots of one chunk keeps the folder of a
snapshot it deleted, and its next such commit writes its two files again in place, with
no new folder or file (docs/FORMAT.md, "Commit protocol"). What a reader sees never
changes: the new snapshot's bytes and document only, a file someone has open is never
written again, and nothing is left behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import crc32c_rs
import numpy as np
import pytest

from gradvault.core import GradientsParams, ParamId, Recorder, StoreUnavailableError
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.store import open_store

zarr = pytest.importorskip("zarr")

#: the names under ``.staging/`` of spare folders (docs/FORMAT.md, "Commit protocol")
SPARE_PREFIX = ".spare-"
#: one gradient above the default pack threshold and two small ones: one chunk
SHAPES = [(256, 256), (3, 4), (17,)]


def _grads(seed: int, shapes: list[tuple[int, ...]] = SHAPES) -> GradientsParams:
    rng = np.random.default_rng(seed)
    grads = GradientsParams()
    for index, shape in enumerate(shapes):
        grads.register(
            ParamId(), wrap(rng.standard_normal(shape).astype("float32")), name=f"p{index}"
        )
    return grads


def _bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


def _restored(recorder: Recorder, snapshot_id: str) -> dict[ParamId, bytes]:
    record = recorder.sync.fetch(snapshot_id)
    return {entry.param_id: np.asarray(entry.array).tobytes() for entry in record.entries}


def _chunk(root: Path, snapshot_id: str) -> Path:
    return root / "snapshots" / snapshot_id / "c.0"


def _spares(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root / ".staging") if name.startswith(SPARE_PREFIX))


def _commit(recorder: Recorder, grads: GradientsParams, step: int) -> str:
    return recorder.start_snapshot(grads, run="r", step=step).result().id


def test_the_next_commit_writes_into_the_deleted_snapshots_files(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        chunk_inode = _chunk(root, first).stat().st_ino
        document_inode = (root / "snapshots" / first / "zarr.json").stat().st_ino
        recorder.sync.delete(first)
        assert len(_spares(root)) == 1
        assert first not in {info.id for info in recorder.sync.list()}

        grads = _grads(1)
        second = _commit(recorder, grads, 1)
        assert _chunk(root, second).stat().st_ino == chunk_inode
        assert (root / "snapshots" / second / "zarr.json").stat().st_ino == document_inode
        assert _spares(root) == []
        assert _restored(recorder, second) == _bytes(grads)
        assert sorted(os.listdir(root / "snapshots" / second)) == ["c.0", "zarr.json"]
        # another Zarr reader sees the new snapshot's document and bytes, nothing older
        node = zarr.open(str(root / "snapshots" / second), mode="r")
        manifest = node.attrs["gradvault"]
        assert manifest["id"] == second and manifest["step"] == 1
        chunk = _chunk(root, second).read_bytes()
        assert node.shape == (len(chunk) - 4,)
        assert int.from_bytes(chunk[-4:], "little") == crc32c_rs.crc32c(chunk[:-4])
        recorder.sync.delete(second)
        assert len(_spares(root)) == 1
    # closing the store removes its spare folders
    assert os.listdir(root / ".staging") == []


@pytest.mark.parametrize("shapes", [[(64, 64), (5,)], [(512, 256), (9, 9), (3,)]])
def test_a_shorter_or_longer_snapshot_leaves_nothing_of_the_deleted_one(
    tmp_path: Path, shapes: list[tuple[int, ...]]
) -> None:
    root = tmp_path / "store"
    with Recorder(root, pack_threshold=1024) as recorder:
        first = _commit(recorder, _grads(0), 0)
        first_length = _chunk(root, first).stat().st_size
        recorder.sync.delete(first)
        grads = _grads(2, shapes)
        second = _commit(recorder, grads, 1)
        assert _spares(root) == []
        chunk = _chunk(root, second).read_bytes()
        assert len(chunk) != first_length
        node = zarr.open(str(root / "snapshots" / second), mode="r")
        assert node.shape == (len(chunk) - 4,)
        assert node.attrs["gradvault"]["packed"]["nbytes"] == len(chunk) - 4
        assert int.from_bytes(chunk[-4:], "little") == crc32c_rs.crc32c(chunk[:-4])
        assert _restored(recorder, second) == _bytes(grads)


def test_a_file_someone_has_open_is_never_written_again(tmp_path: Path) -> None:
    """A reader that opened the chunk before the delete reads the deleted snapshot's bytes
    to the end, as it would from a removed file; the next commit makes new files."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        path = _chunk(root, first)
        expected = path.read_bytes()
        inode = path.stat().st_ino
        with open(path, "rb") as reader:
            head = reader.read(1000)
            recorder.sync.delete(first)
            assert _spares(root) == []
            second = _commit(recorder, _grads(1), 1)
            assert head + reader.read() == expected
        assert _chunk(root, second).stat().st_ino != inode
        assert os.listdir(root / ".staging") == []


def test_a_linked_file_is_never_written_again(tmp_path: Path) -> None:
    """A chunk with another name (a hard link made into the store) is removed, not
    written again: the file the other name points to keeps its bytes."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        outside = tmp_path / "kept-elsewhere"
        os.link(_chunk(root, first), outside)
        expected = outside.read_bytes()
        recorder.sync.delete(first)
        assert _spares(root) == []
        second = _commit(recorder, _grads(1), 1)
        assert outside.read_bytes() == expected
        assert _chunk(root, second).stat().st_ino != outside.stat().st_ino


def test_only_snapshots_of_one_chunk_are_kept_and_at_most_spare_folders(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    with Recorder(root, chunk_bytes=64 << 10, pack_threshold=1024) as recorder:
        # four 64 KiB gradients: longer than a chunk, written as arrays of their own
        large = _commit(recorder, _grads(0, [(128, 128)] * 4), 0)
        small = [_commit(recorder, _grads(i, [(64, 64), (7,)]), i) for i in range(1, 5)]
        recorder.sync.delete(large)
        assert _spares(root) == []
        for snapshot_id in small:
            recorder.sync.delete(snapshot_id)
        assert recorder.store.backend.spare_folders == 2
        assert len(_spares(root)) == 2
        assert len(os.listdir(root / ".staging")) == 2
    assert os.listdir(root / ".staging") == []  # closing the recorder removed them


async def test_a_store_that_never_commits_in_one_step_keeps_none(tmp_path: Path) -> None:
    """A store that only reads and deletes (the CLI's) frees the space at once."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        snapshot_id = _commit(recorder, _grads(0), 0)
    store = open_store(str(root))
    try:
        await store.delete(snapshot_id)
        assert os.listdir(root / ".staging") == []
    finally:
        await store.close()


def test_gc_may_take_a_spare_folder_and_the_next_commit_makes_its_own(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        recorder.sync.delete(first)
        (spare,) = _spares(root)
        assert recorder.sync.gc(grace_seconds=0) == [spare]
        grads = _grads(1)
        second = _commit(recorder, grads, 1)
        assert _restored(recorder, second) == _bytes(grads)
        assert os.listdir(root / ".staging") == []


def test_a_fresh_spare_folder_is_not_collected_by_gc(tmp_path: Path) -> None:
    """Its files keep the deleted snapshot's times; the folder is touched as it is taken,
    so gc with its default grace never takes a commit under way in it."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        old = 1_000_000_000  # 2001: far older than any grace period
        for name in ("c.0", "zarr.json", ""):
            os.utime(root / "snapshots" / first / name, (old, old))
        recorder.sync.delete(first)
        (spare,) = _spares(root)
        folder = root / ".staging" / spare
        taken = str(root / ".staging" / "taken")
        assert recorder.store.backend.take_spare(taken)
        assert not folder.exists()
        assert recorder.sync.gc() == []
        assert sorted(os.listdir(taken)) == ["c.0", "zarr.json"]


def test_retention_every_step_reuses_the_same_two_files(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Recorder(root, keep_last=1) as recorder:
        inodes = set()
        kept = []
        for step in range(6):
            grads = _grads(step)
            snapshot_id = _commit(recorder, grads, step)
            kept.append((snapshot_id, _bytes(grads)))
            inodes.add(_chunk(root, snapshot_id).stat().st_ino)
        (info,) = recorder.sync.list()
        assert info.id == kept[-1][0]
        assert _restored(recorder, info.id) == kept[-1][1]
        # the first commit's files and those of the one its retention pass deleted
        assert len(inodes) <= 2
    assert os.listdir(root / ".staging") == []


def test_a_write_that_fails_in_a_spare_folder_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old document in a spare folder is never a snapshot: a commit that fails part
    way (here as the chunk is sized: a full disk) raises, names the cause, leaves the
    snapshots as they were and nothing in ``.staging``."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        first = _commit(recorder, _grads(0), 0)
        grads = _grads(1)
        kept = _commit(recorder, grads, 1)
        recorder.sync.delete(first)
        assert len(_spares(root)) == 1

        def full_disk(fd: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        with monkeypatch.context() as patched:
            patched.setattr(os, "ftruncate", full_disk)
            with pytest.raises(StoreUnavailableError, match="No space left"):
                _commit(recorder, _grads(2), 2)
        assert [info.id for info in recorder.sync.list()] == [kept]
        assert os.listdir(root / ".staging") == []
        assert _restored(recorder, kept) == _bytes(grads)


def test_a_spare_folder_is_not_fsynced_again_but_every_file_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare folder holds the same two names of the same files that its own commit made
    durable: its commit fsyncs the chunk and the document, not the folder; a folder made
    new is fsynced as before."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        fsyncs = recorder.store.backend.fsyncs
        synced: list[list[str]] = []
        real = fsyncs.fsync

        def spy(paths: list[str]) -> None:
            synced.append(list(paths))
            real(paths)

        monkeypatch.setattr(fsyncs, "fsync", spy)
        first = _commit(recorder, _grads(0), 0)
        staged = [path for call in synced for path in call]
        assert {os.path.basename(path) for path in staged} == {"c.0", "zarr.json", first}
        recorder.sync.delete(first)
        synced.clear()
        second = _commit(recorder, _grads(1), 1)
        staged = [path for call in synced for path in call]
        assert sorted(os.path.basename(path) for path in staged) == ["c.0", "zarr.json"]
        assert all(second in path for path in staged)
