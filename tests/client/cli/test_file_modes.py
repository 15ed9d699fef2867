"""``gradvault pull`` writes files with the mode the umask gives a new file, as curl does.

Run as a user runs it, in its own process under each umask, from a store and through the
service; the part file stays 0600 until it is whole and renamed.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import (
    COMMAND_TIMEOUT_SECONDS,
    WRITE_TOKEN,
    ServeProcess,
    clean_environment,
    make_record,
    write_safetensors,
)

#: umask -> the mode a pulled file must have under it
MODES = {0o022: 0o644, 0o027: 0o640}


def run_with_umask(umask: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gradvault", *args],
        env=clean_environment(),
        cwd=cwd,
        umask=umask,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        check=False,
    )


@pytest.mark.parametrize("where", ["store", "service"])
def test_pull_honours_the_umask(service: ServeProcess, tmp_path: Path, where: str) -> None:
    source = write_safetensors(tmp_path / "grads.safetensors", make_record(seed=4))
    location = (
        ["--store", str(tmp_path / "store")]
        if where == "store"
        else ["--url", service.url, "--token", WRITE_TOKEN]
    )
    pushed = run_with_umask(
        0o022, "push", str(source), "--run", "modes", "--step", "1", *location, cwd=tmp_path
    )
    assert pushed.returncode == 0, pushed.stderr
    snapshot_id = pushed.stdout.split()[1].rstrip(":")

    for umask, expected in MODES.items():
        for suffix in (".safetensors", ".npz"):
            folder = tmp_path / f"out-{umask:03o}{suffix}"
            folder.mkdir()
            path = folder / f"snap{suffix}"
            pulled = run_with_umask(
                umask, "pull", snapshot_id, "-o", str(path), *location, cwd=tmp_path
            )
            assert pulled.returncode == 0, pulled.stderr
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == expected, f"umask {umask:03o}: {path.name} is {mode:o}"
            assert [entry.name for entry in folder.iterdir()] == [path.name]
