"""A download lands with the mode the process's umask gives a new file, as curl's does.

The part file it is written to is created 0600 (``mkstemp``); the whole file is given the
umask's mode just before its rename, so no partial file is ever readable by others.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradvault.core import GradientsParamsRecord
from tests.client.cli.conftest import make_record

from .conftest import ClientUnderTest

#: umask -> the mode a downloaded file must have under it
MODES = {0o022: 0o644, 0o027: 0o640}


@pytest.fixture
def store_kind() -> str:
    """The mode of a file written here does not depend on the store behind the service."""
    return "local"


@pytest.fixture(params=sorted(MODES), ids=lambda mask: f"umask{mask:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
async def test_download_honours_the_umask(
    api: ClientUnderTest, tmp_path: Path, umask: int, suffix: str
) -> None:
    record: GradientsParamsRecord = make_record(seed=3)
    summary = await api.call("push", record, run="modes", step=1)
    folder = tmp_path / "downloads"
    folder.mkdir()
    path = folder / f"snap{suffix}"

    assert await api.call("download", summary.id, path) == path

    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode == MODES[umask], f"umask {umask:03o}: {path.name} is {mode:o}"
    assert [entry.name for entry in folder.iterdir()] == [path.name]  # no part left
