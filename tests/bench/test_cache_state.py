"""The restore rows' cache states: ``drop_cache`` leaves a side's files out of the page
cache and ``warm_cache`` puts every page of them in it (a local restore of a file that is
not cached leaves it out, so the warm rows cannot rely on a restore before the timed one),
giving its advice again where the kernel left a page. Pages are counted with ``mincore``.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from bench.store_io import cached_pages, drop_cache, warm_cache

PAGE = mmap.PAGESIZE


def test_files_dropped_from_the_cache_then_warmed_have_every_page_cached(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "side"
    (folder / "a").mkdir(parents=True)
    files = [folder / "a" / "c.0", folder / "zarr.json"]
    for index, path in enumerate(files):
        with open(path, "wb") as file:
            file.write(os.urandom((3 << 20) + 100 if index == 0 else 300))
            file.flush()
            os.fsync(file.fileno())
    drop_cache(folder)
    if cached_pages(files[0]):
        pytest.skip("this file system keeps its pages in the cache (tmpfs?)")
    assert cached_pages(files[1]) == 0
    warm_cache(folder)
    for path in files:
        assert cached_pages(path) == -(-path.stat().st_size // PAGE), path


def test_a_drop_whose_first_advice_the_kernel_did_not_take_is_given_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe, path = tmp_path / "probe", tmp_path / "c.0"
    for file in (probe, path):
        file.write_bytes(os.urandom(1 << 20))  # every page cached
    os.sync()  # written back: the advice drops clean pages
    drop_cache(probe)
    if cached_pages(probe):
        pytest.skip("this file system keeps its pages in the cache (tmpfs?)")
    real, given = os.posix_fadvise, []

    def first_ignored(fd: int, offset: int, length: int, advice: int) -> None:
        given.append(advice)
        if len(given) > 1:
            real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", first_ignored)
    assert cached_pages(path) == (1 << 20) // PAGE
    drop_cache(path)
    assert cached_pages(path) == 0
    assert given == [os.POSIX_FADV_DONTNEED] * 2
