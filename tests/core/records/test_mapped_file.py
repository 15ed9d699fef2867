"""Read-only file mappings: release_pages lets their pages go and nothing else's."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from gradvault.core.records.mapped_file import map_readonly, release_pages
from tests.core.os_probes import mapped_rss

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps"
)


@pytest.fixture
def values_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    values = np.random.default_rng(0).standard_normal(4 << 20).astype(np.float32)  # 16 MiB
    path = tmp_path / "values.bin"
    path.write_bytes(values.tobytes())
    return path, values


def test_released_pages_leave_the_process_and_read_back_the_same(values_file) -> None:
    path, values = values_file
    view = map_readonly(path)
    mapped = np.frombuffer(view, np.float32)
    assert mapped.sum(dtype=np.float64) == values.sum(dtype=np.float64)  # touches every page
    assert mapped_rss(path) >= 15 << 20
    released = release_pages(view[: 8 << 20])
    assert released == 8 << 20
    assert mapped_rss(path) <= (8 << 20) + (2 << 20)  # a folio may straddle the cut
    # a view of a view (as a record's entries are) is found in its mapping too
    assert release_pages(memoryview(mapped[len(mapped) // 2 :].view(np.uint8))) == 8 << 20
    assert mapped_rss(path) == 0
    assert np.array_equal(mapped, values)  # faulted back in from the file


def test_pages_are_released_whatever_other_mappings_came_and_went(values_file) -> None:
    """release_pages looks for a mapping only while one exists: one made and dropped before
    leaves a later one's pages releasable, and dropping one of two leaves the other's."""
    path, _ = values_file
    dropped = map_readonly(path)
    del dropped
    gc.collect()
    first, second = map_readonly(path), map_readonly(path)
    del second
    gc.collect()
    mapped = np.frombuffer(first, np.float32)
    assert mapped.sum(dtype=np.float64) != 0  # touches every page
    assert release_pages(first[: 8 << 20]) == 8 << 20
    assert release_pages(memoryview(b"\0" * 4096)) == 0


def test_memory_of_any_other_kind_is_left_alone(tmp_path: Path, values_file) -> None:
    path, values = values_file
    copied = bytearray(values.tobytes())
    assert release_pages(memoryview(copied)) == 0
    assert release_pages(values) == 0
    anonymous = mmap.mmap(-1, 1 << 20)
    anonymous[:5] = b"still"
    assert release_pages(memoryview(anonymous)) == 0
    assert anonymous[:5] == b"still"
    with open(path, "r+b") as file:  # a caller's own (private, written) mapping
        private = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    private[:4] = b"mine"
    assert release_pages(memoryview(private)) == 0
    assert private[:4] == b"mine"
    assert bytes(copied) == values.tobytes()


def test_an_empty_file_maps_to_an_empty_view(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    view = map_readonly(empty)
    assert len(view) == 0
    assert release_pages(view) == 0
