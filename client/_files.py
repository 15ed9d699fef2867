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
    """Put a verified safetensors download ``part`` (holding ``record``) at ``path``.

    Renamed into place, so ``path`` never holds a partial file; for ``.npz`` the gradients
    are saved instead, keyed by ParamId text.
    """
    if path.suffix == ".npz":
        save_npz(path, record)
    else:
        os.replace(part, path)


def save_npz(path: Path, record: GradientsParamsRecord) -> None:
    arrays = {str(entry.param_id): entry.array for entry in record}
    part = part_beside(path)
    try:
        with open(part, "wb") as file:
            np.savez(file, **arrays)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
