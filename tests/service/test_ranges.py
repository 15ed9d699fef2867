"""Range and conditional requests (RFC 9110), and the .npy header, as units."""

from __future__ import annotations

import io

import numpy as np
import pytest

from gradvault.service import RangeNotSatisfiableError
from gradvault.service.npy import npy_header
from gradvault.service.ranges import ByteRange, etag_matches, range_applies, select_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", ByteRange(0, 10, 100)),
        ("bytes=90-", ByteRange(90, 100, 100)),
        ("bytes=-10", ByteRange(90, 100, 100)),
        ("bytes=-1000", ByteRange(0, 100, 100)),
        ("bytes=95-1000", ByteRange(95, 100, 100)),
        ("BYTES = 5-5", ByteRange(5, 6, 100)),
    ],
)
def test_one_satisfiable_range_is_selected(header, expected):
    assert select_range(header, 100) == expected


@pytest.mark.parametrize(
    "header",
    [None, "items=0-5", "bytes=5-2", "bytes=abc", "bytes=", "bytes=-", "bytes=0-1,4-5", "0-5"],
)
def test_absent_malformed_or_multiple_ranges_get_the_whole_resource(header):
    assert select_range(header, 100) is None


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=200-300", "bytes=-0", "bytes=100-,150-"])
def test_ranges_that_miss_are_unsatisfiable(header):
    with pytest.raises(RangeNotSatisfiableError) as raised:
        select_range(header, 100)
    assert raised.value.size == 100


def test_content_range_names_inclusive_positions():
    assert ByteRange(0, 10, 100).content_range == "bytes 0-9/100"


def test_if_none_match_and_if_range():
    etag = '"crc32c-0badf00d"'
    assert etag_matches(etag, etag) and etag_matches('W/"x", ' + etag, etag)
    assert etag_matches("*", etag) and not etag_matches('"other"', etag)
    assert not etag_matches(None, etag)
    assert range_applies(None, etag) and range_applies(etag, etag)
    assert not range_applies('"other"', etag)


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float32", (3, 4)), ("float16", ()), ("int64", (0, 5)), ("bool", (7,)), ("uint8", (2, 2))],
)
def test_npy_header_plus_bytes_is_a_file_numpy_loads(dtype, shape):
    array = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
    data = npy_header(dtype, shape) + array.astype(array.dtype.newbyteorder("<")).tobytes()
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    assert loaded.dtype == array.dtype and loaded.shape == shape
    np.testing.assert_array_equal(loaded, array)
