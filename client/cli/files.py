"""Snapshot files on disk: ``.safetensors`` (as the service serves them) and ``.npz``.

``pull`` writes them, ``push`` reads them. An ``.npz`` holds one array per gradient keyed
by its ParamId text (names are not kept there; a pushed ``.npz`` names each gradient by
its ParamId).

A written file gets the mode any new file gets from the process's umask (0644 under the
usual 022), as curl's and wget's downloads do: the part file ``mkstemp`` creates is 0600
while it fills, and takes that mode only once whole, just before the rename.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from gradvault.core import (
    GradientRecordEntry,
    GradientsParamsRecord,
    GradvaultError,
    InvalidUploadError,
)
from gradvault.core.file_mode import new_file_mode
from gradvault.core.records.safetensors_file import record_from_safetensors

from .errors import UsageError

SUFFIXES = (".safetensors", ".npz")


def check_suffix(path: Path, command: str) -> None:
    """UsageError unless ``path`` ends in one of :data:`SUFFIXES`."""
    if path.suffix not in SUFFIXES:
        raise UsageError(
            f"{command} works on .safetensors or .npz files; {str(path)!r} is neither",
            prog=f"gradvault {command}",
        )


def read_record(path: Path) -> GradientsParamsRecord:
    """The gradients a ``.safetensors`` or ``.npz`` file holds (the file is mapped or read)."""
    if not path.is_file():
        if path.exists():
            raise IsADirectoryError(21, "not a file", str(path))
        raise FileNotFoundError(2, "no such file", str(path))
    if path.suffix == ".npz":
        return _read_npz(path)
    try:
        return record_from_safetensors(path)
    except InvalidUploadError as error:
        raise InvalidUploadError(f"{path} is not a gradvault safetensors file: {error}") from None


def _read_npz(path: Path) -> GradientsParamsRecord:
    try:
        archive = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise InvalidUploadError(f"{path} is not a readable .npz file: {error}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InvalidUploadError(f"{path} holds one .npy array, not an .npz archive")
    with archive:
        try:
            entries = [GradientRecordEntry.from_array(key, key, archive[key]) for key in archive]
        except (GradvaultError, ValueError, zipfile.BadZipFile, OSError) as error:
            raise InvalidUploadError(
                f"{path}: an .npz to push holds one array per gradient keyed by its ParamId "
                f"(as 'gradvault pull -o FILE.npz' writes it): {error}"
            ) from None
    return GradientsParamsRecord(entries)


def save_npz(path: Path, record: GradientsParamsRecord) -> None:
    """Write ``record``'s gradients to ``path`` as an ``.npz`` keyed by ParamId text."""
    # Any: np.savez's stubs would take a key "allow_pickle" for its own keyword
    arrays: dict[str, Any] = {str(entry.param_id): entry.array for entry in record}
    with partial_file(path) as part:
        with open(part, "wb") as file:
            np.savez(file, **arrays)


async def save_stream(
    path: Path,
    pieces: AsyncIterator[bytes | memoryview],
    progress: Callable[[int, int | None], None] | None = None,
    total: int | None = None,
) -> int:
    """Write the ``pieces`` of a file to ``path`` (renamed into place once whole); its size.

    ``progress(done, total)`` is called after each piece when given.
    """
    done = 0
    with partial_file(path) as part:
        with open(part, "wb") as file:
            async for piece in pieces:
                file.write(piece)
                done += len(piece) if isinstance(piece, bytes) else memoryview(piece).nbytes
                if progress is not None:
                    progress(done, total)
    return done


@contextmanager
def partial_file(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` that becomes ``path`` if the block succeeds."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(descriptor)
    part = Path(name)
    try:
        yield part
        os.chmod(part, new_file_mode())
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
