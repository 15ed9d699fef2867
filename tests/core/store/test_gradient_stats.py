"""The manifest's stats of values at the edges of the float range: zeros, tiny, huge.

``max_abs`` is never ``-0.0``, and ``l2_norm`` is non-zero whenever any value is and
finite whenever ``max_abs`` is: the norm is taken of the values scaled by ``max_abs``
where their squares would under- or overflow. Both ways a gradient is stored are covered:
its own array (chunk by chunk) and the packed one.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import crc32c_rs
import ml_dtypes
import numpy as np
import pytest

from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import _stats, open_store
from gradvault.core.store._manifest import pack

TINY64 = np.float64(5e-324)  # the smallest float64 subnormal
TINY32 = np.float32(1e-45)  # the smallest float32 subnormal


def exact_norm(array: np.ndarray) -> float:
    """The L2 norm of the finite values, exactly up to the last rounding (fractions, scaled
    by the largest magnitude so that the float conversions neither under- nor overflow)."""
    values = [Fraction(float(v)) for v in array.astype(np.float64).ravel() if math.isfinite(v)]
    largest = max((abs(v) for v in values), default=Fraction(0))
    if not largest:
        return 0.0
    scaled = sum(((v / largest) ** 2 for v in values), Fraction(0))
    return float(largest) * math.sqrt(scaled)


CASES = {
    "zeros": np.zeros((40, 50), np.float32),
    "negative zeros": -np.zeros((40, 50), np.float32),
    "negative zeros f64": -np.zeros(700, np.float64),
    "f64 subnormals": np.full(700, TINY64) * np.arange(1, 701),
    "f32 subnormals": np.full(3000, TINY32, np.float32),
    "f32 tiny normals": np.full(3000, 1e-30, np.float32),  # squares underflow float32
    "bf16 subnormals": np.full(1000, 1e-40, np.float32).astype(ml_dtypes.bfloat16),
    "f16 subnormal": np.full(900, 6e-8, np.float16),
    "f64 huge": np.full(700, 1e300),  # squares overflow float64
    "f64 tiny with a NaN": np.concatenate([np.full(699, TINY64 * 3), [np.nan]]),
}


def record(arrays: dict[str, np.ndarray]) -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), n, a) for n, a in arrays.items()]
    )


@pytest.mark.parametrize("own_array", [True, False], ids=["own array", "packed"])
async def test_stats_at_the_edges_of_the_float_range(tmp_path: Path, own_array: bool) -> None:
    # stats are taken before the backend writes: one kind of store is enough. Own arrays
    # in chunks of 512 bytes (many chunks per gradient), or every gradient packed.
    threshold = 0 if own_array else 1 << 20
    async with open_store(tmp_path, chunk_bytes=512, pack_threshold=threshold) as store:
        info = await store.write_snapshot(record(CASES), run="r", step=1)
        manifest = await store.info(info.id)
    table = manifest["gradients"]
    assert set(table["array"]) == ({"packed"} if not own_array else set(table["param_id"]))
    for i, name in enumerate(table["name"]):
        array = CASES[name]
        stats = {key: column[i] for key, column in table["stats"].items()}
        max_abs = stats["max_abs"]
        assert math.copysign(1.0, max_abs) == 1.0, (name, stats)  # never -0.0
        finite = array.astype(np.float64)[np.isfinite(array.astype(np.float64))]
        assert max_abs == float(np.abs(finite).max()), (name, stats)
        norm = stats["l2_norm"]
        assert (norm > 0) == (max_abs > 0), (name, stats)
        assert norm != "Infinity" and math.isfinite(norm), (name, stats)
        assert norm >= max_abs, (name, stats)
        want = exact_norm(array)
        assert norm == pytest.approx(want, rel=1e-6, abs=1e-323), (name, stats)


def _wide(values: list[float], count: int = 1 << 14) -> np.ndarray:
    """``values`` repeated to ``count`` float32 values (64 KiB: a large gradient)."""
    return np.resize(np.asarray(values, np.float32), count)


#: float32 gradients of at least the pack threshold, at every edge: a snapshot of them is
#: one chunk written from their own memory, each read whole in one pass for its crc32c and
#: stats (docs/FORMAT.md, "Commit protocol")
ONE_CHUNK_CASES = {
    "normal": np.random.default_rng(3).standard_normal(1 << 14).astype(np.float32),
    "zeros": _wide([0.0]),
    "negative zeros": _wide([-0.0]),
    "f32 subnormals": _wide([TINY32, -TINY32 * 3]),
    "f32 tiny normals": _wide([1e-30, -2e-30]),
    "f32 huge": _wide([3e38, -1e38]),  # squares overflow float32
    "with a NaN": _wide([1.5, np.nan, -2.0]),
    "with an infinity": _wide([1.5, np.inf, -2.0]),
    "only NaNs": _wide([np.nan]),
    "an odd length": np.arange(16_411, dtype=np.float32) - 8_000.5,
}


def _check_columns(
    table: dict, arrays: dict[str, np.ndarray], norms: dict[str, float], rel: float
) -> None:
    """Each gradient's crc32c is that of its bytes, and its stats those of its values: max
    |g| and the NaN and Inf counts exactly, the norm within ``rel`` of ``norms``'."""
    assert table["name"] == list(arrays)
    for i, name in enumerate(table["name"]):
        array = arrays[name]
        want_sum = crc32c_rs.crc32c(array.tobytes())
        assert table["checksum"][i] == f"crc32c:{want_sum:08x}", name
        stats = {key: column[i] for key, column in table["stats"].items()}
        wide = array.astype(np.float64)
        assert stats["nan_count"] == int(np.isnan(wide).sum()), name
        assert stats["inf_count"] == int(np.isinf(wide).sum()), name
        finite = wide[np.isfinite(wide)]
        assert stats["max_abs"] == (float(np.abs(finite).max()) if finite.size else 0.0), name
        assert math.copysign(1.0, stats["max_abs"]) == 1.0, (name, stats)
        want = norms[name]
        assert stats["l2_norm"] == pytest.approx(want, rel=rel, abs=1e-323), (name, stats)


async def test_stats_and_checksums_of_a_snapshot_of_one_chunk(tmp_path: Path) -> None:
    """A snapshot of large float32 gradients within one chunk (its node is the packed
    array): each gradient's crc32c is that of its bytes and its stats those of its values,
    at every edge, with bfloat16 and float64 gradients beside them or not."""
    others = {"bf16": np.full(40_000, 0.75, np.float32).astype(ml_dtypes.bfloat16)}
    others["f64"] = np.linspace(-1.0, 1.0, 10_000)
    norms = {name: exact_norm(array) for name, array in {**ONE_CHUNK_CASES, **others}.items()}
    async with open_store(tmp_path, pack_threshold=64 << 10) as store:
        for arrays in (ONE_CHUNK_CASES, {**ONE_CHUNK_CASES, **others}):
            info = await store.write_snapshot(record(arrays), run="r", step=1)
            manifest = await store.info(info.id)
            assert manifest["packed"]["array"] == ""  # one chunk, the snapshot's node
            _check_columns(manifest["gradients"], arrays, norms, rel=1e-6)
            restored = await store.read_snapshot(info.id)
            for entry in restored:
                assert entry.array.tobytes() == arrays[entry.name].tobytes(), entry.name


def _small(array: np.ndarray, count: int = 256) -> np.ndarray:
    """``array``'s first ``count`` values: a gradient below the pack threshold."""
    return np.ascontiguousarray(array.reshape(-1)[:count])


#: the edges above as small gradients, with other dtypes and an empty one between them
PACKED_CASES = {
    **{name: _small(array) for name, array in ONE_CHUNK_CASES.items()},
    **{f"{name} (whole)": array for name, array in CASES.items() if array.nbytes < 16 << 10},
    "bf16": np.full(300, -0.75, np.float32).astype(ml_dtypes.bfloat16),
    "int8": np.arange(-50, 50, dtype=np.int8),
    "bool": np.array([True, False, True]),
    "empty": np.zeros(0, np.float32),
    "one value": np.array([-3.5], np.float32),
}


@pytest.mark.parametrize("one_chunk", [True, False], ids=["one chunk", "packed buffer"])
async def test_stats_and_checksums_of_packed_small_gradients(
    tmp_path: Path, one_chunk: bool
) -> None:
    """Small gradients packed together, at every edge and of every kind of dtype: in a
    snapshot of one chunk (a run of them beside a large gradient) and in a packed array
    of its own (only small ones, over several chunks): their crc32c and stats are taken
    together (``packed_columns``)."""
    arrays = dict(PACKED_CASES)
    if one_chunk:
        arrays["large"] = ONE_CHUNK_CASES["normal"]
    chunk_bytes = 32 << 20 if one_chunk else 8 << 10
    async with open_store(tmp_path, pack_threshold=64 << 10, chunk_bytes=chunk_bytes) as store:
        info = await store.write_snapshot(record(arrays), run="r", step=1)
        manifest = await store.info(info.id)
        restored = await store.read_snapshot(info.id)
    assert manifest["packed"]["array"] == ("" if one_chunk else "packed")
    assert (manifest["packed"]["chunk_bytes"] < manifest["packed"]["nbytes"]) != one_chunk
    norms = {name: exact_norm(array) for name, array in arrays.items()}
    _check_columns(manifest["gradients"], arrays, norms, rel=1e-7)
    for entry in restored:
        assert entry.array.tobytes() == arrays[entry.name].tobytes(), entry.name


#: only non-empty float32 gradients: every one taken by the one pass where there is one
FLOAT32_CASES = {
    name: array for name, array in PACKED_CASES.items() if array.dtype == np.float32 and array.size
}


@pytest.mark.parametrize("cases", [PACKED_CASES, FLOAT32_CASES], ids=["mixed", "float32"])
@pytest.mark.parametrize("kernel", [True, False], ids=["one pass", "crc32c and NumPy"])
def test_packed_columns_with_and_without_the_one_pass(
    monkeypatch: pytest.MonkeyPatch, kernel: bool, cases: dict[str, np.ndarray]
) -> None:
    """``packed_columns`` gives the same checksums, and the same stats within the sum's
    rounding, through the C extension's one pass and without it, for gradients of mixed
    dtypes and for float32 ones alone."""
    if kernel and _stats.crc32c_parts is None:
        pytest.skip("the C extension has no crc32c_parts on this CPU")
    if not kernel:
        monkeypatch.setattr(_stats, "crc32c_parts", None)
    entries = list(record(cases).entries)
    packed = pack(entries, 1 << 20)
    checksums, columns = _stats.packed_columns(
        packed.buffer,
        packed.offsets,
        [entry.array.nbytes for entry in entries],
        [entry.dtype for entry in entries],
    )
    table = {
        "name": list(cases),
        "checksum": [f"crc32c:{value:08x}" for value in checksums],
        "stats": columns,
    }
    norms = {name: exact_norm(array) for name, array in cases.items()}
    _check_columns(table, cases, norms, rel=1e-7)
