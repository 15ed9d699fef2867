"""The store's modules talk to each other through public names only.

One mechanism, one owner (docs/ARCHITECTURE.md, "The snapshot store"): a module of
core/store/ may use its own objects' private names (``self._x``, ``cls._x``), but never a
private attribute of another object (``store._forget``, ``backend._threads``,
``self._backend._run``), nor import another module's private name (``from ._ids import
_x``), nor hand its own private methods to another class to keep (``ZarrView(backend,
self._load_top, ...)``: a mechanism shared as bound methods has no owner). Importing
a ``_module.py`` file's public names is how the package is put together, and is fine.
The scan is static, with ``ast``, over every Python file under core/store/.
"""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[3] / "core" / "store"

#: (file under core/store/, the use as the scan shows it) -> why it may be used. Empty:
#: no exception is needed, and an entry added here must say why a public seam does not fit.
ALLOWED: dict[tuple[str, str], str] = {}

_NAME_CALLS = {"setattr", "getattr", "delattr", "hasattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reached_privates(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` for each private name used on something other than ``self``/``cls``."""
    found: list[tuple[int, str]] = []
    methods = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own:
                found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom):
            found.extend(
                (node.lineno, f"import {alias.name} from {'.' * node.level}{node.module or ''}")
                for alias in node.names
                if _private(alias.name)
            )
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id[:1].isupper():  # a class built with a private bound method
                arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
                found.extend(
                    (node.lineno, f"{node.func.id}(..., {ast.unparse(arg)})")
                    for arg in arguments
                    if isinstance(arg, ast.Attribute)
                    and _private(arg.attr)
                    and isinstance(arg.value, ast.Name)
                    and arg.value.id in ("self", "cls")
                    and arg.attr in methods
                )
            if node.func.id in _NAME_CALLS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if _private(name.value):
                        found.append((node.lineno, f"{node.func.id}(..., {name.value!r})"))
    return sorted(set(found))


def _store_files() -> list[Path]:
    files = sorted(STORE.rglob("*.py"))
    assert len(files) > 10, f"expected the store's modules under {STORE}; found {files}"
    return files


def test_store_modules_reach_into_no_other_objects_private_names() -> None:
    violations = []
    for path in _store_files():
        relative = path.relative_to(STORE).as_posix()
        for line, what in reached_privates(ast.parse(path.read_text(), str(path))):
            if (relative, what) not in ALLOWED:
                violations.append(f"core/store/{relative}:{line}: {what}")
    assert not violations, (
        "modules of core/store/ reach into private names of other objects or modules; give "
        "the mechanism a public method on its owner instead:\n" + "\n".join(violations)
    )


def test_every_allowed_use_is_still_there() -> None:
    """An allowance whose use is gone is removed, so the list stays the list of exceptions."""
    used = set()
    for path in _store_files():
        relative = path.relative_to(STORE).as_posix()
        for _, what in reached_privates(ast.parse(path.read_text())):
            used.add((relative, what))
    assert not set(ALLOWED) - used, sorted(set(ALLOWED) - used)
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_scan_sees_each_kind_of_private_use() -> None:
    """The rules catch what they are meant to (a scan that finds nothing passes trivially)."""
    source = """
from ._ids import _checked
from ._manifest import Manifest
store._forget(snapshot_id)
self._backend._run("x", f)
backend._threads.run(f)
self._threads.run(f)
cls._cache.clear()
getattr(backend, "_known")
getattr(backend, "known")
value.__class__
View(backend, self._load, self._threads, self.load)
def _load(): pass
"""
    found = reached_privates(ast.parse(source))
    assert found == [
        (2, "import _checked from ._ids"),
        (4, "store._forget"),
        (5, "self._backend._run"),
        (6, "backend._threads"),
        (9, "getattr(..., '_known')"),
        (12, "View(..., self._load)"),
    ]
