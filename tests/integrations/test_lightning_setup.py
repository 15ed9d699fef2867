"""GradvaultCallback's arguments, the setups it refuses, and the Lightning range it accepts."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed")

import lightning as L  # noqa: E402
from lightning.pytorch.strategies import (  # noqa: E402
    DDPStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
)

from gradvault.integrations.lightning import (  # noqa: E402
    SUPPORTED_LIGHTNING,
    GradvaultCallback,
    UnsupportedSetupError,
)
from gradvault.integrations.lightning._loop_internals import (  # noqa: E402
    check_lightning_version,
)
from tests.integrations.lightning_run import Classifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"every": 0}, ValueError, "every must be an int >= 1 or None; got 0"),
        ({"every": "3"}, TypeError, "every must be an int >= 1 or None; got '3'"),
        ({"on_sigterm": 1}, TypeError, "on_sigterm must be True or False; got 1"),
    ],
)
def test_bad_arguments_are_refused_when_built(
    tmp_path: Path, arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        GradvaultCallback(tmp_path / "store", **arguments)


def test_keep_last_is_a_stores_retention(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last is a store's retention"):
        GradvaultCallback("http://127.0.0.1:8000", keep_last=3)
    GradvaultCallback(tmp_path / "store", keep_last=3)


def test_the_checkpoint_is_found_by_fit_ckpt_path_last(tmp_path: Path) -> None:
    callback = GradvaultCallback(tmp_path / "store", dirpath=tmp_path / "ckpt")
    assert callback.ckpt_path == str(tmp_path / "ckpt" / "gradvault-last.ckpt")
    assert isinstance(callback, L.pytorch.callbacks.OnExceptionCheckpoint)


@pytest.mark.parametrize(
    ("strategy", "says"),
    [
        (FSDPStrategy(), "does not support FSDPStrategy: its gradients are sharded"),
        (ModelParallelStrategy(), "does not support ModelParallelStrategy"),
    ],
)
def test_sharded_strategies_are_refused(tmp_path: Path, strategy: Any, says: str) -> None:
    callback = GradvaultCallback(tmp_path / "store")
    trainer = SimpleNamespace(strategy=strategy)
    with pytest.raises(UnsupportedSetupError, match=says):
        callback.setup(trainer, Classifier(), "fit")


def test_manual_optimization_is_refused(tmp_path: Path) -> None:
    module = Classifier()
    module.automatic_optimization = False
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False)
    with pytest.raises(UnsupportedSetupError, match="needs automatic optimization"):
        GradvaultCallback(tmp_path / "store").setup(trainer, module, "fit")


def test_ddp_with_a_service_target_is_refused() -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        logger=False,
    )
    with pytest.raises(
        UnsupportedSetupError, match=r"commits it to a store only \(not yet through a service URL\)"
    ):
        GradvaultCallback("http://127.0.0.1:8000").setup(trainer, Classifier(), "fit")


def test_other_strategies_are_refused(tmp_path: Path) -> None:
    class OtherStrategy:
        pass

    trainer = SimpleNamespace(strategy=OtherStrategy())
    with pytest.raises(UnsupportedSetupError, match="DDPStrategy; the strategy is OtherStrategy"):
        GradvaultCallback(tmp_path / "store").setup(trainer, Classifier(), "fit")


@pytest.mark.parametrize("installed", ["2.7.0", "2.6.0rc1", "2.5.6", "3.0.0", "not-a-version"])
def test_lightning_outside_the_tested_range_is_refused(installed: str) -> None:
    with pytest.raises(UnsupportedSetupError) as raised:
        check_lightning_version(installed)
    message = str(raised.value)
    assert f"lightning {installed} is installed" in message
    assert SUPPORTED_LIGHTNING in message


@pytest.mark.parametrize("installed", ["2.6.0", "2.6.6", "2.6.99"])
def test_lightning_in_the_tested_range_is_accepted(installed: str) -> None:
    check_lightning_version(installed)


def test_the_range_is_the_extras_pin() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [
        requirement.removeprefix("lightning")
        for requirement in pyproject["project"]["optional-dependencies"]["lightning"]
        if requirement.startswith("lightning")
    ]
    assert pins == [SUPPORTED_LIGHTNING]


def test_the_packages_public_names() -> None:
    import gradvault.integrations.lightning as package  # noqa: PLC0415

    assert package.__all__ == [
        "SUPPORTED_LIGHTNING",
        "GradvaultCallback",
        "IntegrationError",
        "ResumeStateError",
        "UnsupportedSetupError",
    ]


def test_lightnings_private_names_are_used_in_one_module() -> None:
    """Only ``_loop_internals.py`` reaches a private name of another object or module: an
    attribute ``x._name`` on anything but ``self``, or ``from lightning... import _name``."""
    package = ROOT / "integrations" / "lightning"
    found = []
    for path in sorted(package.glob("*.py")):
        if path.name == "_loop_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                    found.append(f"{path.name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
                found += [
                    f"{path.name}:{node.lineno} {a.name}" for a in node.names if _private(a.name)
                ]
    assert found == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")
