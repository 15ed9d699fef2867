"""gradvault's imports follow docs/ARCHITECTURE.md: the packages depend on each other only
as drawn there, the modules of the core follow its layers, nothing forms an import cycle,
no package reaches into another's private modules, and no module reads another's private
names.

The package is read as it is installed (src/gradvault, whose part folders are links to the
repository's root), every module with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gradvault"

#: Which packages each package may import (a module belongs to the longest name listed).
#: Every import counts here: at module level, inside functions and under TYPE_CHECKING.
ALLOWED: dict[str, set[str]] = {
    "gradvault": set(),
    "gradvault.__main__": {"gradvault.client.cli"},
    "gradvault.zarr_dtypes": set(),
    "gradvault.core.errors": set(),
    "gradvault.core.file_mode": set(),
    "gradvault.core.records": {"gradvault.core.errors"},
    "gradvault.core.autodiff": {"gradvault.core.errors", "gradvault.core.records"},
    "gradvault.core.store": {"gradvault.core.errors", "gradvault.core.records"},
    "gradvault.core.store.recorder": {
        "gradvault.core.errors",
        "gradvault.core.records",
        "gradvault.core.store",
        "gradvault.core.autodiff",
    },
    "gradvault.core": {
        "gradvault.core.errors",
        "gradvault.core.file_mode",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
    },
    "gradvault.service": {
        "gradvault.core.errors",
        "gradvault.core.records",
        "gradvault.core.store",
    },
    "gradvault.client": {
        "gradvault.core",
        "gradvault.core.errors",
        "gradvault.core.file_mode",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
    },
    "gradvault.client.cli": {
        "gradvault.core",
        "gradvault.client",
        "gradvault.service",
        "gradvault.core.errors",
        "gradvault.core.file_mode",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
    },
    # the Trainer integration and the shared modules: the torch integration for .grad
    # collective over the ranks (integrations/_grads.py)
    "gradvault.integrations": {
        "gradvault.core",
        "gradvault.client",
        "gradvault.core.errors",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
        "gradvault.integrations.torch",
    },
    # any PyTorch loop: the store through the core (not the client's HTTP side), and no
    # other integration
    "gradvault.integrations.torch": {
        "gradvault.core",
        "gradvault.client",
        "gradvault.core.errors",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
    },
    # Lightning: the torch integration for .grad (collective over the ranks), the
    # integrations' shared generator states and snapshot target, the client for a service
    "gradvault.integrations.lightning": {
        "gradvault.core",
        "gradvault.client",
        "gradvault.core.errors",
        "gradvault.core.records",
        "gradvault.core.autodiff",
        "gradvault.core.store",
        "gradvault.core.store.recorder",
        "gradvault.integrations",
        "gradvault.integrations.torch",
    },
}

#: The core's modules, lowest layer first: at module level a module imports only from its
#: own layer or the ones below (a module belongs to the longest name listed).
LAYERS = [
    ["gradvault.core.errors"],
    [
        "gradvault.core.file_mode",
        "gradvault.core.records.dtypes",
        "gradvault.core.records.param_id",
        "gradvault.core.records.record_rules",
        "gradvault.core.records.mapped_file",
    ],
    ["gradvault.core.records.record"],
    ["gradvault.core.records"],
    [
        "gradvault.core.autodiff.bfloat16",
        "gradvault.core.autodiff.backend",
        "gradvault.core.autodiff.op_table",
        "gradvault.core.autodiff.grad_mode",
    ],
    ["gradvault.core.autodiff.graph", "gradvault.core.autodiff.gradients"],
    ["gradvault.core.autodiff.tensor"],
    ["gradvault.core.autodiff.function"],
    ["gradvault.core.autodiff.ops", "gradvault.core.autodiff.factories"],
    [
        "gradvault.core.autodiff.autograd",
        "gradvault.core.autodiff.nn",
        "gradvault.core.autodiff.torch_adapter",
    ],
    ["gradvault.core.autodiff.gradients_params", "gradvault.core.autodiff.optim"],
    ["gradvault.core.autodiff.accumulator", "gradvault.core.autodiff"],
    ["gradvault.core.store"],
    ["gradvault.core.store.recorder"],
    ["gradvault.core"],
]

#: Imports a function may make: optional dependencies, and the S3 backend (obstore with
#: it), which loads only when an S3 store is opened.
OPTIONAL = {"cupy", "cupyx", "torch"}
DEFERRED = {("gradvault.core.store._open.open_store", "gradvault.core.store._s3")}


@cache
def modules() -> dict[str, Path]:
    """Every module of the installed package tree, by name (links followed)."""
    found = {}
    for folder, _dirs, files in os.walk(PACKAGE, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                parts = ["gradvault", *(Path(folder) / file).relative_to(PACKAGE).parts]
                parts[-1] = parts[-1][:-3]
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = Path(folder) / file
    return found


def _is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text())


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def _defined_in(package: str, name: str) -> str:
    """The module a package's ``__init__`` takes ``name`` from (the package if its own)."""
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            target = _absolute(package, node)
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            inner = f"{target}.{alias.name}"
            if inner in modules():
                return inner
            if target in modules() and _is_package(target) and target != package:
                return _defined_in(target, alias.name)
            return target if target in modules() else package
    return package


def _targets(module: str, node: ast.stmt, through_packages: bool = True) -> set[str]:
    """The gradvault modules an import statement reaches for: a name a package re-exports
    counts as the module that defines it, unless ``through_packages`` is False."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules()}
    if not isinstance(node, ast.ImportFrom):
        return set()
    target = _absolute(module, node)
    if target not in modules():
        return set()
    found = set()
    for alias in node.names:
        inner = f"{target}.{alias.name}"
        if inner in modules():
            found.add(inner)
        elif through_packages and _is_package(target) and target != module:
            found.add(_defined_in(target, alias.name))
        else:
            found.add(target)
    return found - {module}


def _module_level(module: str) -> set[str]:
    """What importing ``module`` makes Python run first (module-level imports only)."""
    found: set[str] = set()
    for node in _tree(module).body:
        found |= _targets(module, node)
    # importing a.b.c runs package a.b first, unless the importer lives in it
    for name in list(found):
        parts = name.split(".")
        for end in range(2, len(parts)):
            parent = ".".join(parts[:end])
            if not module.startswith(parent + ".") and parent in modules():
                found.add(parent)
    return found - {module}


def _anywhere(module: str, through_packages: bool = True) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(_tree(module)):
        found |= _targets(module, node, through_packages)
    return found


def _owner(module: str, table: list[str]) -> str | None:
    best = None
    for prefix in table:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def _unit(module: str) -> str:
    unit = _owner(module, list(ALLOWED))
    assert unit is not None, f"{module} is in no package of docs/ARCHITECTURE.md"
    return unit


def _layer(module: str) -> int:
    flat = {prefix: index for index, prefixes in enumerate(LAYERS) for prefix in prefixes}
    owner = _owner(module, list(flat))
    assert owner is not None, f"{module} is in no layer of docs/ARCHITECTURE.md"
    return flat[owner]


def test_the_tree_is_the_installed_package() -> None:
    import gradvault.core

    assert Path(gradvault.core.__file__).parent == PACKAGE / "core"
    assert {"gradvault.core", "gradvault.service", "gradvault.client"} <= set(modules())
    assert "gradvault.client.cli" in modules() and "gradvault.integrations" in modules()


def test_packages_import_only_what_the_architecture_allows() -> None:
    violations = []
    for module in sorted(modules()):
        unit = _unit(module)
        for target in sorted(_anywhere(module)):
            other = _unit(target)
            if other != unit and other not in ALLOWED[unit]:
                violations.append(f"{module} ({unit}) imports {target} ({other})")
    assert not violations, "\n".join(violations)


def test_nothing_forms_an_import_cycle() -> None:
    graph = {module: _module_level(module) for module in modules()}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_cores_imports_point_down_its_layers() -> None:
    core = [m for m in modules() if m == "gradvault.core" or m.startswith("gradvault.core.")]
    violations = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module in core
        for target in _module_level(module)
        if _layer(target) > _layer(module)
    ]
    assert not violations, "\n".join(sorted(violations))


def test_the_docs_draw_what_is_checked() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for name in [*ALLOWED, *(prefix for prefixes in LAYERS for prefix in prefixes)]:
        assert f"`{name}`" in text, f"docs/ARCHITECTURE.md does not place {name}"


def test_no_imports_inside_functions_but_optional_ones() -> None:
    """Imports inside functions hide a layer problem; only optional dependencies may wait."""
    found = []
    for module in sorted(modules()):
        if not (module == "gradvault.core" or module.startswith("gradvault.core.")):
            continue
        for node in ast.walk(_tree(module)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    names = [alias.name for alias in inner.names]
                elif isinstance(inner, ast.ImportFrom):
                    names = [_absolute(module, inner)]
                else:
                    continue
                where = f"{module}.{node.name}"
                found += [
                    f"{where}: {name}"
                    for name in names
                    if name.split(".")[0] not in OPTIONAL and (where, name) not in DEFERRED
                ]
    assert not found, "\n".join(sorted(found))


def _owner_of_private(module: str) -> str:
    """The package that owns a module's first private component (``a.b`` for ``a.b._c``)."""
    parts = module.split(".")
    first = next(i for i, part in enumerate(parts) if part.startswith("_") and part[1] != "_")
    return ".".join(parts[:first])


def test_private_modules_are_used_only_inside_their_package() -> None:
    """``core.store._local`` serves ``core.store``; other packages use what it exports."""
    violations = []
    for module in sorted(modules()):
        for target in _anywhere(module, through_packages=False):
            if not any(p.startswith("_") and not p.startswith("__") for p in target.split(".")):
                continue
            owner = _owner_of_private(target)
            if not (module == owner or module.startswith(owner + ".")):
                violations.append(f"{module} imports {target}")
    assert not violations, "\n".join(sorted(violations))


def _gradvault_module_names(module: str) -> dict[str, str]:
    """The names under which ``module`` binds gradvault modules (``from . import backend``)."""
    bound = {}
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules():
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules():
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    return bound


def test_no_module_reads_another_modules_private_names() -> None:
    """A module's ``_state`` (say) is its own: others go through its functions."""
    violations = []
    for module in sorted(modules()):
        tree = _tree(module)
        bound = _gradvault_module_names(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, node)
                if target in modules() and target != module:
                    violations += [
                        f"{module} imports {alias.name} from {target}"
                        for alias in node.names
                        if alias.name.startswith("_") and not alias.name.startswith("__")
                    ]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                violations.append(f"{module} reads {bound[node.value.id]}.{node.attr}")
    assert not violations, "\n".join(sorted(violations))
