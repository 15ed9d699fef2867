"""Snapshot-to-commit and restore against raw disk, torch.save, safetensors and dcp.

Two shapes of gradients: 1 GiB of float32 in 256 parameters, and 10,000 parameters of
1 KiB. Every writer ends with its bytes fsynced (dcp.save as it ships). Each measurement
is the best of a few runs, each into a fresh folder after ``os.sync()``; the reads run
after the writes, so every reader finds its file in the page cache alike.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench._timing import Row, print_rows

CASES = {
    "1 GiB / 256 params": (256, (1 << 30) // 256 // 4),
    "10,000 params x 1 KiB": (10_000, 256),
}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _best(make: Callable[[Path], Callable[[], object]], root: Path, repeat: int) -> float:
    """Best time of ``repeat`` runs; ``make(folder)`` prepares a run into a fresh folder."""
    best = float("inf")
    for attempt in range(repeat):
        folder = root / f"run{attempt}-{time.monotonic_ns()}"
        folder.mkdir()
        run = make(folder)
        os.sync()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        shutil.rmtree(folder, ignore_errors=True)
    return best


def _raw_write(arrays: list[np.ndarray]) -> Callable[[Path], Callable[[], object]]:
    def make(folder: Path) -> Callable[[], object]:
        def run() -> None:
            fd = os.open(folder / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for start in range(0, len(arrays), 64):
                    os.writev(fd, [memoryview(a).cast("B") for a in arrays[start : start + 64]])
                os.fsync(fd)
            finally:
                os.close(fd)

        return run

    return make


def run_case(label: str, count: int, length: int, root: Path, repeat: int) -> list[Row]:
    import gradvault.core as gv

    rng = np.random.default_rng(0)
    base = rng.standard_normal(length).astype(np.float32)
    arrays = [base + np.float32(i) for i in range(count)]
    grads = gv.GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(gv.ParamId(), gv.Tensor._make(array), name=f"layer{i}.weight")
    record = grads.try_to_record()
    names = [f"layer{i}.weight" for i in range(count)]

    recorders: list[gv.Recorder] = []

    def ours_write(folder: Path) -> Callable[[], object]:
        # a trainer snapshots into a store it has open: create the store's folders first
        recorder = gv.Recorder(folder / "store")
        recorder.start_snapshot(gv.GradientsParamsRecord(), run="warm-up", step=0).result()
        recorders.append(recorder)

        def run() -> None:
            recorder.start_snapshot(record, run="bench", step=1).result()

        return run

    peers: dict[str, Callable[[Path], Callable[[], object]]] = {
        "raw write+fsync": _raw_write(arrays)
    }
    try:
        import safetensors.numpy

        def safetensors_write(folder: Path) -> Callable[[], object]:
            tensors = dict(zip(names, arrays, strict=True))

            def run() -> None:
                safetensors.numpy.save_file(tensors, folder / "g.safetensors")
                _fsync_path(folder / "g.safetensors")

            return run

        peers["safetensors+fsync"] = safetensors_write
    except ImportError:
        safetensors = None
    try:
        import torch
        import torch.distributed.checkpoint as dcp

        tensors = {n: torch.from_numpy(a) for n, a in zip(names, arrays, strict=True)}

        def torch_write(folder: Path) -> Callable[[], object]:
            def run() -> None:
                with open(folder / "g.pt", "wb") as f:
                    torch.save(tensors, f)
                    f.flush()
                    os.fsync(f.fileno())

            return run

        def dcp_write(folder: Path) -> Callable[[], object]:
            def run() -> None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dcp.save(tensors, checkpoint_id=folder / "dcp")

            return run

        peers["torch.save+fsync"] = torch_write
        peers["dcp.save"] = dcp_write
    except ImportError:
        torch = None

    # interleaved, so that a slow spell of the shared disk hits every writer alike
    writers = {"gradvault": ours_write, **peers}
    best = {name: float("inf") for name in writers}
    for _ in range(repeat):
        for name, make in writers.items():
            best[name] = min(best[name], _best(make, root, 1))
    for recorder in recorders:
        recorder.close()
    ours = best["gradvault"]
    rows = [
        Row(
            f"snapshot-to-commit, {label}",
            ours,
            peer,
            best[peer],
            ">= 0.9x raw speed (<= 1.11)"
            if peer.startswith("raw")
            else "<= 1.0"
            if "1 KiB" not in label or peer.startswith("safetensors")
            else "",
        )
        for peer, make in peers.items()
    ]

    # restore: write each format once, then read it back (page cache warm for all)
    keep = root / f"restore-{time.monotonic_ns()}"
    keep.mkdir()
    recorder = gv.Recorder(keep / "store")
    info = recorder.start_snapshot(record, run="bench", step=0).result()
    _raw_write(arrays)(keep)()
    readers: dict[str, Callable[[], object]] = {}

    def raw_read() -> None:
        size = os.path.getsize(keep / "raw.bin")
        buffer = bytearray(size)
        with open(keep / "raw.bin", "rb", buffering=0) as f:
            f.readinto(buffer)

    readers["raw read"] = raw_read
    if safetensors is not None:
        safetensors.numpy.save_file(dict(zip(names, arrays, strict=True)), keep / "g.safetensors")
        readers["safetensors load"] = lambda: safetensors.numpy.load_file(keep / "g.safetensors")
    if torch is not None:
        torch.save(tensors, keep / "g.pt")
        readers["torch.load"] = lambda: torch.load(keep / "g.pt")

    def ours_read() -> None:
        restored = recorder.sync.restore(info.id, "cpu")
        assert len(restored) == count

    def best_of(fn: Callable[[], object], runs: int) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    read_best = {name: float("inf") for name in ["gradvault", *readers]}
    for _ in range(repeat):
        for name, fn in {"gradvault": ours_read, **readers}.items():
            read_best[name] = min(read_best[name], best_of(fn, 1))
    for peer in readers:
        target = (
            ">= 0.9x raw speed (<= 1.11)"
            if peer == "raw read"
            else ("<= 1.0" if peer == "safetensors load" else "")
        )
        rows.append(Row(f"restore, {label}", read_best["gradvault"], peer, read_best[peer], target))
    recorder.close()
    shutil.rmtree(keep, ignore_errors=True)
    return rows


def run() -> list[Row]:
    root = Path(os.environ.get("GRADVAULT_BENCH_DIR") or tempfile.mkdtemp(prefix="gv-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    try:
        for label, (count, length) in CASES.items():
            case_rows = run_case(label, count, length, root, repeat=5)
            print_rows(f"Store: {label}", case_rows)
            rows += case_rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    run()
