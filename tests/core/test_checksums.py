"""crc32c combination (core/store/_checksums.py): a gradient's checksum from its chunks'.

Writes and reads never checksum a gradient's bytes twice: its checksum is combined from
the crc32c of each chunk's data. These check the combination against a direct crc32c of
the whole buffer, for random sizes and random ways of cutting it.
"""

from __future__ import annotations

import random

import crc32c
import pytest

from gradvault.core.store._checksums import crc32c_combine


def combined(pieces: list[bytes]) -> int:
    value = 0
    for piece in pieces:
        value = crc32c_combine(value, crc32c.crc32c(piece), len(piece))
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
        assert combined(pieces) == crc32c.crc32c(data), (len(data), [len(p) for p in pieces])


def test_equal_chunks_and_a_short_last_one_as_a_chunked_gradient_is_read() -> None:
    rng = random.Random(1)
    data = rng.randbytes(5 * 65536 + 123)
    pieces = [data[start : start + 65536] for start in range(0, len(data), 65536)]
    assert combined(pieces) == crc32c.crc32c(data)


def test_a_flipped_byte_in_any_piece_changes_the_combination() -> None:
    rng = random.Random(2)
    data = bytearray(rng.randbytes(10_000))
    good = crc32c.crc32c(bytes(data))
    for position in (0, 4999, 5000, 9999):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        pieces = [bytes(damaged[:5000]), bytes(damaged[5000:])]
        assert combined(pieces) != good


def test_an_empty_side_leaves_the_other_crc() -> None:
    crc = crc32c.crc32c(b"gradient bytes")
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
