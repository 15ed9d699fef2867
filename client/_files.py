"""Where a download lands: a safetensors file as served, or an ``.npz`` of its gradients."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from gradvault.core import GradientsParamsRecord


def part_beside(path: Path) -> Path:
    """A new empty file in ``path``'s folder to download into before it becomes ``path``."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(descriptor)
    return Path(name)


def place(path: Path, part: Path, record: GradientsParamsRecord) -> None:
    """Put a verified safetensors download ``part`` (holding ``record``, on disk) at ``path``.

    Renamed into place, so ``path`` never holds a partial file; for ``.npz`` the gradients
    are saved instead, keyed by ParamId text. The folder is synced after the rename.
    """
    if path.suffix == ".npz":
        save_npz(path, record)
    else:
        os.replace(part, path)
        _sync_folder(path.parent)


def save_npz(path: Path, record: GradientsParamsRecord) -> None:
    """``record``'s arrays as an ``.npz`` at ``path``: written beside it, synced, renamed."""
    arrays = {str(entry.param_id): entry.array for entry in record}
    part = part_beside(path)
    try:
        with open(part, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(part, path)
        _sync_folder(path.parent)
    finally:
        part.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform can open folders)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
