"""One durable commit of a small snapshot: CPU and wall time against four peers and a floor.

The snapshot is the MLP loop's gradients (``bench.mlp_step``'s model: 8.4 MB in 6
tensors, two 1024x1024 float32 weights, their biases, a 10x1024 head and its bias). Each
side writes the same bytes and returns only once they are durable:

- gradvault: ``Recorder.start_snapshot(grads, ...).result()`` (capture, record, stats,
  checksums, the commit and its fsyncs), into a store it has open, as a trainer does;
- ``safetensors.numpy.save_file`` of the six arrays, then an fsync of the file;
- ``os.writev`` of the six arrays' bytes to one new file, then fsync;
- ``torch.save`` of the six tensors (copies of the arrays, made once), then fsync;
- one ``O_DIRECT`` write of the same bytes (already laid out end to end in page-aligned
  memory, rounded up to 4 KiB) to a new file, then fsync: the floor, no copy and no pass
  over the bytes;
- the floor of a commit that keeps gradvault's checksums and stats: that ``O_DIRECT``
  write and fsync, after the passes over the bytes every gradvault commit makes, each
  once and nothing else: the crc32c of each array (the ``crc32c`` package gradvault
  uses), its max and min (NumPy) and its sum of squares (``np.dot``, BLAS). What
  gradvault spends above it is its files, folders, fsyncs and Python.

CPU is ``getrusage(RUSAGE_SELF)`` (user + system, every thread of the process) around the
call; wall is ``perf_counter``. The sides run interleaved, each round starting one side
later; each row is gradvault against one peer, the median of per-round ratios.
"""

from __future__ import annotations

import mmap
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import numpy as np

from bench._timing import Row, interleaved, print_rows
from bench.mlp_step import BATCH, CLASSES, WIDTH
from bench.store_io import fsync_path

ROUNDS = 30
FLOOR = "crc32c+max+min+sum of squares, O_DIRECT write+fsync"
DIRECT_ALIGNMENT = 4096


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _mlp_gradients() -> object:
    """The gradients of one backward pass of the MLP loop's model (GradientsParams)."""
    import gradvault.core as gv

    gv.manual_seed(0)
    model = gv.MLP(WIDTH, [WIDTH, WIDTH], CLASSES)
    rng = np.random.default_rng(0)
    x = gv.tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = gv.tensor(rng.integers(0, CLASSES, BATCH))
    loss = gv.cross_entropy(model(x), y)
    return gv.GradientsParams.from_grads(loss.backward(), model)


def _writev_file(path: Path, arrays: list[np.ndarray]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        views = [memoryview(a).cast("B") for a in arrays]
        total = sum(len(v) for v in views)
        written = os.writev(fd, views)
        assert written == total, "short writev"
        os.fsync(fd)
    finally:
        os.close(fd)


def _direct_file(path: Path, aligned: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    try:
        written = os.write(fd, aligned)
        assert written == len(aligned), "short O_DIRECT write"
        os.fsync(fd)
    finally:
        os.close(fd)


def _floor_commit(path: Path, arrays: list[np.ndarray], aligned: memoryview) -> None:
    crc = 0
    for array in arrays:
        flat = array.reshape(-1)
        crc = crc32c.crc32c(flat, crc)
        flat.max(), flat.min(), np.dot(flat, flat)
    _direct_file(path, aligned)


def _aligned_copy(arrays: list[np.ndarray]) -> memoryview:
    total = sum(a.nbytes for a in arrays)
    length = -(-total // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT
    buffer = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE)
    view = memoryview(buffer)
    offset = 0
    for array in arrays:
        view[offset : offset + array.nbytes] = memoryview(array).cast("B")
        offset += array.nbytes
    return view


def measure_sides(root: Path, rounds: int = ROUNDS) -> dict[str, tuple[list[float], list[float]]]:
    """Per side, (CPU seconds, wall seconds) of each of ``rounds`` commits."""
    import safetensors.numpy
    import torch

    import gradvault.core as gv

    grads = _mlp_gradients()
    record = grads.try_to_record()  # type: ignore[attr-defined]
    arrays = [np.ascontiguousarray(entry.array) for entry in record.entries]
    names = [f"g{i}" for i in range(len(arrays))]
    tensors = dict(zip(names, arrays, strict=True))
    torch_tensors = {name: torch.from_numpy(a.copy()) for name, a in tensors.items()}
    aligned = _aligned_copy(arrays)
    files = root / "files"
    files.mkdir()
    recorder = gv.Recorder(root / "store")
    recorder.start_snapshot(grads, run="warm-up", step=0).result()
    steps = iter(range(1, 1 << 30))
    samples: dict[str, tuple[list[float], list[float]]] = {}

    def side(name: str, write: Callable[[Path], object], clean: Callable[[], None]) -> None:
        cpu: list[float] = []
        wall: list[float] = []
        samples[name] = (cpu, wall)

        def measure() -> float:
            path = files / f"{name.replace(' ', '-')}-{time.monotonic_ns()}"
            cpu_start, wall_start = _cpu_seconds(), time.perf_counter()
            write(path)
            wall.append(time.perf_counter() - wall_start)
            cpu.append(_cpu_seconds() - cpu_start)
            clean()
            if path.exists():
                path.unlink()
            return wall[-1]

        sides[name] = measure

    written: list[str] = []

    def ours(path: Path) -> None:
        written.append(recorder.start_snapshot(grads, run="bench", step=next(steps)).result().id)

    def forget_ours() -> None:
        while written:
            recorder.sync.delete(written.pop())

    def safetensors_write(path: Path) -> None:
        safetensors.numpy.save_file(tensors, path)
        fsync_path(path)

    def torch_write(path: Path) -> None:
        torch.save(torch_tensors, path)
        fsync_path(path)

    sides: dict[str, Callable[[], float]] = {}
    side("gradvault", ours, forget_ours)
    side("safetensors save_file+fsync", safetensors_write, lambda: None)
    side("os.writev+fsync", lambda p: _writev_file(p, arrays), lambda: None)
    side("torch.save+fsync", torch_write, lambda: None)
    side("O_DIRECT write+fsync", lambda p: _direct_file(p, aligned), lambda: None)
    side(FLOOR, lambda p: _floor_commit(p, arrays, aligned), lambda: None)
    try:
        interleaved(sides, rounds, warmup=2)
    finally:
        recorder.close()
    for cpu, wall in samples.values():  # the warm-up rounds are not samples
        del cpu[:2], wall[:2]
    return samples


def run() -> list[Row]:
    """CPU and wall per commit of the 8.4 MB snapshot, gradvault against each peer."""
    base = os.environ.get("GRADVAULT_BENCH_DIR")
    root = Path(tempfile.mkdtemp(prefix="gv-bench-commit-", dir=base))
    try:
        samples = measure_sides(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours_cpu, ours_wall = samples.pop("gradvault")
    cpu_targets = {"safetensors save_file+fsync": 1.0, "O_DIRECT write+fsync": 4.0}
    wall_targets = {"safetensors save_file+fsync": 1.1}
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    label = "commit of the MLP's gradients (8.4 MB, 6 tensors)"
    rows = []
    for kind, ours, targets, index in (
        ("CPU", ours_cpu, cpu_targets, 0),
        ("wall", ours_wall, wall_targets, 1),
    ):
        for peer, measured in samples.items():
            limit = targets.get(peer)
            rows.append(
                Row(
                    f"{label}, {kind} per commit",
                    ours,
                    peer,
                    measured[index],
                    f"<= {limit}" if limit is not None else "",
                    limit,
                    note=f"load average after: {load}" if peer.startswith("O_DIRECT") else "",
                )
            )
    print_rows("Commit cost: 8.4 MB snapshot, CPU and wall per commit", rows)
    return rows


if __name__ == "__main__":
    run()
