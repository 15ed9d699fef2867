"""The raw read of ``bench/store_io.py`` reads into memory new to the process, as a restore's
buffers are: never pages another allocation touched and freed."""

from __future__ import annotations

import numpy as np
import pytest

from bench.store_io import fresh_memory


def test_fresh_memory_is_untouched_writable_and_given_back() -> None:
    size = (8 << 20) + 4096
    for _ in range(3):
        # pages filled and freed just before: a heap that handed them back would show them
        used = np.full(size, 0xAB, dtype=np.uint8)
        del used
        with fresh_memory(size) as buffer:
            assert len(buffer) == size and not buffer.readonly
            data = np.frombuffer(buffer, dtype=np.uint8)
            assert not data.any()  # new anonymous pages read as zeros
            data[::4096] = 1
            del data
        with pytest.raises(ValueError):
            buffer[0]  # released with the mapping
