"""Large gradients made by the engine start at a page, so the local store can write them
with O_DIRECT straight from their memory; their values are NumPy's own."""

from __future__ import annotations

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams
from gradvault.core.autodiff import backend

PAGE = backend.PAGE_ALIGNMENT
HUGE = backend.HUGE_PAGE_ALIGNMENT


def record_arrays(model: gv.Module) -> dict[str, np.ndarray]:
    record = GradientsParams.from_module_grad(model).try_to_record()
    return {entry.name: entry.array for entry in record.entries}


def test_a_linear_layers_weight_gradient_starts_at_a_page() -> None:
    gv.manual_seed(0)
    model = gv.Linear(256, 128)  # weight gradient 128 KiB, bias 512 bytes
    x = gv.randn(32, 256)
    model(x).sum().backward()
    arrays = record_arrays(model)
    assert arrays["weight"].ctypes.data % PAGE == 0
    assert arrays["weight"].flags.c_contiguous
    # g.T @ x with g all ones: the weight gradient is each column's sum of x, in float32
    expected = np.matmul(np.ones((128, 32), np.float32), x.numpy())
    assert np.array_equal(arrays["weight"], expected)


def test_a_gradient_of_whole_huge_pages_starts_at_one_and_holds_numpys_values() -> None:
    """The MLP's 1024 x 1024 weight gradients (4 MiB) start at a 2 MiB boundary, so their
    memory is whole huge pages; a result of another size (under 2 MiB, or 3 MiB: its last
    huge page would be partly empty) is page-aligned only, as before."""
    gv.manual_seed(3)
    model = gv.MLP(1024, [1024], 10)
    x = gv.randn(16, 1024)
    model(x).sum().backward()
    arrays = record_arrays(model)
    big = arrays["layers.0.weight"]
    assert big.nbytes == 4 << 20 and big.ctypes.data % HUGE == 0
    exact = backend.empty(np, (512, 1024), np.float32)  # exactly 2 MiB
    assert exact.nbytes == HUGE and exact.ctypes.data % HUGE == 0
    assert exact.flags.c_contiguous and exact.flags.writeable and exact.shape == (512, 1024)
    copied = backend.copy(big)
    assert copied.ctypes.data % HUGE == 0 and np.array_equal(copied, big)
    for shape in [(1023, 512), (768, 1024)]:  # just under 2 MiB; 3 MiB
        product = backend.matmul(
            np.ones((shape[0], 8), np.float32), np.ones((8, shape[1]), np.float32)
        )
        assert product.nbytes % HUGE and product.ctypes.data % PAGE == 0
        assert np.array_equal(product, np.full(shape, 8, np.float32))


def test_an_accumulated_gradient_moved_off_a_snapshot_starts_at_a_page() -> None:
    """A micro-batch added to a gradient a snapshot holds goes into a new buffer (copy-on-
    write): that buffer is page-aligned too, and the snapshot keeps the first sum."""
    gv.manual_seed(1)
    model = gv.Linear(256, 128)
    batches = [gv.randn(8, 256) for _ in range(2)]
    model(batches[0]).sum().backward()
    first = record_arrays(model)["weight"].copy()
    held = GradientsParams.from_module_grad(model).try_to_record()
    model(batches[1]).sum().backward()
    now = record_arrays(model)["weight"]
    assert now.ctypes.data % PAGE == 0
    assert np.array_equal(held.entries[0].array, first)
    ones = np.ones((128, 8), np.float32)
    expected = np.matmul(ones, batches[0].numpy()) + np.matmul(ones, batches[1].numpy())
    assert np.array_equal(now, expected)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "transpose_a"),
    [
        ((64, 512), (512, 256), False),  # 64 KiB: aligned
        ((512, 64), (512, 256), True),  # a transposed view, as g.T @ x
        ((3, 32, 64), (64, 128), False),  # batched, broadcast
        ((4, 8), (8, 16), False),  # small: NumPy's own allocation
    ],
)
def test_matmul_results_are_numpys_and_large_ones_start_at_a_page(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], transpose_a: bool
) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    if transpose_a:
        a = a.T
    out = backend.matmul(a, b)
    assert np.array_equal(out, np.matmul(a, b))
    assert out.dtype == np.float32 and out.flags.c_contiguous
    if out.nbytes >= backend.ALIGNED_MIN_BYTES:
        assert out.ctypes.data % PAGE == 0


def test_matmul_of_mismatched_shapes_raises_numpys_error() -> None:
    with pytest.raises(ValueError):
        backend.matmul(np.ones((2, 300, 200)), np.ones((3, 200, 300)))
    with pytest.raises(ValueError):
        backend.matmul(np.ones((300, 200)), np.ones((300, 200)))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_matmul_keeps_numpys_result_for_other_byte_orders_and_subclasses() -> None:
    """Where NumPy's own result differs from an aligned ``out`` (a non-native byte order
    gives a native result; a subclass gives the subclass), the product is NumPy's own."""
    big = np.arange(256 * 64, dtype=">f4").reshape(256, 64)
    other = np.arange(64 * 256, dtype=">f4").reshape(64, 256)
    out = backend.matmul(big, other)
    assert out.dtype == np.matmul(big, other).dtype and out.dtype.isnative
    assert np.array_equal(out, np.matmul(big, other))
    matrix = np.asmatrix(np.ones((256, 64), np.float32))
    assert type(backend.matmul(matrix, np.asmatrix(np.ones((64, 256), np.float32)))) is np.matrix


def test_copy_and_empty_like_keep_layout_and_byte_order() -> None:
    """A large C-contiguous array's copy starts at a page and keeps its dtype (byte order
    included); a non-contiguous one's copy keeps its layout, as ``copy(order="K")``."""
    big = np.arange(32 * 1024, dtype=">f4").reshape(32, 1024)
    copied = backend.copy(big)
    assert copied.ctypes.data % PAGE == 0 and copied.dtype == big.dtype
    assert np.array_equal(copied, big) and not np.shares_memory(copied, big)
    transposed = np.ones((1024, 32), np.float32).T
    assert backend.copy(transposed).strides == transposed.copy(order="K").strides
    assert backend.empty_like(transposed).strides == np.empty_like(transposed).strides
    assert backend.empty_like(big).ctypes.data % PAGE == 0
