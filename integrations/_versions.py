"""The one check of an installed trainer library against the range an integration is
tested with (the range its extra pins in pyproject.toml)."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from gradvault.core.errors import UnsupportedSetupError


def check_release(package: str, installed: str, supported: str, relied_on: str) -> None:
    """Raise UnsupportedSetupError unless ``installed`` of ``package`` is in ``supported``;
    ``relied_on`` says what the integration uses of it ("gradvault's ... relies on ...")."""
    try:
        version: Version | None = Version(installed)
    except InvalidVersion:
        version = None
    if version is None or not SpecifierSet(supported).contains(version, prereleases=True):
        raise UnsupportedSetupError(
            f"{package} {installed} is installed; gradvault's {relied_on} of {package} "
            f"{supported} only: install a release in that range "
            f"(pip install '{package}{supported}')"
        )
