"""The service's seams, read from its source with ``ast``: one owner per mechanism.

- The pages (``service/ui``) call the functions the routes call (``service/queries.py``,
  ``ranges.ranged_response``), never a route module.
- Range, If-Range and If-None-Match are answered in ``ranges.py`` alone: no other module
  makes a 206 or a 304, or reads those headers.
- Who may do what is decided in ``auth.py`` alone: no other module compares tokens.
- No module uses another module's private name.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
MODULES = sorted(SERVICE.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _name(path: Path) -> str:
    return path.relative_to(SERVICE).as_posix()


def _imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports from, as dotted paths inside gradvault.service."""
    package = path.relative_to(SERVICE).parent.parts
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                found.add(".".join([*base, *(node.module or "").split(".")]).strip("."))
            elif node.module and node.module.startswith("gradvault.service"):
                found.add(node.module.removeprefix("gradvault.service").strip("."))
    return found


def test_the_pages_import_no_route_module() -> None:
    found = {
        _name(path): sorted(m for m in _imported_modules(path) if m.split(".")[0] == "routes")
        for path in MODULES
        if _name(path).startswith("ui/")
    }
    assert {name: routes for name, routes in found.items() if routes} == {}


CONDITION_HEADERS = {"range", "if-none-match", "if-range"}


def _range_work(path: Path) -> set[str]:
    """What ``path`` does of range and validator handling (documentation aside)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                value = keyword.value
                if not isinstance(value, ast.Constant):
                    continue
                if keyword.arg == "status_code" and value.value in (206, 304):
                    found.add(f"answers {value.value}")
                if keyword.arg == "alias" and str(value.value).lower() in CONDITION_HEADERS:
                    found.add(f"reads {value.value}")
            for argument in node.args:  # request.headers.get("range")
                if isinstance(argument, ast.Constant) and argument.value in CONDITION_HEADERS:
                    found.add(f"reads {argument.value}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value == "Content-Range":
                found.add("writes Content-Range")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                is_range = isinstance(key, ast.Constant) and key.value == "Content-Range"
                if is_range and isinstance(value, ast.JoinedStr):  # a value, not a document
                    found.add("writes Content-Range")
    return found


def test_ranges_and_validators_are_answered_in_one_module() -> None:
    work = {_name(path): _range_work(path) for path in MODULES}
    # deps.py declares the three request headers once (get_conditions) for every route;
    # error_handlers.py writes the 416's "Content-Range: bytes */size"
    assert {name: done for name, done in work.items() if done} == {
        "ranges.py": {"answers 206", "answers 304", "writes Content-Range"},
        "deps.py": {"reads Range", "reads If-None-Match", "reads If-Range"},
        "error_handlers.py": {"writes Content-Range"},
    }


def _calls(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name):
                found.add(function.id)
            elif isinstance(function, ast.Attribute):
                found.add(function.attr)
    return found


def test_tokens_are_judged_in_one_module() -> None:
    judges = {
        _name(path): sorted(_calls(path) & {"token_scope", "compare_digest", "allows"})
        for path in MODULES
    }
    assert {name: calls for name, calls in judges.items() if calls} == {
        "auth.py": ["allows", "compare_digest", "token_scope"]
    }


def test_no_module_uses_another_modules_private_name() -> None:
    found = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                found += [
                    f"{_name(path)}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{_name(path)}:{node.lineno}: .{node.attr}")
    assert found == []
