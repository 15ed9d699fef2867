"""The C extension that takes a float32 gradient's min, max and sum of squares in one pass.

Its kernels (the one the CPU gets, the portable 128-bit one every CPU runs, and, where
the CPU has carry-less multiplies on 256-bit vectors, the ones that take the crc32c in
the same pass: the 256-bit one, and the 512-bit one where the CPU has AVX-512F) are
checked against NumPy on sizes around their vector and block widths and on every kind of
special value, and the last ones' crc32c against crc32c-rs on every count of 1 to 299
values and of 1,019 to 1,093, from unaligned starts and running values; the stats a
commit writes are checked to be the same, within the sum of squares' rounding,
whether the extension is there or not. Where a C compiler is at hand on Linux, the
extension must have been built: an install that silently fell back to NumPy would pass
everything else here.
"""

from __future__ import annotations

import functools
import math
import platform
import shutil
import sys
import sysconfig
from pathlib import Path

import crc32c_rs
import numpy as np
import pytest

from gradvault.core.store import _stats

fused = pytest.importorskip("gradvault.core.store._fused_stats")
with_crc32c = getattr(fused, "crc32c_min_max_sum_squares", None)
needs_crc32c = pytest.mark.skipif(
    with_crc32c is None, reason="the CPU has no carry-less multiplies on 256-bit vectors"
)

#: the kernels that take the crc32c with the stats: the one the CPU gets, and the 256-bit
#: one where that is the 512-bit one
CHECKSUM_KERNELS = {}
if with_crc32c is not None:
    CHECKSUM_KERNELS[fused.CHECKSUM_KERNEL] = with_crc32c
    CHECKSUM_KERNELS["256-bit carry-less multiplies"] = fused.crc32c_min_max_sum_squares_256

KERNELS = {
    "dispatched": fused.min_max_sum_squares,
    "portable": fused.min_max_sum_squares_portable,
}
for name, checksum_kernel in CHECKSUM_KERNELS.items():  # their stats, the crc32c below
    KERNELS[f"with crc32c, {name}"] = functools.partial(
        lambda run, values: run(values, 0)[1:], checksum_kernel
    )
SIZES = [1, 2, 15, 16, 17, 31, 32, 33, 1023, 1024, 1025, 2047, 4101, (1 << 20) + 3]


def reference(values: np.ndarray) -> tuple[float, float, float]:
    wide = values.astype(np.float64)
    return float(values.min()), float(values.max()), float(np.dot(wide, wide))


def test_built_where_a_c_compiler_is_at_hand() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]  # what setup.py runs
    if sys.platform != "linux" or shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on Linux here: the store uses NumPy's passes")
    assert _stats.min_max_sum_squares is fused.min_max_sum_squares
    flags = set(Path("/proc/cpuinfo").read_text().split())
    wide = platform.machine() == "x86_64" and "avx2" in flags
    assert fused.KERNEL == ("256-bit vectors (AVX2)" if wide else "128-bit vectors")
    folding = wide and {"sse4_2", "pclmulqdq", "vpclmulqdq"} <= flags
    assert (with_crc32c is not None) == folding
    assert _stats.CHECKSUM_WITH_STATS == folding
    if folding:
        wider = "avx512f" in flags
        assert fused.CHECKSUM_KERNEL == (
            "512-bit carry-less multiplies (AVX-512)" if wider else "256-bit carry-less multiplies"
        )


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("size", SIZES)
def test_min_max_exact_and_sum_of_squares_close(kernel: str, size: int) -> None:
    rng = np.random.default_rng(size)
    values = (rng.standard_normal(size) * rng.uniform(1e-3, 1e3)).astype(np.float32)
    low, high, sum_squares = KERNELS[kernel](values)
    want_low, want_high, want_sum = reference(values)
    assert (low, high) == (want_low, want_high)
    assert sum_squares == pytest.approx(want_sum, rel=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_extreme_value_found_in_every_position(kernel: str) -> None:
    """Each lane, each block and the tail: the one extreme value is found wherever it is."""
    values = np.ones(1024 + 37, dtype=np.float32)
    for position in range(values.size):
        values[position] = -7.0
        assert KERNELS[kernel](values)[0] == -7.0, position
        values[position] = 9.0
        assert KERNELS[kernel](values)[1] == 9.0, position
        values[position] = 1.0


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("position", [0, 5, 16, 1023, 1024, 1060])
def test_a_nan_or_inf_anywhere_reaches_the_sum_of_squares(kernel: str, position: int) -> None:
    values = np.linspace(-2, 3, 1061, dtype=np.float32)
    values[position] = np.nan
    low, high, sum_squares = KERNELS[kernel](values)
    assert math.isnan(sum_squares)
    finite = np.delete(values, position)
    assert (low, high) == (float(finite.min()), float(finite.max()))  # NaN skipped
    values[position] = -np.inf
    low, _, sum_squares = KERNELS[kernel](values)
    assert sum_squares == math.inf and low == -math.inf


@pytest.mark.parametrize("kernel", KERNELS)
def test_special_values(kernel: str) -> None:
    run = KERNELS[kernel]
    low, high, sum_squares = run(np.full(40, np.nan, dtype=np.float32))
    assert (low, high) == (math.inf, -math.inf) and math.isnan(sum_squares)
    assert run(np.zeros(40, dtype=np.float32)) == (0.0, 0.0, 0.0)
    assert run(np.full(40, -0.0, dtype=np.float32))[2] == 0.0
    assert run(np.full(40, 1e20, dtype=np.float32))[2] == math.inf  # float32 squares overflow
    tiny = np.full(40, 1e-40, dtype=np.float32)  # subnormal: squares underflow to 0
    assert run(tiny)[:2] == (float(tiny[0]), float(tiny[0]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_what_it_refuses(kernel: str) -> None:
    run = KERNELS[kernel]
    with pytest.raises(TypeError, match="float32"):
        run(np.ones(8))  # float64
    with pytest.raises(TypeError, match="float32"):
        run(np.ones(8, dtype=">f4" if sys.byteorder == "little" else "<f4"))
    with pytest.raises(TypeError, match="float32"):
        run(b"\x00" * 16)
    with pytest.raises(ValueError, match="contiguous"):
        run(np.ones(16, dtype=np.float32)[::2])
    with pytest.raises(ValueError, match="no values"):
        run(np.ones(0, dtype=np.float32))


CASES = {
    "normal": np.random.default_rng(1).standard_normal(70_001).astype(np.float32),
    "zeros": np.zeros(3000, dtype=np.float32),
    "zeros and a nan": np.array([0.0] * 50 + [np.nan], dtype=np.float32),
    "nan and inf": np.array([1.0, np.nan, -np.inf, 2.0] * 30, dtype=np.float32),
    "all nan": np.full(33, np.nan, dtype=np.float32),
    "huge": np.array([3e30, -1e38, 5.0] * 20, dtype=np.float32),
    "tiny": np.array([1e-35, -3e-36, 0.0] * 20, dtype=np.float32),
    "one value": np.array([-2.5], dtype=np.float32),
}


@pytest.mark.parametrize("case", CASES)
def test_a_gradients_stats_are_the_same_without_the_extension(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = CASES[case]
    with_extension = _stats.gradient_stats(values)
    monkeypatch.setattr(_stats, "min_max_sum_squares", None)
    without = _stats.gradient_stats(values)
    assert with_extension.keys() == without.keys()
    for key in ("max_abs", "nan_count", "inf_count"):
        assert with_extension[key] == without[key], key
    norm, want = with_extension["l2_norm"], without["l2_norm"]
    if isinstance(want, str):  # "NaN" / "Infinity", as the manifest writes them
        assert norm == want
    else:
        assert norm == pytest.approx(want, rel=1e-7)


@needs_crc32c
@pytest.mark.parametrize("kernel", CHECKSUM_KERNELS)
def test_the_crc32c_of_every_length_start_and_running_value(kernel: str) -> None:
    """Every count of 1 to 299 values (the folds take 32 or 64 at a time, the stats' blocks
    1,024), of 1,019 to 1,093 and 2,081, from buffers that start 0, 4, 28 and 60 bytes into
    an array, continued from running values 0, 1, 0xFFFFFFFF and one at random."""
    with_crc32c = CHECKSUM_KERNELS[kernel]
    rng = np.random.default_rng(7)
    memory = rng.standard_normal(4096).astype(np.float32)
    for start in (0, 1, 7, 15):
        for count in [*range(1, 300), *range(1024 - 5, 1024 + 70), 2048 + 33]:
            values = memory[start : start + count]
            for running in (0, 1, 0xFFFFFFFF, int(rng.integers(2**32))):
                crc, low, high, sum_squares = with_crc32c(values, running)
                assert crc == crc32c_rs.crc32c(values, running), (start, count, running)
            assert (low, high) == (float(values.min()), float(values.max()))


@needs_crc32c
@pytest.mark.parametrize("kernel", CHECKSUM_KERNELS)
def test_its_crc32c_on_bytes_of_any_value(kernel: str) -> None:
    """NaNs, infinities and every bit pattern are bytes to the crc32c like any other."""
    with_crc32c = CHECKSUM_KERNELS[kernel]
    patterns = np.random.default_rng(8).integers(0, 2**32, size=70_001, dtype=np.uint32)
    values = patterns.view(np.float32)
    crc = with_crc32c(values, 0)[0]
    assert crc == crc32c_rs.crc32c(values)
    pieces = np.array_split(values, 7)  # a running crc32c, piece after piece
    running = 0
    for piece in pieces:
        running = with_crc32c(piece, running)[0]
    assert running == crc


@needs_crc32c
@pytest.mark.parametrize("kernel", CHECKSUM_KERNELS)
def test_a_crc_over_32_bits_is_refused(kernel: str) -> None:
    with_crc32c = CHECKSUM_KERNELS[kernel]
    values = np.ones(8, dtype=np.float32)
    with pytest.raises(OverflowError):
        with_crc32c(values, 2**32)
    with pytest.raises(OverflowError):
        with_crc32c(values, -1)
    with pytest.raises(TypeError, match="float32"):
        with_crc32c(np.ones(8), 0)
    with pytest.raises(TypeError, match="2 arguments|not 1"):
        with_crc32c(values)


def checksummed_stats(pieces: list[np.ndarray]) -> tuple[int, dict]:
    """The running crc32c and the stats of ``pieces`` from StatsAccumulator.add_checksummed."""
    accumulator = _stats.StatsAccumulator()
    crc = 0
    for piece in pieces:
        crc = accumulator.add_checksummed(piece, crc)
    return crc, accumulator.result()


@pytest.mark.parametrize("case", CASES)
def test_checksummed_stats_are_those_of_a_crc32c_and_the_stats_apart(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """StatsAccumulator.add_checksummed, the writer's one pass, against crc32c-rs and
    add (the crc32c exact, the stats as add's within the norm's rounding), in pieces."""
    values = CASES[case]
    pieces = np.array_split(values, 3) if values.size > 3 else [values]
    crc, together = checksummed_stats(pieces)
    assert crc == crc32c_rs.crc32c(values)
    monkeypatch.setattr(_stats, "crc32c_min_max_sum_squares", None)
    crc, want = checksummed_stats(pieces)
    assert crc == crc32c_rs.crc32c(values)
    for key in ("max_abs", "nan_count", "inf_count"):
        assert together[key] == want[key], key
    if isinstance(want["l2_norm"], str):
        assert together["l2_norm"] == want["l2_norm"]
    else:
        assert together["l2_norm"] == pytest.approx(want["l2_norm"], rel=1e-7)


with_parts = getattr(fused, "crc32c_parts", None)


@needs_crc32c
def test_crc32c_parts_is_there_with_the_one_pass_crc32c() -> None:
    assert with_parts is not None


@needs_crc32c
def test_crc32c_parts_running_and_own_crc32c_and_stats_of_every_part() -> None:
    """Parts of float32 values (from unaligned starts, some over a block, one over 4 MiB)
    and of bytes of any length (empty ones too), end to end: each part's running and own
    crc32c against crc32c-rs, and a float32 part's stats exactly those of the one-pass
    kernel."""
    rng = np.random.default_rng(11)
    memory = rng.standard_normal((1 << 20) + 64).astype(np.float32)
    for trial in range(60):
        parts: list[memoryview] = []
        stats: list[bool] = []
        for _ in range(int(rng.integers(0, 8))):
            if rng.integers(0, 2):
                start = int(rng.integers(0, 16))
                count = int(rng.choice([1, 31, 32, 33, 1025, 4099, int(rng.integers(1, 9000))]))
                parts.append(memoryview(memory[start : start + count]).cast("B"))
                stats.append(True)
            else:
                parts.append(memoryview(rng.bytes(int(rng.integers(0, 700)))))
                stats.append(False)
        if trial == 0:  # one part over 4 MiB, the span an earlier writer read at a time
            parts, stats = [memoryview(memory).cast("B"), memoryview(b"\0" * 12)], [True, False]
        taken = with_parts(parts, stats)
        assert len(taken) == len(parts)
        running = 0
        for part, wanted, result in zip(parts, stats, taken, strict=True):
            running = crc32c_rs.crc32c(part, running)
            assert result[:2] == (running, crc32c_rs.crc32c(part)), trial
            if wanted:
                values = np.frombuffer(part, np.float32)
                assert result[2:] == with_crc32c(values, 0)[1:], trial
            else:
                assert len(result) == 2


@needs_crc32c
def test_crc32c_parts_combines_parts_of_every_length() -> None:
    """The running crc32c across a part of each length around powers of two, up to 16 MiB
    (the combination shifts the crc32c before by the part's length, bit by bit)."""
    head = memoryview(b"gradvault").cast("B")
    zeros = bytes(1 << 24)
    lengths = sorted({n + d for n in (1 << k for k in range(25)) for d in (-1, 0, 3)} - {0})
    for length in lengths:
        tail = memoryview(zeros)[:length]
        taken = with_parts([head, tail], [False, False])
        assert taken[1][0] == crc32c_rs.crc32c(tail, crc32c_rs.crc32c(head)), length


@needs_crc32c
def test_crc32c_parts_refuses_what_is_not_float32_values_where_stats_are_asked() -> None:
    values = memoryview(np.ones(8, np.float32)).cast("B")
    with pytest.raises(ValueError, match="no whole float32 values"):
        with_parts([values[:6]], [True])
    with pytest.raises(ValueError, match="no whole float32 values"):
        with_parts([values[:0]], [True])
    with pytest.raises(ValueError, match="2 parts but 1 stats flags"):
        with_parts([values, values], [True])
    with pytest.raises(TypeError):
        with_parts([object()], [False])
    with pytest.raises(TypeError, match="not iterable"):
        with_parts(5, [False])
    with pytest.raises(TypeError, match="not 1"):
        with_parts([values])
    assert with_parts([], []) == []


@pytest.mark.parametrize("case", CASES)
def test_stats_from_a_kernel_result_are_those_of_add(case: str) -> None:
    """stats_of_kernel_result (of a part read whole by crc32c_parts) gives the stats of
    StatsAccumulator.add_checksummed (the same kernel's, a slice at a time), field for
    field, special values included (their careful path)."""
    values = CASES[case].reshape(-1)
    if with_parts is None or values.dtype != np.float32 or not values.size:
        pytest.skip("no crc32c_parts here, or no float32 values")
    taken = with_parts([memoryview(values).cast("B")], [True])[0]
    stats = _stats.stats_of_kernel_result(values, *taken[2:])
    assert checksummed_stats([values]) == (taken[1], stats)
    assert list(stats) == ["l2_norm", "max_abs", "nan_count", "inf_count"]


@needs_crc32c
def test_crc32c_parts_reads_the_lists_as_they_were_when_called() -> None:
    """A flag whose truth test empties the caller's lists (any Python code may run there)
    changes nothing of the call: it reads the parts and flags it was given."""
    parts = [b"abcd"] * 4
    stats: list[object] = []

    class Emptying:
        def __bool__(self) -> bool:
            stats.clear()
            parts.clear()
            return False

    stats[:] = [Emptying(), False, False, False]
    taken = with_parts(parts, stats)
    assert [part[0] for part in taken] == [
        crc32c_rs.crc32c(b"abcd" * count) for count in range(1, 5)
    ]
    assert parts == [] and stats == []
