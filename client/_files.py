"""Where a download lands: a safetensors file as served, or an ``.npz`` of its gradients.

NumPy's format has no bfloat16 (ml_dtypes' dtype saves as ``'<V2'``, opaque bytes), so a
bf16 gradient goes into an ``.npz`` as its 16-bit patterns, ``'<u2'``, as the service's
``.npy`` downloads do: ``np.load(path)[key].view(ml_dtypes.bfloat16)`` is the gradient
bit for bit, without a copy (docs/CLIENT.md).

A download lands with the mode any new file gets from the process's umask (0644 under the
usual 022), as curl's and wget's do: the part file ``mkstemp`` creates is 0600 and stays so
while it fills, and takes the umask's mode only once whole, just before the rename.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gradvault.core import GradientsParamsRecord, bfloat16
from gradvault.core.file_mode import new_file_mode


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
        rename_into_place(part, path)
        _sync_folder(path.parent)


def save_npz(path: Path, record: GradientsParamsRecord) -> None:
    """``record``'s arrays as an ``.npz`` at ``path``: written beside it, synced, renamed.

    bfloat16 arrays are saved as their ``'<u2'`` bit patterns (the module's docstring).
    """
    # Any: np.savez's stubs would take a key "allow_pickle" for its own keyword
    arrays: dict[str, Any] = {str(entry.param_id): _savable(entry.array) for entry in record}
    part = part_beside(path)
    try:
        with open(part, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        rename_into_place(part, path)
        _sync_folder(path.parent)
    finally:
        part.unlink(missing_ok=True)


def rename_into_place(part: Path, path: Path) -> None:
    """Give the whole file ``part`` the umask's mode for a new file, then rename it to ``path``."""
    os.chmod(part, new_file_mode())
    os.replace(part, path)


def _savable(array: np.ndarray) -> np.ndarray:
    """``array`` as NumPy's format can name its dtype: bfloat16 as its uint16 bits (a view)."""
    return array.view(np.uint16) if array.dtype == bfloat16 else array


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
