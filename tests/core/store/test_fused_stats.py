"""The C extension that takes a float32 gradient's min, max and sum of squares in one pass.

Both kernels (the one the CPU gets, and the portable 128-bit one every CPU runs) are
checked against NumPy on sizes around their vector and block widths and on every kind of
special value; the stats a commit writes are checked to be the same, within the sum of
squares' rounding, whether the extension is there or not. Where a C compiler is at hand
on Linux, the extension must have been built: an install that silently fell back to
NumPy would pass everything else here.
"""

from __future__ import annotations

import math
import platform
import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from gradvault.core.store import _stats

fused = pytest.importorskip("gradvault.core.store._fused_stats")

KERNELS = {
    "dispatched": fused.min_max_sum_squares,
    "portable": fused.min_max_sum_squares_portable,
}
SIZES = [1, 2, 15, 16, 17, 31, 32, 33, 1023, 1024, 1025, 2047, 4101, (1 << 20) + 3]


def reference(values: np.ndarray) -> tuple[float, float, float]:
    wide = values.astype(np.float64)
    return float(values.min()), float(values.max()), float(np.dot(wide, wide))


def test_built_where_a_c_compiler_is_at_hand() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]  # what setup.py runs
    if sys.platform != "linux" or shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on Linux here: the store uses NumPy's passes")
    assert _stats.min_max_sum_squares is fused.min_max_sum_squares
    flags = Path("/proc/cpuinfo").read_text()
    wide = platform.machine() == "x86_64" and "avx2" in flags
    assert fused.KERNEL == ("256-bit vectors (AVX2)" if wide else "128-bit vectors")


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
