"""The Trainer integration's seams: Trainer internals in one module, behind a version check;
the callback and the mixin talking through public methods only.

The scan is static, with ``ast``, over every module of integrations/transformers/. A
private name (``_x``, not a dunder) is a module's own when the module defines it: at its
top level, in a class body, or as ``self._x``/``cls._x`` assigned in its methods. The
Trainer's and accelerate's private names are read from transformers and accelerate
themselves: the private attributes of ``Trainer``, ``TrainingArguments``, ``TrainerState``,
``TrainerControl``, ``TrainerCallback`` and ``Accelerator``, and every ``self._x`` that
transformers' trainer module and accelerate's accelerator module use.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

import accelerate.accelerator  # noqa: E402 - after the skips
import transformers.trainer  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import (  # noqa: E402
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from gradvault.integrations.transformers import (  # noqa: E402
    GradvaultCallback,
    GradvaultTrainerMixin,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "integrations" / "transformers"
#: the one module allowed to use the Trainer's and accelerate's private names
INTERNALS = "_trainer_internals.py"
#: each protocol of _protocol.py, and the class that implements it
IMPLEMENTERS = {"WindowTrainer": GradvaultTrainerMixin, "SnapshotCallback": GradvaultCallback}
_NAME_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def foreign_private_names() -> frozenset[str]:
    """The private names of the Trainer's and accelerate's objects (see the docstring)."""
    names = {
        name
        for kind in (
            Trainer,
            TrainingArguments,
            TrainerState,
            TrainerControl,
            TrainerCallback,
            Accelerator,
        )
        for name in dir(kind)
        if _private(name)
    }
    for module in (transformers.trainer, accelerate.accelerator):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and _private(node.attr)
            ):
                names.add(node.attr)
    return frozenset(names)


def own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines (top level, class bodies, ``self._x = ...``)."""
    names: set[str] = set()

    def bind(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(statement.name)
                if isinstance(statement, ast.ClassDef):
                    bind(statement.body)
            targets: list[ast.expr] = []
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        names.add(node.id)

    bind(tree.body)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {name for name in names if _private(name)}


def private_uses(source: str, foreign: frozenset[str]) -> list[tuple[int, str, str]]:
    """``(line, kind, name)`` for each use of a private name a module does not own; kind is
    ``trainer`` for a name of the Trainer's or accelerate's objects, else ``other module``."""
    tree = ast.parse(source)
    own = own_names(tree)
    found: list[tuple[int, str, str]] = []

    def use(line: int, name: str) -> None:
        if name in foreign:
            found.append((line, "trainer", name))
        elif name not in own:
            found.append((line, "other module", name))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            use(node.lineno, node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in foreign:
            found.append((node.lineno, "trainer", node.name))  # an override of a private
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if isinstance(node.func, ast.Name):
                callee = node.func.id
            for keyword in node.keywords:
                if keyword.arg is not None and _private(keyword.arg) and callee not in own:
                    found.append((node.lineno, "trainer", f"{callee}({keyword.arg}=)"))
            if callee in _NAME_CALLS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if _private(name.value):
                        use(node.lineno, name.value)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if not node.level and any(_private(part) for part in module.split(".")):
                found.append((node.lineno, "other module", module))
            for alias in node.names:
                if _private(alias.name) and not (node.level and not module):
                    found.append((node.lineno, "other module", f"{module}.{alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, "other module", alias.name))
    return sorted(set(found))


def _uses(kind: str) -> list[str]:
    return [
        f"integrations/transformers/{path.name}:{line}: {name}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name != INTERNALS
        for line, found_kind, name in private_uses(path.read_text(), foreign_private_names())
        if found_kind == kind
    ]


def test_only_the_internals_module_touches_the_trainers_private_names() -> None:
    violations = _uses("trainer")
    assert not violations, (
        f"private names of transformers' Trainer or accelerate used outside {INTERNALS}; "
        "add a function there (and list the name in its docstring):\n" + "\n".join(violations)
    )


def test_no_module_uses_another_modules_private_names() -> None:
    violations = _uses("other module")
    assert not violations, (
        "a module of the integration uses private names it does not define; call a public "
        "method (the callback and the mixin: the protocols of _protocol.py):\n"
        + "\n".join(violations)
    )


def test_the_internals_module_lists_every_private_name_it_uses() -> None:
    path = PACKAGE / INTERNALS
    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source)) or ""
    used = {
        name.split("(")[-1].removesuffix("=)")
        for _, kind, name in private_uses(source, foreign_private_names())
        if kind == "trainer"
    }
    assert {"_tr_loss", "_save_rng_state", "_load_rng_state"} <= used  # it does use them
    unlisted = sorted(name for name in used if not re.search(rf"(?<!\w){name}\b", docstring))
    assert not unlisted, f"{INTERNALS} uses {unlisted} without listing them in its docstring"


def test_the_scan_sees_each_kind_of_private_use() -> None:
    """The rules catch what they are meant to (a scan that finds nothing passes trivially)."""
    source = """
from ._folder import _FOLDER
from transformers._private import thing
import accelerate._state
_log = None
class Mixin:
    _window = None
    def __init__(self):
        self._pending = []
    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
    def step(self, trainer, callback):
        self._window, self._pending, _log
        trainer._tr_loss = 0
        trainer.save_model("x", _internal_call=True)
        self._helper(_flag=True)
        callback._submit(1)
        getattr(trainer, "_globalstep_last_logged")
        getattr(callback, "_pending")
        type(self).__name__
    def _helper(self, _flag):
        pass
"""
    found = private_uses(source, foreign_private_names())
    assert found == [
        (2, "other module", "_folder._FOLDER"),
        (3, "other module", "transformers._private"),
        (4, "other module", "accelerate._state"),
        (10, "trainer", "_load_rng_state"),
        (11, "trainer", "_load_rng_state"),
        (14, "trainer", "_tr_loss"),
        (15, "trainer", "save_model(_internal_call=)"),
        (17, "other module", "_submit"),
        (18, "trainer", "_globalstep_last_logged"),
    ]


def test_each_protocol_is_implemented_with_its_signatures() -> None:
    """The mixin and the callback have every method of the protocol the other calls, with
    the protocol's parameters and annotations, and its attributes."""
    tree = ast.parse((PACKAGE / "_protocol.py").read_text())
    protocols = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id == "Protocol" for base in node.bases)
    }
    assert protocols.keys() == IMPLEMENTERS.keys()
    callback = GradvaultCallback("store")
    for name, protocol in protocols.items():
        implementer = IMPLEMENTERS[name]
        methods = [node for node in protocol.body if isinstance(node, ast.FunctionDef)]
        assert methods, name
        for method in methods:
            assert not _private(method.name), (name, method.name)
            found = inspect.signature(getattr(implementer, method.name))
            expected = [
                (argument.arg, ast.unparse(argument.annotation) if argument.annotation else None)
                for argument in method.args.args
            ]
            parameters = [
                (parameter.name, None if parameter.name == "self" else str(parameter.annotation))
                for parameter in found.parameters.values()
            ]
            assert parameters == expected, (implementer.__name__, method.name)
            returns = ast.unparse(method.returns) if method.returns else None
            assert str(found.return_annotation) == returns, (implementer.__name__, method.name)
        for node in protocol.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                assert implementer is GradvaultCallback, (name, node.target.id)
                assert hasattr(callback, node.target.id), (name, node.target.id)


def _pinned_range() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [
        requirement.removeprefix("transformers")
        for requirement in pyproject["project"]["optional-dependencies"]["hf"]
        if requirement.startswith("transformers")
    ]
    assert len(pins) == 1, pins
    return pins[0]


#: imports the package afresh under each transformers version given, and says what happened
_IMPORT_UNDER = """
import json, sys
import transformers.trainer  # importing it replaces the module sys.modules holds as transformers
from gradvault.core import UnsupportedSetupError
package, *versions = sys.argv[1:]
outcomes = {}
for version in versions:
    sys.modules["transformers"].__version__ = version
    for name in [name for name in sys.modules if name.startswith(package)]:
        del sys.modules[name]
    try:
        __import__(package)
        outcomes[version] = None
    except UnsupportedSetupError as error:
        outcomes[version] = str(error)
print(json.dumps(outcomes))
"""


def test_the_package_refuses_a_transformers_outside_the_pinned_range() -> None:
    """Imported under versions outside the hf extra's pin, the package raises
    UnsupportedSetupError naming the version found and the range; inside, it imports."""
    pinned = _pinned_range()
    refused = ["6.0.0", "6.0.0.dev0", "5.24.2", "4.57.1", "5.25.0rc1", "not-a-version"]
    accepted = ["5.25.0", "5.25.1", "5.99.0"]
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_UNDER,
            "gradvault.integrations.transformers",
            *refused,
            *accepted,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = json.loads(run.stdout.strip().splitlines()[-1])
    for version in accepted:
        assert outcomes[version] is None, (version, outcomes[version])
    for version in refused:
        message = outcomes[version]
        assert message is not None, f"transformers {version} was accepted"
        assert f"transformers {version} is installed" in message, message
        assert pinned in message, (pinned, message)
