"""Tests use gradvault through its public seams, not through private names.

A test that reaches into ``obj._private`` or imports ``gradvault.x._module`` breaks when
the internals move, and hides a missing seam: fault injection in the store goes through
``SnapshotStore.backend`` (docs/API.md, "The store's backend"). The scan is static, with
``ast``, over every Python file under ``tests/``: attribute access ``x._name`` (on
anything but the test's own ``self``/``cls``), ``setattr``/``getattr``-style calls with a
private name, imports of private gradvault modules or names, and dotted gradvault paths
with a private part passed as strings (``monkeypatch.setattr("gradvault...._x.y", ...)``).
The few unit tests of a module's own internals are listed in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: (test file, private name used) -> why that test may use it.
ALLOWED = {
    ("client/test_retries.py", "_sleep"): (
        "a unit test of the client's own retry loop: it replaces the client's sleep to "
        "record the backoff delays instead of waiting them out"
    ),
    ("core/store/test_device_stream.py", "gradvault.core.store._device_stream"): (
        "unit tests of core/store/_device_stream.py's internals (RingStreamer) with a fake device"
    ),
    ("core/store/test_checksums.py", "gradvault.core.store._checksums"): (
        "unit tests of core/store/_checksums.py's crc32c combination against a direct "
        "crc32c of the whole buffer: no public call exposes it alone"
    ),
    ("core/store/test_fused_stats.py", "gradvault.core.store._fused_stats"): (
        "unit tests of core/store/_fused_stats.c's two kernels against NumPy: no public "
        "call reaches the portable one on a CPU that gets the other"
    ),
    ("core/store/test_fused_stats.py", "gradvault.core.store._stats"): (
        "the stats with and without the extension (core/store/_stats.py's choice), which "
        "no public call can switch"
    ),
    ("core/store/test_file_writes.py", "gradvault.core.store._file_writes"): (
        "unit tests of core/store/_file_writes.py: O_DIRECT writes and their fallbacks to "
        "the page cache, refusals injected on fcntl and os.write"
    ),
    ("core/store/test_file_writes.py", "gradvault.core.store._checksums"): (
        "the crc32c trailer those writes fill (Crc32cTrailer), compared across both ways"
    ),
    ("core/store/test_file_writes.py", "_exit"): (
        "os._exit: a forked child leaves without running the parent's clean-up"
    ),
    ("core/store/test_cold_reads.py", "gradvault.core.store._local_files"): (
        "unit tests of core/store/_local_files.py's reads: O_DIRECT reads of files not in "
        "the page cache and their fallbacks, refusals injected on set_direct and os.preadv"
    ),
    ("core/store/test_cold_reads.py", "_has_cachestat"): (
        "which of the two cache probes answers (cachestat, or mincore where the kernel has "
        "none): no setting chooses it, and this kernel has cachestat"
    ),
    ("core/store/test_cold_reads.py", "_syscall"): (
        "cachestat refused with EPERM, as a container's seccomp filter refuses it"
    ),
    ("core/store/test_cold_reads.py", "_fill"): (
        "a file that changed length between its fstat and its read, a moment no public "
        "call can be stopped at"
    ),
    ("core/store/test_cold_reads.py", "gradvault.core.store._backend"): (
        "UnexpectedObjectError, what _fill raises for that file (the store turns it into "
        "its own errors before any public call returns)"
    ),
    ("core/store/test_gradient_stats.py", "gradvault.core.store._stats"): (
        "packed_columns with and without the C extension's one pass (crc32c_parts set to "
        "None, as on a CPU without it): no setting chooses it"
    ),
    ("core/store/test_gradient_stats.py", "gradvault.core.store._manifest"): (
        "pack: the packed buffer packed_columns takes, as a write lays it out"
    ),
    ("core/store/test_recorder.py", "_HANDBACK_SECONDS"): (
        "the recorder's hand-back delay made an hour, so that only a caller waiting on the "
        "handle can start the commit; no setting changes that delay"
    ),
    ("core/store/test_recorder_queue.py", "gradvault.core.store._commit_order"): (
        "CommitOrder on its own: the order the Recorder's commits become visible in, "
        "which the store package keeps to itself"
    ),
    ("core/store/test_store_device_write.py", "gradvault.core.store._device_snapshot"): (
        "the store's device write path on its own (DeviceSnapshot), as the Recorder drives "
        "it, with refusals no Recorder call can reach"
    ),
    ("core/store/test_store_device_write.py", "gradvault.core.store._device_stream"): (
        "the RingPool of pinned buffers that path streams through"
    ),
    ("core/store/test_gpu_stream.py", "gradvault.core.store._device_stream"): (
        "tests of core/store/_device_stream.py's internals (RingStreamer, CupyCopier) on "
        "a real CUDA device"
    ),
    ("integrations/torch_loops.py", "gradvault.core.store._local_writer"): (
        "fault injection in a rank: SIGKILL, or a write that never ends, at the step after "
        "its chunks are written (publish_shard), a point no public call stops at"
    ),
    ("integrations/torch_loops.py", "gradvault.core.store._s3"): (
        "the same fault injected at the same step of the S3 backend"
    ),
    ("integrations/torch_ranks.py", "_exit"): (
        "os._exit: a rank ends without gloo's teardown, which may wait for ranks that are gone"
    ),
    ("integrations/test_lightning_setup.py", "gradvault.integrations.lightning._loop_internals"): (
        "the Lightning version check on its own, with versions no installed Lightning has"
    ),
}

_PRIVATE_PATH = re.compile(r"\bgradvault(?:\.[A-Za-z]\w*)*\.(?!__)_\w+")
_NAME_CALLS = {"setattr", "getattr", "delattr", "hasattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_path(node: ast.ImportFrom) -> str:
    return "." * node.level + (node.module or "")


def _gradvault_module(module: str) -> bool:
    return module == "gradvault" or module.startswith("gradvault.")


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, private name)`` for every use of a private name the rules above refuse."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own:
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _gradvault_module(alias.name) and any(
                    _private(part) for part in alias.name.split(".")
                ):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if not _gradvault_module(node.module):
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if isinstance(node.func, ast.Name):
                callee = node.func.id
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            strings = [
                arg.value
                for arg in arguments
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            ]
            if callee in _NAME_CALLS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if _private(name.value):
                        found.append((node.lineno, name.value))
            for text in strings:
                found.extend(
                    (node.lineno, match.group(0)) for match in _PRIVATE_PATH.finditer(text)
                )
    return sorted(set(found))


def _test_files() -> list[Path]:
    this = Path(__file__).resolve()
    return sorted(path for path in TESTS.rglob("*.py") if path.resolve() != this)


def test_tests_use_no_private_names_but_the_allowed_ones() -> None:
    violations = []
    for path in _test_files():
        relative = path.relative_to(TESTS).as_posix()
        for line, name in private_uses(ast.parse(path.read_text(), str(path))):
            if (relative, name) not in ALLOWED:
                violations.append(f"tests/{relative}:{line}: {name}")
    assert not violations, (
        "tests reach into private names; use a public seam (SnapshotStore.backend for the "
        "store's I/O), or, for a unit test of a module's own internals, add it to ALLOWED "
        "with the reason:\n" + "\n".join(violations)
    )


def test_every_allowed_use_is_still_there() -> None:
    """An allowance whose use is gone is removed, so the list stays the list of exceptions."""
    used = set()
    for path in _test_files():
        relative = path.relative_to(TESTS).as_posix()
        used |= {(relative, name) for _, name in private_uses(ast.parse(path.read_text()))}
    assert not set(ALLOWED) - used, sorted(set(ALLOWED) - used)
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_scan_sees_each_kind_of_private_use() -> None:
    """The rules catch what they are meant to (a scan that finds nothing passes trivially)."""
    source = """
import gradvault.core.store._s3
from gradvault.core.store import _local
from gradvault.core.store._write import encode_chunk
from gradvault.core.store.recorder import _capture
from .conftest import S3_BUCKET
store._backend.read = spy
self._threads.run(f)
self.store._backend
monkeypatch.setattr(backend, "_put", put)
monkeypatch.setattr(backend, "put", put)
monkeypatch.setattr("gradvault.core.store._s3.MARKER", 0)
value.__class__
"""
    found = private_uses(ast.parse(source))
    assert {name for _, name in found} == {
        "gradvault.core.store._s3",
        "gradvault.core.store._local",
        "gradvault.core.store._write",
        "gradvault.core.store.recorder._capture",
        "_backend",
        "_put",
    }
    # each line of a private use is reported; the public and own uses are not
    assert {line for line, _ in found} == {2, 3, 4, 5, 7, 9, 10, 12}
