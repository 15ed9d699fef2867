"""docs/API.md's usage reference names only what exists, and every public method is in it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import gradvault.core as gv
from gradvault.core import store as store_package

ROOT = Path(__file__).resolve().parents[2]


def _s3_backend_class() -> type:
    """The class of an S3 store's backend (opening one reads nothing and connects nowhere;
    the class is not exported, so that importing the store does not import obstore)."""
    store = store_package.open_store(
        "s3://gradvault-test/x",
        endpoint="http://127.0.0.1:9",
        access_key_id="a",
        secret_access_key="b",
    )
    return type(store.backend)


DOCUMENTED = {
    "Recorder": gv.Recorder,
    "SyncRecorder": gv.SyncRecorder,
    "SnapshotHandle": gv.SnapshotHandle,
    "SnapshotInfo": gv.SnapshotInfo,
    "ShardInfo": gv.ShardInfo,
    "SnapshotStore": gv.SnapshotStore,
    "StoreBackend": store_package.StoreBackend,
    "SnapshotWriter": store_package.SnapshotWriter,
    "ShardWriter": store_package.ShardWriter,
    "S3Backend": _s3_backend_class(),
}
FUNCTIONS = {
    "open_store": store_package.open_store,
    "parse_compression": store_package.parse_compression,
    "new_snapshot_id": store_package.new_snapshot_id,
    "check_rank": store_package.check_rank,
}


def _reference() -> str:
    text = (ROOT / "docs" / "API.md").read_text()
    start = text.index("## Usage reference: the Recorder and the store")
    return text[start : text.index("\n## ", start + 1)]


def _named_members(text: str) -> set[tuple[str, str]]:
    """Every ``Class.member`` the reference writes in backticks (after ``await`` too)."""
    found = set()
    for span in re.findall(r"`([^`]+)`", text):
        for owner, member in re.findall(r"\b([A-Z][A-Za-z0-9]+)\.([a-z_][A-Za-z_]*)", span):
            if owner in DOCUMENTED:
                found.add((owner, member))
    return found


def _public_members(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_") and name not in getattr(cls, "__dataclass_fields__", {})
    }


def test_every_documented_name_exists() -> None:
    text = _reference()
    named = _named_members(text)
    assert len(named) > 30
    for owner, member in named:
        assert hasattr(DOCUMENTED[owner], member), f"docs/API.md names {owner}.{member}"
    for name, function in FUNCTIONS.items():
        assert f"`{name}(" in text and callable(function)


def test_every_public_method_is_documented() -> None:
    """A member documented on a documented base class (``StoreBackend.read``) counts for
    its subclasses (``S3Backend``) too."""
    named = _named_members(_reference())
    for owner, cls in DOCUMENTED.items():
        bases = {who for who, base in DOCUMENTED.items() if issubclass(cls, base)}
        missing = sorted(_public_members(cls) - {member for who, member in named if who in bases})
        assert not missing, f"{owner}: {missing} are not in docs/API.md's usage reference"


def test_documented_arguments_are_the_real_ones() -> None:
    """``Class.method(a, b=...)`` in the reference lists the method's own parameter names."""
    text = " ".join(_reference().split())  # signatures may wrap across lines
    for owner, member, arguments in re.findall(
        r"`(?:await )?([A-Z][A-Za-z0-9]+)\.([a-z_]+)\(([^`]*)\)`", text
    ):
        if owner not in DOCUMENTED or arguments in ("...",):
            continue
        real = inspect.signature(getattr(DOCUMENTED[owner], member)).parameters
        for argument in re.findall(r"(?:^|,)\s*\**([a-z_]+)", arguments):
            assert argument in real, f"{owner}.{member} has no parameter {argument!r}"
