"""The core's module-level imports form no cycle and follow the layer order in
docs/ARCHITECTURE.md: a module imports only from its own layer or the ones below."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "core"

#: lowest first; a module belongs to the longest prefix listed (docs/ARCHITECTURE.md)
LAYERS = [
    ["core.errors"],
    [
        "core.bfloat16",
        "core.backend",
        "core.param_id",
        "core.record_rules",
        "core.op_table",
        "core.grad_mode",
        "core.mapped_file",
    ],
    ["core.graph", "core.gradients"],
    ["core.tensor"],
    ["core.function"],
    ["core.ops", "core.factories"],
    ["core.autograd", "core.nn", "core.record", "core.torch_adapter"],
    ["core.grads", "core.optim", "core.safetensors_file"],
    ["core.accumulator", "core.store"],
    ["core.recorder"],
    ["core.demo", "core"],
]


def _module_name(path: Path) -> str:
    parts = ["core", *path.relative_to(CORE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in CORE.rglob("*.py")}


def _imported(module: str, node: ast.ImportFrom) -> set[str]:
    """The core modules a relative ``from ... import`` at module level makes Python run."""
    if not node.level:
        return set()
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    target = ".".join(base + ([node.module] if node.module else []))
    found = set()
    for alias in node.names:
        name = f"{target}.{alias.name}"
        found.add(name if name in MODULES else target)
    # importing a.b.c runs package a.b first, unless it is one the importer lives in
    for name in list(found):
        parts = name.split(".")
        for end in range(2, len(parts)):
            parent = ".".join(parts[:end])
            if not module.startswith(parent + ".") and module != parent:
                found.add(parent)
    return {name for name in found if name in MODULES and name != module}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        edges: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.ImportFrom):
                edges |= _imported(module, node)
        graph[module] = edges
    return graph


def _layer(module: str) -> int:
    best, layer = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer is not None, f"{module} is in no layer of docs/ARCHITECTURE.md"
    return layer


def test_the_core_has_no_import_cycle() -> None:
    graph = _graph()
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


def test_imports_point_down_the_layers() -> None:
    violations = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert not violations, "\n".join(sorted(violations))


def test_the_layers_in_the_docs_are_the_ones_checked() -> None:
    text = (CORE.parent / "docs" / "ARCHITECTURE.md").read_text()
    for prefixes in LAYERS:
        for prefix in prefixes:
            shown = prefix.replace("core.", "core/").replace(".", "/")
            assert f"`{shown}" in text, f"docs/ARCHITECTURE.md does not place {prefix}"


def test_no_imports_inside_functions_but_optional_ones() -> None:
    """Imports inside functions hide a layer problem; only optional dependencies may wait."""
    optional = {"cupy", "cupyx", "torch"}
    # The S3 backend, and obstore with it, loads only when an S3 store is opened.
    deferred = {("core.store._open.open_store", "._s3")}
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import):
                        names = [alias.name for alias in inner.names]
                    elif isinstance(inner, ast.ImportFrom):
                        names = [("." * inner.level) + (inner.module or "")]
                    else:
                        continue
                    where = f"{module}.{node.name}"
                    if any(
                        name.split(".")[0] not in optional and (where, name) not in deferred
                        for name in names
                    ):
                        found.append(f"{where}: {names}")
    assert not found, "\n".join(sorted(found))


def _owner(private: str) -> str:
    """The package that owns a module path's first private component (``a.b`` for ``a.b._c``)."""
    parts = private.split(".")
    first = next(i for i, part in enumerate(parts) if part.startswith("_"))
    return ".".join(parts[:first])


def test_private_modules_are_used_only_inside_their_package() -> None:
    """``core.ops._common`` serves ``core.ops``; other packages use what it exports."""
    violations = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if any(part.startswith("_") for part in target.split("."))
        and not (module == _owner(target) or module.startswith(_owner(target) + "."))
    ]
    assert not violations, "\n".join(sorted(violations))


def test_the_other_packages_use_only_the_cores_public_modules() -> None:
    root = CORE.parent
    violations = []
    for package in ("service", "client", "cli", "integrations", "gradvault", "zarr_dtypes"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                violations += [
                    f"{path.relative_to(root)} imports {name}"
                    for name in names
                    if name.startswith("gradvault.core.")
                    and any(part.startswith("_") for part in name.split("."))
                ]
    assert not violations, "\n".join(sorted(violations))
