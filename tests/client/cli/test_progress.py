"""Progress bars: drawn for a transfer past its delay on a terminal, never into a pipe."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gradvault.client.cli.progress import TransferProgress

from .conftest import WRITE_TOKEN, ServeProcess, clean_environment


def test_a_bar_is_drawn_once_the_delay_has_passed() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with TransferProgress("pull 01J", enabled=True, delay=0.0, console=console) as bar:
        bar(0, 4 << 20)
        bar(4 << 20, 4 << 20)
        assert bar.shown
    drawn = screen.getvalue()
    assert "pull 01J" in drawn and "4.0/4.0 MiB" in drawn


def test_a_transfer_shorter_than_the_delay_draws_nothing() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True)
    with TransferProgress("push", enabled=True, delay=3600.0, console=console) as bar:
        bar(0, 10)
        bar(10, 10)
        assert not bar.shown
    assert screen.getvalue() == ""


def test_no_bar_when_stdout_is_not_a_terminal() -> None:
    with TransferProgress("pull", delay=0.0) as bar:  # pytest captures stdout: not a terminal
        bar(5, 10)
        assert not bar.shown


def test_pull_into_a_pipe_prints_one_line(
    gradvault, service: ServeProcess, tmp_path: Path, gradients_file
) -> None:
    path, _ = gradients_file
    where = ["--url", service.url, "--token", WRITE_TOKEN]
    pushed = gradvault("push", str(path), "--run", "piped", "--step", "1", *where)
    snapshot_id = pushed.out.split()[1].rstrip(":")
    pulled = gradvault("pull", snapshot_id, "-o", str(tmp_path / "p.safetensors"), *where)
    assert pulled.code == 0, pulled.err
    assert len(pulled.out.splitlines()) == 1 and "\x1b" not in pulled.out + pulled.err


def test_pull_on_a_terminal_prints_its_line(
    gradvault, service: ServeProcess, tmp_path: Path, gradients_file
) -> None:
    """On a terminal the output ends in the result line, whether a bar was drawn or not."""
    path, _ = gradients_file
    where = ["--url", service.url, "--token", WRITE_TOKEN]
    pushed = gradvault("push", str(path), "--run", "tty", "--step", "1", *where)
    snapshot_id = pushed.out.split()[1].rstrip(":")
    target = tmp_path / "t.npz"
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gradvault", "pull", snapshot_id, "-o", str(target), *where],
            stdout=follower,
            stderr=subprocess.PIPE,
            env=clean_environment(),
            timeout=180,
            check=False,
        )
        os.close(follower)
        follower = -1
        screen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert done.returncode == 0, done.stderr
    last = screen.decode().strip().splitlines()[-1]
    assert last.startswith(f"wrote {target}: snapshot {snapshot_id}")
    assert target.exists()
