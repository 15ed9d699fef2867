"""A local store reads a file that is not in the page cache with O_DIRECT.

A gradient's first buffer (4 KiB-aligned, at least 1 MiB) is filled by the device itself
where the file's first page is not cached (asked with ``cachestat``, or ``mincore`` where
the kernel has no ``cachestat``: both are checked), and the file's last bytes (an edge
chunk's padding and its crc32c) come in the same request; a cached file is read through
the cache as before. These read real files on this machine's file system, their pages
dropped from the cache with ``posix_fadvise(DONTNEED)`` until ``mincore`` finds none left:
the bytes and running crc32cs are checked, and whether the read left the file out of the
cache (what a direct read does, and a read through the cache does not). Where the file
system takes no direct reads (or the platform has none) they are skipped; a refusal is
injected where they are not.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import crc32c_rs
import numpy as np
import pytest

from bench.store_io import cached_pages, drop_cache
from gradvault.core.store import _local_files, open_store
from gradvault.core.store._backend import UnexpectedObjectError
from gradvault.core.store._local_files import DIRECT_READ_MIN_BYTES, read_file_into

from ..os_probes import page_cached
from .test_store_bulk_reads import make_record

PAGE = 4096


def aligned(nbytes: int, offset: int = 0) -> memoryview:
    """``nbytes`` of writable memory starting ``offset`` bytes past a 4 KiB boundary."""
    block = np.empty(nbytes + 2 * PAGE, dtype=np.uint8)
    start = -block.ctypes.data % PAGE + offset
    return block[start : start + nbytes].data


def write(path: Path, data: bytes) -> None:
    """``data`` in a new file at ``path``, durable (so that its pages can be dropped)."""
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def drop_from_cache(path: Path) -> None:
    """Every page of ``path`` out of the page cache (the bench's ``drop_cache``, which gives
    its advice again while ``mincore`` finds pages), or the test skipped: nothing here could
    tell a direct read from a cached one."""
    drop_cache(path)
    if cached_pages(path):
        pytest.skip(f"the kernel keeps pages of {path} in the cache (tmpfs?)")


@pytest.fixture
def cold_file(tmp_path: Path) -> Path:
    """A folder whose files can be dropped from the cache and read with O_DIRECT here."""
    if not (getattr(os, "O_DIRECT", 0) and getattr(os, "RWF_NOWAIT", 0)):
        pytest.skip("no O_DIRECT or RWF_NOWAIT on this platform")
    probe = tmp_path / "probe"
    write(probe, bytes(3 * PAGE))
    drop_from_cache(probe)  # skips where the file system keeps its pages (tmpfs)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system takes no O_DIRECT")
    os.close(fd)
    return tmp_path


@pytest.fixture(params=["cachestat", "mincore", "cachestat refused"])
def probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the read asks whether a file is cached: each of the two ways, and ``mincore``
    once a seccomp filter that does not know ``cachestat`` refuses it (EPERM)."""
    if request.param == "mincore":
        monkeypatch.setattr(_local_files, "_has_cachestat", False)
    if request.param == "cachestat refused":

        def refused(*args: object) -> int:
            ctypes.set_errno(errno.EPERM)
            return -1

        monkeypatch.setattr(_local_files, "_has_cachestat", True)
        monkeypatch.setattr(_local_files, "_syscall", refused)
    return request.param


def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every O_DIRECT switch a read makes, recorded (and made)."""
    calls: list[bool] = []
    real = _local_files.set_direct

    def spy(fd: int, on: bool) -> None:
        calls.append(on)
        real(fd, on)

    monkeypatch.setattr(_local_files, "set_direct", spy)
    return calls


def chunk_file(folder: Path, data_bytes: int, tail_bytes: int, seed: int = 0) -> bytes:
    """A file of ``data_bytes`` then ``tail_bytes`` random bytes at ``folder``/c.0."""
    data = np.random.default_rng(seed).bytes(data_bytes + tail_bytes)
    write(folder / "c.0", data)
    return data


def running_crcs(data: bytes, lengths: list[int]) -> list[int]:
    crcs, crc, at = [], 0, 0
    for length in lengths:
        crc = crc32c_rs.crc32c(data[at : at + length], crc)
        crcs.append(crc)
        at += length
    return crcs


@pytest.mark.parametrize(
    ("data_bytes", "tail_bytes"),
    [
        (3 << 20, 4),  # a whole chunk and its crc32c
        ((3 << 20) + 1000, 3096 + 4),  # an edge chunk: data, zero padding, crc32c
        (DIRECT_READ_MIN_BYTES, 0),  # nothing after the first buffer
        ((2 << 20) + 8, 200_000),  # more after it than one request takes
    ],
)
def test_a_cold_file_is_read_by_the_device_into_the_buffers(
    cold_file: Path,
    probe: str,
    monkeypatch: pytest.MonkeyPatch,
    data_bytes: int,
    tail_bytes: int,
) -> None:
    data = chunk_file(cold_file, data_bytes, tail_bytes)
    drop_from_cache(cold_file / "c.0")
    calls = direct_calls(monkeypatch)
    lengths = [data_bytes] + ([tail_bytes - 4, 4] if tail_bytes > 4 else [tail_bytes])
    buffers = [aligned(data_bytes)] + [aligned(n, offset=3) for n in lengths[1:]]
    crcs = read_file_into(str(cold_file), "c.0", buffers, True)
    assert b"".join(bytes(b) for b in buffers) == data
    assert crcs == running_crcs(data, lengths)
    assert calls == [True, False]  # O_DIRECT for the read, then off again
    assert not page_cached(cold_file / "c.0", data_bytes // 2 // PAGE * PAGE)  # the device's


def test_a_cached_file_is_read_through_the_cache(
    cold_file: Path, probe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = chunk_file(cold_file, 2 << 20, 4)
    (cold_file / "c.0").read_bytes()  # every page in the cache
    calls = direct_calls(monkeypatch)
    buffers = [aligned(2 << 20), aligned(4)]
    assert read_file_into(str(cold_file), "c.0", buffers, True) == running_crcs(data, [2 << 20, 4])
    assert b"".join(bytes(b) for b in buffers) == data
    assert calls == []


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(lambda: aligned(2 << 20, offset=8), id="not aligned"),
        pytest.param(lambda: aligned(DIRECT_READ_MIN_BYTES - PAGE), id="too short"),
    ],
)
def test_a_first_buffer_unfit_for_the_device_is_read_through_the_cache(
    cold_file: Path, monkeypatch: pytest.MonkeyPatch, first
) -> None:
    buffer = first()
    data = chunk_file(cold_file, len(buffer), 4)
    drop_from_cache(cold_file / "c.0")
    calls = direct_calls(monkeypatch)
    read_file_into(str(cold_file), "c.0", [buffer, aligned(4)], True)
    assert bytes(buffer) == data[:-4]
    assert calls == []


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.EOPNOTSUPP])
def test_a_file_system_that_refuses_direct_reads_loses_nothing(
    cold_file: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    data = chunk_file(cold_file, 2 << 20, 4)
    drop_from_cache(cold_file / "c.0")

    def refuse(fd: int, on: bool) -> None:
        raise OSError(refusal, "refused")

    monkeypatch.setattr(_local_files, "set_direct", refuse)
    buffers = [aligned(2 << 20), aligned(4)]
    assert read_file_into(str(cold_file), "c.0", buffers, True) == running_crcs(data, [2 << 20, 4])
    assert b"".join(bytes(b) for b in buffers) == data


def test_a_refused_direct_read_is_made_again_through_the_cache(
    cold_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = chunk_file(cold_file, 2 << 20, 4)
    drop_from_cache(cold_file / "c.0")
    real = os.preadv

    def refuse_direct(fd: int, buffers: list, offset: int, flags: int = 0) -> int:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset, flags)

    monkeypatch.setattr(_local_files.os, "preadv", refuse_direct)
    buffers = [aligned(2 << 20), aligned(4)]
    read_file_into(str(cold_file), "c.0", buffers, True)
    assert b"".join(bytes(b) for b in buffers) == data


@pytest.mark.parametrize(("actual", "claimed"), [(2 << 20, 3 << 20), (3 << 20, 2 << 20)])
def test_a_file_that_changed_length_since_it_was_looked_at_is_refused(
    cold_file: Path, actual: int, claimed: int
) -> None:
    chunk_file(cold_file, actual, 100)
    drop_from_cache(cold_file / "c.0")
    buffers = [aligned(claimed), aligned(100)]
    fd = os.open(cold_file / "c.0", os.O_RDONLY)
    try:  # the size read_file_into would have checked, before the file changed
        with pytest.raises(UnexpectedObjectError, match="shrank" if actual < claimed else "grew"):
            _local_files._fill(fd, buffers, claimed + 100, True)
    finally:
        os.close(fd)


async def test_a_restore_from_a_cold_cache_gives_the_gradients_back_and_leaves_the_cache(
    cold_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(cold_file / "store", chunk_bytes=2 << 20, pack_threshold=512)
    rng = np.random.default_rng(5)
    arrays = {
        # chunks of 512 rows (2 MiB, each starting on a page of the gradient's buffer), then
        # an edge chunk of 76 rows: under 1 MiB of data, read through the cache
        "big.weight": rng.standard_normal((1100, 1024)).astype(np.float32),
        "small.bias": rng.standard_normal(300).astype(np.float32),
    }
    record = make_record(arrays)
    info = await store.write_snapshot(record, run="r", step=1)
    folder = Path(store.backend.root) / "snapshots" / info.id
    files = [path for path in folder.rglob("*") if path.is_file()]
    for path in files:
        drop_from_cache(path)
    calls = direct_calls(monkeypatch)
    found = await store.read_snapshot(info.id)
    await store.close()
    for got, want in zip(found, record, strict=True):
        assert got.array.tobytes() == want.array.tobytes()
    assert calls.count(True) == 2  # the big gradient's two whole chunks
    first_chunk = max(files, key=lambda path: path.stat().st_size)
    assert not page_cached(first_chunk, 1 << 20)
