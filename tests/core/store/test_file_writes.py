"""The local store's file writes: O_DIRECT from an aligned buffer, and every way back to the
page cache (the file system refuses the flag, or accepts it and refuses the write), each
giving the same bytes and the same crc32c trailer as the buffered write."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil
import signal
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

import gradvault.core.store._file_writes as file_writes
from gradvault.core import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import open_store
from gradvault.core.store._checksums import Crc32cTrailer, ReadAlong
from gradvault.core.store._file_writes import (
    DIRECT_ALIGNMENT,
    DIRECT_BUFFER_BYTES,
    DIRECT_MIN_BYTES,
    O_DIRECT,
    PIECE_BYTES,
    DirectWrites,
    write_file,
)

needs_o_direct = pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")

SIZES = [
    DIRECT_MIN_BYTES,
    DIRECT_MIN_BYTES + 1,
    DIRECT_BUFFER_BYTES - 4,  # with the trailer, exactly one buffer
    DIRECT_BUFFER_BYTES,
    DIRECT_BUFFER_BYTES + DIRECT_ALIGNMENT - 3,
    2 * DIRECT_BUFFER_BYTES + 12345,
]


def payload(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def chunk_parts(data: bytes, padding: int = 0) -> tuple[list[object], Crc32cTrailer]:
    trailer = Crc32cTrailer()
    parts: list[object] = [memoryview(data)]
    if padding:
        parts.append(memoryview(bytes(padding)))
    return [*parts, trailer], trailer


def unaligned_copy(data: bytes) -> memoryview:
    """``data`` in memory that starts 16 bytes past a page boundary: a writer copies it
    (a part whose memory starts on a page boundary may go to the device from there)."""
    block = np.empty(len(data) + 2 * DIRECT_ALIGNMENT, dtype=np.uint8)
    start = -block.ctypes.data % DIRECT_ALIGNMENT + 16
    block[start : start + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return block[start : start + len(data)].data


def expected_file(data: bytes, padding: int = 0) -> bytes:
    body = data + bytes(padding)
    return body + google_crc32c.value(bytes(body)).to_bytes(4, "little")


def direct_writes_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the length of every os.write made while O_DIRECT is set on the descriptor."""
    seen: list[int] = []
    real_write = os.write

    def spying_write(fd: int, data) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            seen.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spying_write)
    return seen


@needs_o_direct
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("padding", [0, 100])
def test_direct_and_buffered_writes_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, padding: int
) -> None:
    data = payload(size, seed=size)
    direct = DirectWrites()
    seen = direct_writes_seen(monkeypatch)
    parts, trailer = chunk_parts(data, padding)
    write_file(str(tmp_path / "direct"), parts, direct)
    buffered_parts, buffered_trailer = chunk_parts(data, padding)
    write_file(str(tmp_path / "buffered"), buffered_parts)
    assert (tmp_path / "direct").read_bytes() == expected_file(data, padding)
    assert (tmp_path / "buffered").read_bytes() == expected_file(data, padding)
    assert trailer.running == buffered_trailer.running  # the chunk's crc32c after each part
    if direct.enabled:  # this file system takes O_DIRECT: it was used
        assert seen and all(n % DIRECT_ALIGNMENT == 0 for n in seen)
        assert sum(seen) == (size + padding + 4) // DIRECT_ALIGNMENT * DIRECT_ALIGNMENT


def test_small_files_and_files_without_a_trailer_are_written_whole(tmp_path: Path) -> None:
    direct = DirectWrites()
    small = payload(1000)
    write_file(str(tmp_path / "small"), [memoryview(small)], direct)
    assert (tmp_path / "small").read_bytes() == small
    large = payload(DIRECT_MIN_BYTES * 3 + 7, seed=2)
    write_file(str(tmp_path / "large"), [large[:5], memoryview(large)[5:]], direct)
    assert (tmp_path / "large").read_bytes() == large
    write_file(str(tmp_path / "empty"), [], direct)
    assert (tmp_path / "empty").read_bytes() == b""
    with pytest.raises(FileExistsError):  # files are created, never overwritten
        write_file(str(tmp_path / "large"), [large], direct)


@needs_o_direct
def test_a_file_system_refusing_the_flag_gets_a_buffered_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tmpfs does: setting O_DIRECT fails with EINVAL."""
    real_fcntl = fcntl.fcntl
    refused = []

    def refusing_fcntl(fd: int, command: int, argument: int = 0) -> int:
        if command == fcntl.F_SETFL and argument & O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument (injected)")
        return real_fcntl(fd, command, argument)

    monkeypatch.setattr(file_writes.fcntl, "fcntl", refusing_fcntl)
    direct = DirectWrites()
    data = payload(DIRECT_BUFFER_BYTES + 5)
    parts, _ = chunk_parts(data)
    write_file(str(tmp_path / "a"), parts, direct)
    assert refused and not direct.enabled
    assert (tmp_path / "a").read_bytes() == expected_file(data)
    parts, _ = chunk_parts(data)
    write_file(str(tmp_path / "b"), parts, direct)  # not tried again
    assert len(refused) == 1
    assert (tmp_path / "b").read_bytes() == expected_file(data)


def direct_pwritevs_seen(
    monkeypatch: pytest.MonkeyPatch, fail: Callable[[int], OSError | None] = lambda n: None
) -> list[tuple[int, int]]:
    """Records (offset, length) of every os.pwritev made while O_DIRECT is set on the
    descriptor; ``fail(n)`` may give an error for the n-th of them (counted from 0)."""
    seen: list[tuple[int, int]] = []
    real_pwritev = os.pwritev

    def spying_pwritev(fd: int, buffers, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            seen.append((offset, sum(memoryview(b).nbytes for b in buffers)))
            error = fail(len(seen) - 1)
            if error is not None:
                raise error
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", spying_pwritev)
    return seen


PIECED_SIZES = [
    2 * PIECE_BYTES - 4,  # with the trailer, exactly two pieces
    2 * PIECE_BYTES + 12345,
    5 * PIECE_BYTES + DIRECT_ALIGNMENT - 3,
]


@needs_o_direct
@pytest.mark.parametrize("size", PIECED_SIZES)
@pytest.mark.parametrize("padding", [0, 100])
def test_a_whole_file_written_in_pieces_gives_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, padding: int
) -> None:
    """A file that fits the whole-file buffer goes to the device a piece at a time, each
    at its offset, as it is copied; the bytes and the trailer are the buffered write's.
    Only the data's whole blocks go directly: the rest of it and the trailer, through the
    cache once the crc32c is known."""
    data = payload(size, seed=size)
    direct = DirectWrites()
    seen = direct_pwritevs_seen(monkeypatch)
    parts, trailer = chunk_parts(data, padding)
    parts[0] = unaligned_copy(data)  # copied, not written from its own memory
    write_file(str(tmp_path / "pieced"), parts, direct, whole_file=True)
    buffered_parts, buffered_trailer = chunk_parts(data, padding)
    write_file(str(tmp_path / "buffered"), buffered_parts)
    assert (tmp_path / "pieced").read_bytes() == expected_file(data, padding)
    assert trailer.running == buffered_trailer.running
    if direct.enabled:
        aligned = (size + padding) // DIRECT_ALIGNMENT * DIRECT_ALIGNMENT
        assert len(seen) >= 2
        assert [offset for offset, _ in seen] == sorted(offset for offset, _ in seen)
        ends = [offset + length for offset, length in seen]
        assert [0, *ends[:-1]] == [offset for offset, _ in seen]  # back to back, in order
        assert ends[-1] == aligned
        assert all(length % DIRECT_ALIGNMENT == 0 for _, length in seen)
        assert all(offset % PIECE_BYTES == 0 for offset, _ in seen)


@needs_o_direct
@pytest.mark.parametrize("refused_at", [0, 1])
def test_a_piece_refused_goes_through_the_cache_with_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: int
) -> None:
    """The flag is taken but a piece's direct write fails with EINVAL: that piece and every
    later one go through the page cache; the file is the same bytes."""

    def einval(n: int) -> OSError | None:
        return OSError(errno.EINVAL, "Invalid argument (injected)") if n >= refused_at else None

    seen = direct_pwritevs_seen(monkeypatch, einval)
    direct = DirectWrites()
    data = payload(3 * PIECE_BYTES + 99, seed=6)
    parts, trailer = chunk_parts(data, padding=8)
    parts[0] = unaligned_copy(data)  # copied: handed over a piece at a time
    write_file(str(tmp_path / "chunk"), parts, direct, whole_file=True)
    assert len(seen) == refused_at + 1
    assert not direct.enabled
    assert (tmp_path / "chunk").read_bytes() == expected_file(data, padding=8)
    assert trailer.value() == expected_file(data, padding=8)[-4:]


@needs_o_direct
def test_a_failed_piece_fails_the_write_and_gives_the_buffer_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece the device refuses (a full disk) fails the file's write with that error,
    once every piece in flight is done; the whole-file buffer is free again."""

    def full_disk(n: int) -> OSError | None:
        return OSError(errno.ENOSPC, "No space left on device (injected)") if n == 1 else None

    direct_pwritevs_seen(monkeypatch, full_disk)
    data = payload(4 * PIECE_BYTES, seed=7)
    parts, _ = chunk_parts(data)
    parts[0] = unaligned_copy(data)  # copied: handed over a piece at a time
    with pytest.raises(OSError) as raised:
        write_file(str(tmp_path / "chunk"), parts, DirectWrites(), whole_file=True)
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    parts, _ = chunk_parts(data)
    parts[0] = unaligned_copy(data)  # copied: handed over a piece at a time
    seen = direct_pwritevs_seen(monkeypatch)
    write_file(str(tmp_path / "again"), parts, DirectWrites(), whole_file=True)
    assert len(seen) >= 2  # the whole-file buffer was lent again, not lost
    assert (tmp_path / "again").read_bytes() == expected_file(data)


@needs_o_direct
def test_a_failure_while_copying_waits_for_the_pieces_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader along the bytes that fails (here after two pieces were read, every piece
    handed over before) fails the write; the pieces already handed to the device are
    finished before the buffer goes back, and the next whole-file write gets it."""
    seen = direct_pwritevs_seen(monkeypatch)
    data = payload(4 * PIECE_BYTES + 5, seed=8)
    visited: list[int] = []

    def visit(piece: memoryview) -> None:
        visited.append(len(piece))
        if sum(visited) > 2 * PIECE_BYTES:
            raise ValueError("stats failed (injected)")

    with pytest.raises(ValueError, match="injected"):
        write_file(
            str(tmp_path / "chunk"),
            [ReadAlong(memoryview(data), visit), Crc32cTrailer()],
            DirectWrites(),
            whole_file=True,
        )
    assert seen  # a piece was on its way when the copy failed
    seen.clear()
    parts, _ = chunk_parts(data)
    write_file(str(tmp_path / "again"), parts, DirectWrites(), whole_file=True)
    assert len(seen) >= 2
    assert (tmp_path / "again").read_bytes() == expected_file(data)


@needs_o_direct
def test_an_interrupt_while_waiting_for_a_piece_waits_for_it_before_the_write_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt raised in the thread that waits for the device (here by a
    signal handler, while a slow piece is still being written) is raised by the write, but
    only once that piece is done: its file and the buffer it reads are let go after it,
    and the next whole-file write gets the buffer."""
    real_pwritev = os.pwritev
    finished: list[float] = []

    def slow_pwritev(fd: int, buffers, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            time.sleep(0.4)
        written = real_pwritev(fd, buffers, offset)
        finished.append(time.monotonic())
        return written

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "pwritev", slow_pwritev)
    previous = signal.signal(signal.SIGALRM, interrupt)
    data = payload(PIECE_BYTES + 5, seed=9)  # one direct piece: the last one waited for
    parts, _ = chunk_parts(data)
    parts[0] = unaligned_copy(data)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            write_file(str(tmp_path / "chunk"), parts, DirectWrites(), whole_file=True)
        raised = time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert finished and max(finished) <= raised  # every piece done before the write ended
    monkeypatch.undo()
    parts, _ = chunk_parts(data)
    write_file(str(tmp_path / "again"), parts, DirectWrites(), whole_file=True)
    assert (tmp_path / "again").read_bytes() == expected_file(data)


@needs_o_direct
@pytest.mark.parametrize("refused_at", [0, 1])
def test_a_file_system_refusing_the_write_gets_the_same_bytes_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: int
) -> None:
    """The flag is taken but a direct write fails with EINVAL (nothing written): the
    same bytes go through the page cache, from the write that was refused on."""
    real_write = os.write
    direct_calls = []

    def refusing_write(fd: int, data) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            direct_calls.append(len(data))
            if len(direct_calls) > refused_at:
                raise OSError(errno.EINVAL, "Invalid argument (injected)")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", refusing_write)
    direct = DirectWrites()
    data = payload(3 * DIRECT_BUFFER_BYTES + 99, seed=5)
    parts, trailer = chunk_parts(data, padding=8)
    # copied a buffer at a time: bytes whose memory happened to start on a page boundary
    # would go to the device from there, in one write
    parts[0] = unaligned_copy(data)
    write_file(str(tmp_path / "chunk"), parts, direct)
    assert len(direct_calls) == refused_at + 1
    assert not direct.enabled
    assert (tmp_path / "chunk").read_bytes() == expected_file(data, padding=8)
    assert trailer.value() == expected_file(data, padding=8)[-4:]


def takes_o_direct(folder: Path) -> bool:
    """Whether the file system at ``folder`` lets a file be opened with O_DIRECT."""
    probe = folder / ".probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o644)
    except OSError as error:
        assert error.errno == errno.EINVAL
        return False
    finally:
        if probe.exists():
            probe.unlink()
    os.close(fd)
    return True


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[list[Path]]:
    """tmp_path, and a folder on tmpfs (/dev/shm) where there is one."""
    found = [tmp_path / "disk"]
    if Path("/dev/shm").is_dir():
        found.append(Path(tempfile.mkdtemp(prefix="gv-test-", dir="/dev/shm")))
    found[0].mkdir()
    yield found
    for folder in found[1:]:
        shutil.rmtree(folder, ignore_errors=True)


@needs_o_direct
async def test_a_store_writes_and_reads_back_with_or_without_o_direct(folders) -> None:
    """On a disk (O_DIRECT) and on tmpfs (refused before Linux 6.6), bit for bit."""
    sizes = [(1 << 18) + 3, 1 << 19, 10]
    arrays = [
        np.random.default_rng(i).standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)
    ]
    record = GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), f"g{i}", a) for i, a in enumerate(arrays)]
    )
    for folder in folders:
        async with open_store(folder / "store", chunk_bytes=1 << 20) as store:
            info = await store.write_snapshot(record, run="r", step=0)
            restored = await store.read_snapshot(info.id)
            assert [e.array.tobytes() for e in restored] == [a.tobytes() for a in arrays]
            assert store.backend.direct.enabled == takes_o_direct(folder), folder


@needs_o_direct
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_writes_in_pieces_too(tmp_path: Path) -> None:
    """The piece thread of the process that forked is not in the child: the child makes
    its own, and its whole-file write finishes with the same bytes."""
    data = payload(3 * PIECE_BYTES + 7, seed=9)
    parts, _ = chunk_parts(data)
    write_file(str(tmp_path / "parent"), parts, DirectWrites(), whole_file=True)
    pid = os.fork()
    if pid == 0:  # the child: write, then leave without running the parent's clean-up
        code = 1
        try:
            parts, _ = chunk_parts(data)
            write_file(str(tmp_path / "child"), parts, DirectWrites(), whole_file=True)
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if status[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's write did not finish within 60 s")
    assert os.waitstatus_to_exitcode(status[1]) == 0
    assert (tmp_path / "child").read_bytes() == expected_file(data)


def page_aligned(size: int, seed: int) -> np.ndarray:
    """``size`` random bytes in memory that starts at a page (as the engine's large
    gradients do)."""
    memory = mmap.mmap(-1, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    array = np.frombuffer(memory, np.uint8, count=size)
    array[:] = np.frombuffer(payload(size, seed), np.uint8)
    assert array.ctypes.data % DIRECT_ALIGNMENT == 0
    return array


def direct_sources_seen(
    monkeypatch: pytest.MonkeyPatch, fail: Callable[[int], OSError | None] = lambda n: None
) -> list[tuple[int, int]]:
    """Records (address, length) of the memory of every buffer of every os.write or
    os.pwritev made while O_DIRECT is set on the descriptor; ``fail(n)`` may give an
    error for the n-th of those calls."""
    seen: list[tuple[int, int]] = []
    calls = [0]
    real_write, real_pwritev = os.write, os.pwritev

    def spy(fd: int, buffers: list) -> None:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            for data in buffers:
                flat = np.frombuffer(data, np.uint8)
                seen.append((flat.ctypes.data, flat.nbytes))
            calls[0] += 1
            error = fail(calls[0] - 1)
            if error is not None:
                raise error

    def spying_write(fd: int, data) -> int:
        spy(fd, [data])
        return real_write(fd, data)

    def spying_pwritev(fd: int, buffers, offset: int) -> int:
        spy(fd, list(buffers))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "write", spying_write)
    monkeypatch.setattr(os, "pwritev", spying_pwritev)
    return seen


def bytes_from(seen: list[tuple[int, int]], array: np.ndarray) -> int:
    """How many of ``array``'s bytes went to the device straight from its memory."""
    start, end = array.ctypes.data, array.ctypes.data + array.nbytes
    return sum(length for address, length in seen if start <= address < end)


def parts_from_memory() -> tuple[list[object], bytes, list[np.ndarray]]:
    """A chunk as the one-chunk packed array lays it out: a page-aligned gradient with an
    unaligned tail, zeros to the next block, another aligned one, a small one, the trailer."""
    first = page_aligned(2 * PIECE_BYTES + 1000, seed=11)
    gap = bytes(-first.nbytes % DIRECT_ALIGNMENT)
    second = page_aligned(3 * (1 << 20), seed=12)
    small = payload(40, seed=13)
    parts = [memoryview(first), memoryview(gap), memoryview(second), memoryview(small)]
    body = b"".join(bytes(part) for part in parts)
    return [*parts, Crc32cTrailer()], body, [first, second]


@needs_o_direct
@pytest.mark.parametrize("whole_file", [True, False], ids=["whole-file", "one-buffer"])
def test_aligned_gradients_go_to_the_device_from_their_own_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_file: bool
) -> None:
    """Page-aligned parts at aligned offsets of the file are written from their memory,
    not copied (their unaligned tails and the parts between are); the file and the
    running crc32c are those of a buffered write of the same bytes."""
    seen = direct_sources_seen(monkeypatch)
    direct = DirectWrites()
    parts, body, (first, second) = parts_from_memory()
    write_file(str(tmp_path / "direct"), parts, direct, whole_file=whole_file)
    monkeypatch.undo()
    again, _, _ = parts_from_memory()
    write_file(str(tmp_path / "buffered"), again)
    assert (tmp_path / "direct").read_bytes() == expected_file(body)
    assert parts[-1].running == again[-1].running  # type: ignore[attr-defined]
    if direct.enabled:
        assert bytes_from(seen, first) == first.nbytes - first.nbytes % DIRECT_ALIGNMENT
        assert bytes_from(seen, second) == second.nbytes
        assert all(address % DIRECT_ALIGNMENT == 0 for address, _ in seen)
        assert all(length % DIRECT_ALIGNMENT == 0 for _, length in seen)


@needs_o_direct
@pytest.mark.parametrize(
    ("whole_file", "refused_at"),
    [(True, 0), (False, 0), (False, 1), (False, 2)],
    ids=["in-one-write", "one-buffer-first", "one-buffer-second", "one-buffer-third"],
)
def test_a_refused_write_from_a_gradients_memory_goes_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_file: bool, refused_at: int
) -> None:
    """EINVAL at a direct write from a gradient's memory (the whole file's one vectored
    write; through one buffer, the first write or a later one): that write and the rest
    go through the page cache; the file is the same bytes."""

    def einval(n: int) -> OSError | None:
        return OSError(errno.EINVAL, "Invalid argument (injected)") if n == refused_at else None

    direct_sources_seen(monkeypatch, einval)
    direct = DirectWrites()
    parts, body, _ = parts_from_memory()
    write_file(str(tmp_path / "chunk"), parts, direct, whole_file=whole_file)
    assert not direct.enabled
    assert (tmp_path / "chunk").read_bytes() == expected_file(body)


@needs_o_direct
@pytest.mark.parametrize("whole_file", [True, False], ids=["whole-file", "one-buffer"])
def test_a_full_disk_under_a_write_from_a_gradients_memory_fails_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_file: bool
) -> None:
    """ENOSPC at a direct write from a gradient's memory fails the file's write with it;
    the next write of the same parts (the disk has room again) gives the whole file."""

    def full_disk(n: int) -> OSError | None:
        return OSError(errno.ENOSPC, "No space left on device (injected)") if n == 0 else None

    direct_sources_seen(monkeypatch, full_disk)
    parts, body, _ = parts_from_memory()
    with pytest.raises(OSError) as raised:
        write_file(str(tmp_path / "chunk"), parts, DirectWrites(), whole_file=whole_file)
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    seen = direct_sources_seen(monkeypatch)
    parts, body, (first, _) = parts_from_memory()
    write_file(str(tmp_path / "again"), parts, DirectWrites(), whole_file=whole_file)
    assert bytes_from(seen, first) > 0  # from its memory again: the buffer was given back
    assert (tmp_path / "again").read_bytes() == expected_file(body)


@needs_o_direct
@pytest.mark.parametrize("whole_file", [True, False], ids=["whole-file", "one-buffer"])
def test_memory_the_kernel_cannot_pin_is_written_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_file: bool
) -> None:
    """EFAULT at a direct write from a gradient's own memory (a driver's mapping the
    kernel cannot pin for the device): that part goes through the page cache, the file is
    the same bytes, and the store keeps writing with O_DIRECT."""

    def efault(n: int) -> OSError | None:
        return OSError(errno.EFAULT, "Bad address (injected)") if n == 0 else None

    seen = direct_sources_seen(monkeypatch, efault)
    direct = DirectWrites()
    parts, body, (first, _) = parts_from_memory()
    write_file(str(tmp_path / "chunk"), parts, direct, whole_file=whole_file)
    assert seen and seen[0][0] == first.ctypes.data  # the refused write was from its memory
    assert direct.enabled
    assert (tmp_path / "chunk").read_bytes() == expected_file(body)


@needs_o_direct
def test_a_whole_file_of_more_parts_than_one_vectored_write_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More page-aligned parts than one pwritev takes (IOV_MAX, 1024) go to the device in
    several vectored writes, back to back, each part from its own memory; the file is the
    buffered write's bytes."""
    count = 1100
    memory = mmap.mmap(-1, count * DIRECT_ALIGNMENT, flags=mmap.MAP_PRIVATE)
    block = np.frombuffer(memory, np.uint8)
    block[:] = np.frombuffer(payload(count * DIRECT_ALIGNMENT, seed=14), np.uint8)
    views = [
        memoryview(memory)[i * DIRECT_ALIGNMENT : (i + 1) * DIRECT_ALIGNMENT] for i in range(count)
    ]
    calls = direct_pwritevs_seen(monkeypatch)
    sources = direct_sources_seen(monkeypatch)
    direct = DirectWrites()
    trailer = Crc32cTrailer()
    write_file(str(tmp_path / "chunk"), [*views, trailer], direct, whole_file=True)
    assert (tmp_path / "chunk").read_bytes() == expected_file(block.tobytes())
    if takes_o_direct(tmp_path):
        assert direct.enabled  # no write was refused on the way
        assert len(calls) >= 2
        assert [offset for offset, _ in calls] == [0, *np.cumsum([n for _, n in calls])[:-1]]
        assert sum(n for _, n in calls) == count * DIRECT_ALIGNMENT
        assert bytes_from(sources, block) == count * DIRECT_ALIGNMENT  # nothing copied


@needs_o_direct
def test_a_short_vectored_write_finishes_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct vectored write the kernel takes only part of (here the first 8 KiB): the
    rest of it goes through the page cache at its offset; the file is the same bytes."""
    real_pwritev = os.pwritev
    shortened = []

    def short_pwritev(fd: int, buffers, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT and not shortened:
            shortened.append(offset)
            first = memoryview(buffers[0])[: 2 * DIRECT_ALIGNMENT]
            return real_pwritev(fd, [first], offset)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    parts, body, _ = parts_from_memory()
    direct = DirectWrites()
    write_file(str(tmp_path / "chunk"), parts, direct, whole_file=True)
    assert (tmp_path / "chunk").read_bytes() == expected_file(body)
    if takes_o_direct(tmp_path):
        assert direct.enabled  # a short write is no refusal
        assert shortened == [0]


@pytest.mark.parametrize("huge_pages", [True, False], ids=["asked", "no-madvise-flag"])
def test_direct_write_buffers_start_at_a_huge_page(
    monkeypatch: pytest.MonkeyPatch, huge_pages: bool
) -> None:
    """The memory direct writes come from starts at a multiple of 2 MiB and is as long as
    asked, whether or not the platform has MADV_HUGEPAGE to ask for huge pages with."""
    if not huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        monkeypatch.delattr(mmap, "MADV_HUGEPAGE")
    length = 3 * (1 << 20) + DIRECT_ALIGNMENT
    memory = file_writes.huge_page_memory(length)
    values = np.frombuffer(memory, np.uint8)
    assert values.ctypes.data % file_writes.HUGE_PAGE_BYTES == 0
    assert len(memory) == length
    values[:] = 7  # private memory, writable to its end
    assert int(values.sum()) == 7 * length


# --- writeback started for files fsynced later ------------------------------------------

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_DELALLOC = 0x4
_FIEMAP_HEADER = "=QQIIII"
_FIEMAP_EXTENT = "=QQQQQI12x"


def _delayed_extents(path: Path) -> int | None:
    """How many of ``path``'s extents still wait for delayed allocation (FIEMAP), or None
    where the file system does not say."""
    count = 8
    header, extent = struct.calcsize(_FIEMAP_HEADER), struct.calcsize(_FIEMAP_EXTENT)
    request = bytearray(header + count * extent)
    struct.pack_into(_FIEMAP_HEADER, request, 0, 0, 2**64 - 1, 0, 0, count, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
    except OSError:
        return None
    finally:
        os.close(fd)
    mapped = struct.unpack_from(_FIEMAP_HEADER, request, 0)[3]
    flags = [
        struct.unpack_from(_FIEMAP_EXTENT, request, header + i * extent)[5] for i in range(mapped)
    ]
    return sum(1 for f in flags if f & FIEMAP_EXTENT_DELALLOC)


@pytest.mark.skipif(not file_writes.CAN_START_WRITEBACK, reason="no sync_file_range")
def test_a_file_fsynced_later_has_its_writeback_started(tmp_path: Path) -> None:
    """A file written without its fsync (a document, the manifest, the packed chunk's
    tail) leaves no extent waiting for delayed allocation: its writeback has started. A
    plain write of the same bytes does leave one, where the file system delays allocation
    at all (ext4 does; elsewhere the test has nothing to compare and is skipped)."""
    payload = os.urandom(3 * DIRECT_ALIGNMENT + 17)
    plain = tmp_path / "plain"
    with open(plain, "wb") as f:
        f.write(payload)
    if not _delayed_extents(plain):
        pytest.skip("this file system allocates at once (or hides delayed allocation)")

    unsynced = tmp_path / "unsynced"
    file_writes.write_file_unsynced(str(unsynced), [payload])
    later = tmp_path / "later"
    write_file(str(later), [payload], DirectWrites(), fsync=False)
    chunk = tmp_path / "chunk"
    tail = np.frombuffer(os.urandom(PIECE_BYTES * 2 + 44), dtype=np.uint8)
    write_file(str(chunk), [tail], DirectWrites(), fsync=False, whole_file=True)

    for path, expected in [(unsynced, payload), (later, payload), (chunk, tail.tobytes())]:
        assert _delayed_extents(path) == 0, path.name
        assert path.read_bytes() == expected, path.name
