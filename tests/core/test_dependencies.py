"""gradvault with only its declared dependencies: imports and commands print no warning.

The test environment holds far more than gradvault declares (zarr-python, for one, brings
google-crc32c), so a warning that a user's install would print can hide here. Each check
runs in a subprocess that can import only the distributions pyproject.toml declares (and
theirs, recursively): every other top-level module is hidden from the import system, as
if it were not installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

#: Hides every top-level module named in GRADVAULT_HIDDEN_MODULES (a JSON list) from the
#: path-based finder, so that importing one, or ``importlib.util.find_spec`` of it, finds
#: nothing, as for a module that is not installed.
SITECUSTOMIZE = """
import json, os, sys
from importlib.machinery import PathFinder

_HIDDEN = frozenset(json.loads(os.environ["GRADVAULT_HIDDEN_MODULES"]))


class _DeclaredOnly:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):  # importlib.metadata, unchanged
        return PathFinder.find_distributions(*args, **kwargs)

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[sys.meta_path.index(PathFinder)] = _DeclaredOnly
"""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions gradvault declares (with ``extras``), and theirs, recursively."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pending = [Requirement(text) for text in project["dependencies"]]
    for extra in extras:
        pending += [Requirement(text) for text in project["optional-dependencies"][extra]]
    seen: set[str] = {"gradvault"}
    while pending:
        requirement = pending.pop()
        name = _normalized(requirement.name)
        if name == "gradvault":  # gradvault[client,service]: its own extras
            for extra in requirement.extras:
                texts = project["optional-dependencies"][extra]
                pending += [Requirement(text) for text in texts]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # declared for another platform or Python; nothing to import
        for text in requires:
            inner = Requirement(text)
            environments = [{"extra": extra} for extra in ("", *requirement.extras)]
            if inner.marker is None or any(inner.marker.evaluate(e) for e in environments):
                pending.append(inner)
    return seen


def hidden_modules(extras: tuple[str, ...]) -> list[str]:
    """Top-level modules installed here by no distribution of the declared closure."""
    allowed = declared_closure(extras)
    hidden = []
    for module, distributions in importlib.metadata.packages_distributions().items():
        if not any(_normalized(d) in allowed for d in distributions):
            hidden.append(module)
    return sorted(hidden)


def run_declared_only(
    tmp_path: Path, extras: tuple[str, ...], command: list[str]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    hidden = hidden_modules(extras)
    # the check hides something that is installed here, or it would prove nothing
    assert "zarr" in hidden and "pytest" in hidden
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "GRADVAULT_HIDDEN_MODULES": json.dumps(hidden),
        "PYTHONWARNINGS": "default",  # every warning shown, once per place
    }
    return subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_importing_the_core_raises_no_warning_with_the_declared_dependencies(
    tmp_path: Path,
) -> None:
    result = run_declared_only(
        tmp_path, (), [sys.executable, "-W", "error", "-c", "import gradvault.core.store"]
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_gradvault_help_writes_nothing_to_stderr(tmp_path: Path) -> None:
    script = shutil.which("gradvault", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail(f"no gradvault console script beside {sys.executable}")
    result = run_declared_only(tmp_path, ("cli",), [script, "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "usage: gradvault" in result.stdout


def test_every_client_and_service_module_imports_with_the_cli_extra(tmp_path: Path) -> None:
    """What the client and the service import is declared: ``gradvault[cli]`` (the client
    and service extras) installs it. A module importing an undeclared package would pass
    every other test here, where the test extras install it too."""
    walk = (
        "import importlib, pkgutil, gradvault.client, gradvault.service\n"
        "names = [m.name for p in (gradvault.client, gradvault.service)\n"
        "         for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')\n"
        "         if not m.name.endswith('.__main__')]  # that one runs the CLI\n"
        "[importlib.import_module(name) for name in names]\n"
        "print(len(names))\n"
    )
    result = run_declared_only(tmp_path, ("cli",), [sys.executable, "-c", walk])
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 20, result.stdout  # the walk found the modules
