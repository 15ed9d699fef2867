"""The make targets a newcomer runs first, run for real with stand-ins for the machine.

``make browser`` with apt's lock held by another process (an ``apt-get`` that fails as a
locked apt does) must still let ``make test`` go on; ``make gpu-check`` on a machine
without an NVIDIA GPU must install nothing (a ``python`` that records being run stands for
the one that would create the virtual environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKED = "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def stand_in(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def make(target: str, *variables: str, bin_folder: Path, **env: str):
    environment = dict(os.environ, PATH=f"{bin_folder}:{os.environ['PATH']}", **env)
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), target, *variables],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def bin_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    # `sudo -n CMD` runs CMD, so the target takes the same path as root or not
    stand_in(folder, "sudo", '[ "$1" = -n ] && shift\nexec "$@"\n')
    return folder


def test_browser_with_apt_locked_retries_then_says_the_tests_skip(
    tmp_path: Path, bin_folder: Path
) -> None:
    calls = tmp_path / "apt-calls"
    stand_in(bin_folder, "apt-get", f'echo "$*" >> {calls}\necho "{LOCKED}" >&2\nexit 100\n')
    missing = tmp_path / "nowhere" / "chromium"

    done = make("browser", f"CHROMIUM={missing}", bin_folder=bin_folder, BROWSER_RETRY_SECONDS="0")

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1, done.stdout
    assert "the browser tests (tests/ui) will be skipped" in done.stdout
    assert f"no {missing}" in done.stdout and LOCKED in done.stdout and "3 tries" in done.stdout
    tried = calls.read_text().splitlines()
    assert [line.split()[-2:] for line in tried].count(["-y", "chromium"]) == 3, tried


def test_browser_installs_when_apt_is_free(tmp_path: Path, bin_folder: Path) -> None:
    chromium = tmp_path / "usr-bin" / "chromium"
    stand_in(
        bin_folder,
        "apt-get",
        f'case "$*" in *"install -y chromium"*) mkdir -p {chromium.parent}; '
        f"printf '#!/bin/sh\\n' > {chromium}; chmod +x {chromium};; esac\n",
    )

    done = make("browser", f"CHROMIUM={chromium}", bin_folder=bin_folder)

    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"make browser: installed chromium at {chromium}\n",
        "",
    )


def test_gpu_check_without_a_gpu_installs_nothing(tmp_path: Path, bin_folder: Path) -> None:
    stand_in(bin_folder, "nvidia-smi", "echo 'No devices were found' >&2\nexit 6\n")
    ran = tmp_path / "python-ran"
    stand_in(bin_folder, "python-that-installs", f'echo "$*" >> {ran}\nexit 1\n')
    venv = tmp_path / "venv"

    done = make(
        "gpu-check",
        f"VENV={venv}",
        f"PYTHON={bin_folder / 'python-that-installs'}",
        bin_folder=bin_folder,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-check: no NVIDIA GPU on this machine" in done.stdout
    assert not ran.exists(), f"python was run: {ran.read_text()}"
    assert not venv.exists()
