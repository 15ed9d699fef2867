"""crc32c (core/store/_checksums.py): running checksums, and a gradient's from its chunks'.

Writes and reads never checksum a gradient's bytes twice: its checksum is combined from
the crc32c of each chunk's data. These check the combination against a direct crc32c of
the whole buffer, for random sizes and random ways of cutting it; and the running crc32c
the store takes over every kind of buffer it holds against google_crc32c over bytes.
"""

from __future__ import annotations

import mmap
import random

import google_crc32c
import ml_dtypes
import numpy as np
import pytest

from gradvault.core.store._checksums import (
    SLICE_BYTES,
    Crc32cTrailer,
    ReadAlong,
    crc32c,
    crc32c_combine,
    crc32c_of_tail,
    resolved,
)


def combined(pieces: list[bytes]) -> int:
    value = 0
    for piece in pieces:
        value = crc32c_combine(value, google_crc32c.value(bytes(piece)), len(piece))
    return value


def cut(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    """``data`` in ``count`` pieces at random points, empty pieces included."""
    points = sorted(rng.randrange(len(data) + 1) for _ in range(count - 1))
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize("seed", range(20))
def test_combining_random_cuts_gives_the_crc32c_of_the_whole(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.choice([0, 1, 7, 4096, rng.randrange(1, 300_000)]))
    for count in (1, 2, 3, rng.randrange(4, 40)):
        pieces = cut(data, rng, count)
        assert b"".join(pieces) == data
        assert combined(pieces) == google_crc32c.value(bytes(data)), (
            len(data),
            [len(p) for p in pieces],
        )


def test_equal_chunks_and_a_short_last_one_as_a_chunked_gradient_is_read() -> None:
    rng = random.Random(1)
    data = rng.randbytes(5 * 65536 + 123)
    pieces = [data[start : start + 65536] for start in range(0, len(data), 65536)]
    assert combined(pieces) == google_crc32c.value(bytes(data))


@pytest.mark.parametrize("seed", range(10))
def test_a_tail_s_crc32c_from_the_running_crc32c_is_its_own(seed: int) -> None:
    """What a one-step commit does for each gradient after the first: its crc32c from the
    chunk's running crc32c before and after it (lengths met again reuse their table)."""
    rng = random.Random(seed)
    for _ in range(2):
        head = rng.randbytes(rng.choice([1, 3, 4096, rng.randrange(1, 100_000)]))
        tail = rng.randbytes(rng.choice([1, 5, 8192, 40 + seed, rng.randrange(1, 300_000)]))
        whole = google_crc32c.value(head + tail)
        assert crc32c_of_tail(whole, google_crc32c.value(head), len(tail)) == (
            google_crc32c.value(tail)
        )
    assert crc32c_of_tail(whole, 0, len(tail)) == whole  # nothing before: the running one
    assert crc32c_of_tail(whole, 123, 0) == 0  # an empty tail


def test_a_flipped_byte_in_any_piece_changes_the_combination() -> None:
    rng = random.Random(2)
    data = bytearray(rng.randbytes(10_000))
    good = google_crc32c.value(bytes(data))
    for position in (0, 4999, 5000, 9999):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        pieces = [bytes(damaged[:5000]), bytes(damaged[5000:])]
        assert combined(pieces) != good


def test_an_empty_side_leaves_the_other_crc() -> None:
    crc = google_crc32c.value(b"gradient bytes")
    assert crc32c_combine(crc, 0, 0) == crc  # nothing appended
    assert crc32c_combine(0, crc, 14) == crc  # appended to nothing


def test_combination_is_associative_for_lengths_no_buffer_could_hold() -> None:
    """(A+B)+C = A+(B+C) for lengths up to 2**62: the shift by len(B)+len(C) is the shift
    by len(B) then by len(C), however large, with no bytes to check against."""
    rng = random.Random(3)
    for _ in range(50):
        a, b, c = (rng.getrandbits(32) for _ in range(3))
        length_b, length_c = rng.randrange(1, 1 << 62), rng.randrange(1, 1 << 62)
        left = crc32c_combine(crc32c_combine(a, b, length_b), c, length_c)
        right = crc32c_combine(a, crc32c_combine(b, c, length_c), length_b + length_c)
        assert left == right


def buffers_of(data: bytes) -> dict[str, object]:
    """``data`` as each kind of buffer the store checksums: its own and the libraries'."""
    mapped = mmap.mmap(-1, max(len(data), 1))
    mapped[: len(data)] = data
    return {
        "bytes": data,
        "bytearray": bytearray(data),
        "writable memoryview": memoryview(bytearray(data)),
        "read-only memoryview": memoryview(data),
        "memoryview slice": memoryview(b"xx" + data + b"yy")[2 : 2 + len(data)],
        "mmap": memoryview(mapped)[: len(data)],
        "uint8 array": np.frombuffer(data, np.uint8).copy(),
    }


@pytest.mark.parametrize("size", [0, 1, 7, 4096, (1 << 20) + 3])
def test_running_crc32c_over_every_kind_of_buffer(size: int) -> None:
    data = random.Random(size).randbytes(size)
    want = google_crc32c.value(data)
    for kind, buffer in buffers_of(data).items():
        assert crc32c(buffer) == want, kind
        # continued piece after piece from the crc32c of the bytes before each
        half = size // 2
        view = memoryview(buffer).cast("B")
        assert crc32c(view[half:], crc32c(view[:half])) == want, kind


def test_running_crc32c_of_typed_arrays_is_that_of_their_bytes() -> None:
    values = np.linspace(-3, 3, 1001, dtype=np.float32)
    for array in (values, values.astype(np.float64), values.astype(ml_dtypes.bfloat16)):
        assert crc32c(array) == google_crc32c.value(array.tobytes()), array.dtype
    assert crc32c(np.float32(1.5)) == google_crc32c.value(np.float32(1.5).tobytes())


def test_running_crc32c_refuses_a_strided_buffer() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        crc32c(np.arange(10.0)[::2])


@pytest.mark.parametrize("one_pass", [False, True])
def test_resolved_checksums_and_reads_along_in_one_go(one_pass: bool) -> None:
    """What an object store's writer sends (``resolved``): the parts' bytes, the trailer
    the crc32c of all of them, each part's running crc32c recorded, and each ReadAlong's
    slices handed over in order, once each, to its visit or, where it has one, to its
    checksum_and_visit (which then takes the crc32c: here the same function)."""
    rng = random.Random(5)
    first, middle, last = (rng.randbytes(n) for n in (3 * SLICE_BYTES + 17, 40, SLICE_BYTES))
    visited: list[bytes] = []
    fused: list[bytes] = []

    def visit(piece: memoryview) -> None:
        visited.append(bytes(piece))

    def checksum_and_visit(piece: memoryview, crc: int) -> int:
        fused.append(bytes(piece))
        return crc32c(piece, crc)

    def reader(data: bytes) -> ReadAlong:
        return ReadAlong(memoryview(data), visit, checksum_and_visit if one_pass else None)

    trailer = Crc32cTrailer()
    out = resolved([reader(first), middle, reader(last), trailer])
    assert b"".join(bytes(part) for part in out[:-1]) == first + middle + last
    assert out[-1] == crc32c(first + middle + last).to_bytes(4, "little")
    assert trailer.running == [
        crc32c(first),
        crc32c(first + middle),
        crc32c(first + middle + last),
    ]
    taken = fused if one_pass else visited
    assert b"".join(taken) == first + last
    assert len(taken) == 5  # four slices of the first part, one of the last
    assert not (visited if one_pass else fused)
