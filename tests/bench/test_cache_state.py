"""The restore rows' cache states: ``drop_cache`` leaves a side's files out of the page
cache and ``warm_cache`` puts every page of them in it (a local restore of a file that is
not cached leaves it out, so the warm rows cannot rely on a restore before the timed one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.store_io import drop_cache, warm_cache

from ..core.os_probes import page_cached

PAGE = 4096


def test_files_dropped_from_the_cache_then_warmed_have_every_page_cached(
    tmp_path: Path,
) -> None:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT to ask the page cache here")
    folder = tmp_path / "side"
    (folder / "a").mkdir(parents=True)
    files = [folder / "a" / "c.0", folder / "zarr.json"]
    for index, path in enumerate(files):
        with open(path, "wb") as file:
            file.write(os.urandom((3 << 20) + 100 if index == 0 else 300))
            file.flush()
            os.fsync(file.fileno())
    drop_cache(folder)
    if page_cached(files[0], 2 << 20):
        pytest.skip("this file system keeps its pages in the cache (tmpfs?)")
    assert not page_cached(files[1], 0)
    warm_cache(folder)
    for path in files:
        for offset in range(0, path.stat().st_size, PAGE):
            assert page_cached(path, offset), (path, offset)
