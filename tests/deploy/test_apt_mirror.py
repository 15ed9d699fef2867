"""deploy/apt-mirror.sh: the Debian archive of a machine's apt sources, as
deploy/build-base-image.sh takes it when MIRROR is unset; run on fake sources files.

The repository names no package host: the hosts below are made up for the test.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "apt-mirror.sh"
ARCHIVE = "http://archive.test/debian"
SECURITY = "http://security.test/debian-security"


def apt_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    """An apt configuration folder holding ``files`` (paths relative to it)."""
    folder = tmp_path / "apt"
    (folder / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def mirror(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=30
    )


DEB822 = f"""\
Types: deb
# a comment inside the stanza
URIs: {SECURITY}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {ARCHIVE}
Suites: bookworm bookworm-updates
Components: main
"""


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"sources.list": f"deb {ARCHIVE} bookworm main\n"}, id="one-line"),
        pytest.param(
            {
                "sources.list": "# deb http://old.test/debian bookworm main\n",
                "sources.list.d/a.list": f"deb-src {ARCHIVE}-src bookworm main\n"
                f"deb [arch=amd64 signed-by=/k.gpg] {SECURITY} bookworm-security main\n"
                f"  deb [ arch=amd64 ] {ARCHIVE} bookworm main contrib\n",
            },
            id="options-and-deb-src",
        ),
        pytest.param({"sources.list.d/debian.sources": DEB822}, id="deb822"),
        pytest.param(
            {
                "sources.list.d/a.sources": "Types: deb\nURIs: http://off.test/debian\n"
                "Suites: bookworm\nEnabled: no\n",
                "sources.list.d/b.sources": f"Types: deb-src deb\nURIs:\n {ARCHIVE}\n"
                "Suites: bookworm\nComponents: main",  # no blank line at the end
            },
            id="deb822-disabled-and-continued",
        ),
        pytest.param(
            {
                "sources.list": f"deb {SECURITY} bookworm-security main\n",
                "sources.list.d/z.list": f"deb {ARCHIVE} bookworm main\n",
                "sources.list.d/other.conf": "deb http://not-a-source.test/ bookworm main\n",
            },
            id="sources.list-then-folder",
        ),
    ],
)
def test_the_first_archive_of_a_release_is_found(tmp_path: Path, files: dict[str, str]) -> None:
    found = mirror(apt_dir(tmp_path, files))
    assert (found.returncode, found.stdout, found.stderr) == (0, ARCHIVE + "\n", "")


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({}, id="no-sources"),
        pytest.param({"sources.list": f"# deb {ARCHIVE} bookworm main\n"}, id="commented"),
        pytest.param({"sources.list": f"deb {SECURITY} bookworm-security main\n"}, id="security"),
        pytest.param({"sources.list": "deb cdrom:[Debian 12]/ bookworm main\n"}, id="cdrom"),
    ],
)
def test_no_archive_is_one_line_asking_for_mirror(tmp_path: Path, files: dict[str, str]) -> None:
    folder = apt_dir(tmp_path, files)
    found = mirror(folder)
    assert found.returncode == 1 and found.stdout == ""
    assert found.stderr.count("\n") == 1, found.stderr
    assert str(folder) in found.stderr and "set MIRROR" in found.stderr


def test_build_base_image_stops_before_any_work_without_a_mirror(tmp_path: Path) -> None:
    """No MIRROR and no source: one line, exit 1, before root, debootstrap or Docker."""
    environment = {k: v for k, v in os.environ.items() if k != "MIRROR"}
    environment["APT_DIR"] = str(apt_dir(tmp_path, {}))
    environment["PATH"] = str(tmp_path / "empty-path") + ":/usr/bin:/bin"
    built = subprocess.run(
        ["bash", str(ROOT / "deploy" / "build-base-image.sh")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert built.returncode == 1 and built.stdout == ""
    assert built.stderr.count("\n") == 1 and "set MIRROR" in built.stderr, built.stderr
