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
  memory of 4 KiB pages, rounded up to 4 KiB) to a new file, then fsync: the floor the
  issue's target is set against, no copy and no pass over the bytes;
- the same write from memory in transparent huge pages (at a 2 MiB boundary, where the
  kernel gives them), as the engine's large gradients are: about half the CPU of the
  write from small pages (the pages it pins), the lowest floor;
- the floor of a commit that keeps gradvault's checksums and stats: that ``O_DIRECT``
  write (from huge pages) and fsync, after the values every gradvault commit computes,
  with no gradvault code: the crc32c of each array (the ``crc32c-rs`` package gradvault
  uses), its max and min (NumPy) and its sum of squares (``np.dot``, BLAS), a pass each.
  gradvault takes the three stats in one pass where its C extension was built
  (core/store/_fused_stats.c), and the crc32c in that pass too where the CPU has 256-bit
  carry-less multiplies, so there this row's passes cost more than its own.

CPU is ``getrusage(RUSAGE_SELF)`` (user + system, every thread of the process) around the
call; wall is ``perf_counter``. The sides run interleaved, each round in the next order
of a Williams design (``bench._timing.round_orders``); each row is gradvault against one
peer, the median of per-round ratios. What a side wrote (gradvault's snapshots, the
peers' files) is removed after the round, not between one side and the next: on this
VM, a side that wrote right after gradvault's snapshot was deleted often paid 4-15 ms
more CPU for the same buffered write, nearly all of it the kernel's copy into the page
cache (2.2-2.8 ms in the other rounds). gradvault's snapshot is deleted through its
store (``Recorder.sync.delete``), as a trainer's retention pass deletes one, so the
store keeps its folder and the next round's commit writes its two files again in place
(spare folders, docs/FORMAT.md "Commit protocol"); the peers' files are unlinked.

The CPU rows count what ran in the process, as the issue's target does. On this VM's
kernel (no interrupt time accounting) an interrupt, and the block layer's completion work
it raises, is charged to whichever thread was running when it came: a commit that
computes while its ``O_DIRECT`` write completes (gradvault's checksum and stats pass runs
while the device writes) is charged for that work, a write that sleeps until it completes
is not; and an ``O_DIRECT`` write into new blocks leaves their conversion from unwritten
to written to the kernel's worker threads, outside the process. So one more row, with no
target, gives the CPU the whole machine spent per commit, gradvault against the
``O_DIRECT`` write: the busy time of ``/proc/stat`` (user, nice, system, interrupts; not
idle, I/O wait or time stolen by the host; the kernel's ticks, given in 1/100 s), over
batches of ``MACHINE_BATCH`` commits of one side, the sides' batches interleaved. What a
batch wrote is removed after it, so all but two of a batch's gradvault commits make new
folders (a store keeps two spare folders) as the write makes new files. The row's note
gives the process's CPU over the same batches.

gradvault's CPU is also split by thread (each thread's own CPU clock,
``time.pthread_getcpuclockid``, read around each commit): the recorder's commit thread,
the store's threads, the ``O_DIRECT`` writer, the recorder's event loop, the fsync
threads, the calling thread, and
the rest (threads Python does not know of, such as the BLAS's, or that ended during the
commit). The means per commit are the CPU rows' note: where a commit's milliseconds go, in
every run.
"""

from __future__ import annotations

import functools
import mmap
import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import crc32c_rs
import numpy as np

from bench._timing import Row, interleaved, print_rows
from bench.mlp_step import BATCH, CLASSES, WIDTH
from bench.store_io import fsync_path
from gradvault.core.autodiff.backend import HUGE_PAGE_ALIGNMENT

ROUNDS = 30
DIRECT = "O_DIRECT write+fsync"
FLOOR = "crc32c+max+min+sum of squares, O_DIRECT write+fsync, from huge pages"
HUGE_FLOOR = "O_DIRECT write+fsync, from huge pages"
LAYOUT_FLOOR = "the same passes and write in the snapshot layout, plain loop"
DIRECT_ALIGNMENT = 4096
#: Commits per batch of the whole-machine CPU row, and batches per side: a batch of one
#: side spans 60-90 ticks of the two cores' clocks, so each tick is 1-2% of it
MACHINE_BATCH = 60
MACHINE_BATCHES = 8


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def busy_seconds(stat_line: str, ticks_per_second: int) -> float:
    """The CPU seconds all cores spent busy, from the first line of ``/proc/stat`` (``cpu``
    then ticks of user, nice, system, idle, iowait, irq, softirq, steal, ...): user,
    nice, system, irq and softirq; idle, I/O wait and time stolen by the host are not
    this machine's work."""
    fields = stat_line.split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"not the first line of /proc/stat: {stat_line!r}")
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / ticks_per_second


def _machine_busy_seconds() -> float | None:
    """:func:`busy_seconds` of this machine now (None where there is no ``/proc/stat``)."""
    try:
        with open("/proc/stat") as stat:
            line = stat.readline()
    except OSError:
        return None
    return busy_seconds(line, os.sysconf("SC_CLK_TCK"))


#: the threads a commit runs on, by the start of their names, and what the note calls them
THREAD_ROLES = (
    ("gradvault-commit", "recorder's commit thread"),
    ("gradvault-store", "store"),
    ("gradvault-direct", "O_DIRECT writer"),
    ("gradvault-recorder", "recorder loop"),
    ("gradvault-fsync", "fsync threads"),
    ("MainThread", "caller"),
)
OTHER_THREADS = "other threads"


def thread_role(name: str) -> str:
    """What the note calls the thread named ``name`` (OTHER_THREADS for one not listed)."""
    return next((role for prefix, role in THREAD_ROLES if name.startswith(prefix)), OTHER_THREADS)


def _cpu_by_thread() -> dict[int, tuple[str, float]]:
    """Per live Python thread (by ident): its role and the CPU seconds its clock shows."""
    clocks: dict[int, tuple[str, float]] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
            continue
        clocks[thread.ident] = (thread_role(thread.name), seconds)
    return clocks


def split_by_thread(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], total: float
) -> dict[str, float]:
    """CPU seconds per role between two :func:`_cpu_by_thread` readings; what ``total``
    (the process's CPU over the same span) leaves is OTHER_THREADS'."""
    spent: dict[str, float] = {}
    for ident, (role, seconds) in after.items():
        spent[role] = spent.get(role, 0.0) + seconds - before.get(ident, (role, 0.0))[1]
    counted = sum(value for role, value in spent.items() if role != OTHER_THREADS)
    spent[OTHER_THREADS] = max(0.0, total - counted)
    return spent


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


def _new_file(path: str, data: memoryview | bytes, direct: bool = False) -> None:
    """Create ``path`` holding ``data``, fsynced (with ``O_DIRECT`` if ``direct``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    try:
        written = os.write(fd, data)
        assert written == len(data), f"short write of {path}"
        os.fsync(fd)
    finally:
        os.close(fd)


def _floor_commit(
    path: Path, arrays: list[np.ndarray], aligned: memoryview, stats: bool = True
) -> None:
    """The arrays' passes (the crc32c only, without ``stats``), then one ``O_DIRECT``
    write of their bytes (``aligned``, laid out once) to the new file ``path``, fsynced."""
    crc = 0
    for array in arrays:
        flat = array.reshape(-1)
        crc = crc32c_rs.crc32c(flat, crc)
        if stats:
            flat.max(), flat.min(), np.dot(flat, flat)
    _new_file(str(path), aligned, direct=True)


def _layout_floor_commit(
    staging: Path,
    committed: Path,
    arrays: list[np.ndarray],
    aligned: memoryview,
    document: bytes,
    stats: bool = True,
) -> None:
    """A one-chunk snapshot's files, folder, fsyncs and rename (format 4: the chunk beside
    the snapshot's document, the packed array's), and the floor's passes (the crc32c only,
    without ``stats``) and write, in one thread: ``staging`` becomes ``committed`` (a
    folder of ``snapshots/``), and both folders the rename changed are fsynced, as a
    store's commit fsyncs them (docs/FORMAT.md, "Commit protocol")."""
    staging.mkdir()
    _floor_commit(staging / "c.0", arrays, aligned, stats)
    _new_file(str(staging / "zarr.json"), document)
    fsync_path(staging)
    staging.rename(committed)
    fsync_path(committed.parent)
    fsync_path(staging.parent)


def _aligned_copy(arrays: list[np.ndarray], huge_pages: bool) -> memoryview:
    """The arrays' bytes end to end, rounded up to 4 KiB, in memory that starts at a 2 MiB
    boundary: in transparent huge pages (``huge_pages``: the cheapest memory to write from
    with O_DIRECT, the one gradvault's engine now puts its large gradients in), or in
    4 KiB pages (``MADV_NOHUGEPAGE``: page-aligned memory as the issue's floor had it)."""
    total = sum(a.nbytes for a in arrays)
    length = -(-total // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT
    buffer = mmap.mmap(-1, length + HUGE_PAGE_ALIGNMENT, flags=mmap.MAP_PRIVATE)
    advice = "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE"
    if hasattr(mmap, advice):
        buffer.madvise(getattr(mmap, advice))
    start = -np.frombuffer(buffer, np.uint8).ctypes.data % HUGE_PAGE_ALIGNMENT
    view = memoryview(buffer)[start : start + length]
    offset = 0
    for array in arrays:
        view[offset : offset + array.nbytes] = memoryview(array).cast("B")
        offset += array.nbytes
    return view


def huge_page_kib(view: memoryview) -> int:
    """KiB of transparent huge pages (``AnonHugePages``) in the mapping that holds ``view``
    (0 where ``/proc/self/smaps`` says nothing of it)."""
    address = np.frombuffer(view, np.uint8).ctypes.data
    inside = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):
                    low, _, high = first.partition("-")
                    inside = int(low, 16) <= address < int(high, 16)
                elif inside and first == "AnonHugePages:":
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure_sides(
    root: Path, rounds: int = ROUNDS
) -> tuple[dict[str, tuple[list[float], list[float]]], list[dict[str, float]], str]:
    """Per side, (CPU seconds, wall seconds) of each of ``rounds`` commits; for each of
    gradvault's commits, its CPU seconds by thread role (:func:`split_by_thread`); and what
    huge pages the floors' two buffers had."""
    import safetensors.numpy
    import torch

    import gradvault.core as gv

    grads = _mlp_gradients()
    record = grads.try_to_record()  # type: ignore[attr-defined]
    arrays = [np.ascontiguousarray(entry.array) for entry in record.entries]
    names = [f"g{i}" for i in range(len(arrays))]
    tensors = dict(zip(names, arrays, strict=True))
    torch_tensors = {name: torch.from_numpy(a.copy()) for name, a in tensors.items()}
    aligned = _aligned_copy(arrays, huge_pages=True)
    small_pages = _aligned_copy(arrays, huge_pages=False)
    files = root / "files"
    files.mkdir()
    recorder = gv.Recorder(root / "store")
    warm_up = recorder.start_snapshot(grads, run="warm-up", step=0).result()
    snapshot_folder = root / "store" / "snapshots" / warm_up.id
    document = (snapshot_folder / "zarr.json").read_bytes()
    layout_root = root / "layout"
    (layout_root / "staging").mkdir(parents=True)
    (layout_root / "snapshots").mkdir()
    steps = iter(range(1, 1 << 30))
    samples: dict[str, tuple[list[float], list[float]]] = {}
    by_thread: list[dict[str, float]] = []
    # each side's files are removed after the round, not before the next side's commit
    after_round: list[Callable[[], object]] = []

    def tidy() -> None:
        for remove in after_round:
            remove()
        after_round.clear()

    def side(name: str, write: Callable[[Path], object], clean: Callable[[], None]) -> None:
        cpu: list[float] = []
        wall: list[float] = []
        samples[name] = (cpu, wall)

        def measure() -> float:
            path = files / f"{name.replace(' ', '-')}-{time.monotonic_ns()}"
            threads_before = _cpu_by_thread() if name == "gradvault" else {}
            cpu_start, wall_start = _cpu_seconds(), time.perf_counter()
            write(path)
            wall.append(time.perf_counter() - wall_start)
            cpu.append(_cpu_seconds() - cpu_start)
            if name == "gradvault":
                by_thread.append(split_by_thread(threads_before, _cpu_by_thread(), cpu[-1]))
            after_round.append(clean)
            after_round.append(functools.partial(path.unlink, missing_ok=True))
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
    side(DIRECT, lambda p: _new_file(str(p), small_pages, direct=True), lambda: None)
    side(HUGE_FLOOR, lambda p: _new_file(str(p), aligned, direct=True), lambda: None)
    side(FLOOR, lambda p: _floor_commit(p, arrays, aligned), lambda: None)

    def layout_floor(path: Path) -> None:
        committed = layout_root / "snapshots" / path.name
        _layout_floor_commit(
            layout_root / "staging" / path.name, committed, arrays, aligned, document
        )
        layout_written.append(committed)

    layout_written: list[Path] = []

    def forget_layout() -> None:
        while layout_written:
            shutil.rmtree(layout_written.pop())

    side(LAYOUT_FLOOR, layout_floor, forget_layout)
    try:
        interleaved(sides, rounds, warmup=2, after_round=tidy)
    finally:
        recorder.close()
    for cpu, wall in samples.values():  # the warm-up rounds are not samples
        del cpu[:2], wall[:2]
    del by_thread[:2]
    pages = (
        f"huge pages in the mapping of each floor buffer ({len(aligned) >> 10} KiB of bytes, "
        f"mapped with 2 MiB more to align them): {huge_page_kib(aligned)} KiB in the "
        f"huge-page one, {huge_page_kib(small_pages)} KiB in the 4 KiB-page one"
    )
    return samples, by_thread, pages


def measure_machine(root: Path) -> dict[str, tuple[list[float], list[float]]] | None:
    """Per side, gradvault and the ``O_DIRECT`` write (DIRECT): the CPU seconds per commit
    the whole machine spent (:func:`busy_seconds`) and those the process spent, over each
    of MACHINE_BATCHES batches of MACHINE_BATCH commits, the sides' batches interleaved
    (module docstring); None where there is no ``/proc/stat``."""
    if _machine_busy_seconds() is None:
        return None
    import gradvault.core as gv

    grads = _mlp_gradients()
    record = grads.try_to_record()  # type: ignore[attr-defined]
    arrays = [np.ascontiguousarray(entry.array) for entry in record.entries]
    small_pages = _aligned_copy(arrays, huge_pages=False)
    files = root / "machine-files"
    files.mkdir()
    recorder = gv.Recorder(root / "machine-store")
    steps = iter(range(1 << 30))
    samples: dict[str, tuple[list[float], list[float]]] = {"gradvault": ([], []), DIRECT: ([], [])}

    def ours() -> Callable[[], object]:
        info = recorder.start_snapshot(grads, run="bench", step=next(steps)).result()
        return functools.partial(recorder.sync.delete, info.id)

    def direct() -> Callable[[], object]:
        path = files / f"direct-{time.monotonic_ns()}"
        _new_file(str(path), small_pages, direct=True)
        return path.unlink

    def batch(name: str, commit: Callable[[], Callable[[], object]]) -> Callable[[], float]:
        machine, process = samples[name]

        def measure() -> float:
            removals = []
            busy_start, cpu_start = _machine_busy_seconds(), _cpu_seconds()
            for _ in range(MACHINE_BATCH):
                removals.append(commit())
            busy_end = _machine_busy_seconds()
            process.append((_cpu_seconds() - cpu_start) / MACHINE_BATCH)
            assert busy_start is not None and busy_end is not None
            machine.append((busy_end - busy_start) / MACHINE_BATCH)
            for remove in removals:
                remove()
            return machine[-1]

        return measure

    try:
        interleaved(
            {"gradvault": batch("gradvault", ours), DIRECT: batch(DIRECT, direct)},
            MACHINE_BATCHES,
            warmup=1,
        )
    finally:
        recorder.close()
    for machine, process in samples.values():  # the warm-up batch is not a sample
        del machine[:1], process[:1]
    return samples


def machine_row(label: str, samples: dict[str, tuple[list[float], list[float]]]) -> Row:
    """The whole-machine CPU row (no target) of :func:`measure_machine`'s samples; its note
    gives the process's CPU over the same batches."""
    ours_machine, ours_process = samples["gradvault"]
    peer_machine, peer_process = samples[DIRECT]
    process = Row("", ours_process, DIRECT, peer_process)
    assert process.ratio is not None
    return Row(
        f"{label}, CPU per commit, whole machine",
        ours_machine,
        DIRECT,
        peer_machine,
        note=(
            f"busy CPU of /proc/stat over {len(ours_machine)} batches of {MACHINE_BATCH} "
            f"commits per side; the process's CPU over the same batches (getrusage, as the "
            f"CPU rows): gradvault {1e3 * process.ours_median:.2f} ms, the write "
            f"{1e3 * (process.peer_median or 0.0):.2f} ms, ratio {process.ratio:.3f}"
        ),
    )


def thread_note(by_thread: list[dict[str, float]]) -> str:
    """gradvault's CPU per commit by thread role, means over the commits (these add up to
    the mean, not to the rows' median), largest first."""
    roles = {role for commit in by_thread for role in commit}
    means = {role: sum(c.get(role, 0.0) for c in by_thread) / len(by_thread) for role in roles}
    total = sum(means.values())
    largest_first = sorted(means.items(), key=lambda item: -item[1])
    parts = ", ".join(f"{role} {1e3 * seconds:.2f}" for role, seconds in largest_first)
    return f"gradvault's CPU per commit by thread, mean {1e3 * total:.2f} ms: {parts}"


def run() -> list[Row]:
    """CPU and wall per commit of the 8.4 MB snapshot, gradvault against each peer."""
    base = os.environ.get("GRADVAULT_BENCH_DIR")
    root = Path(tempfile.mkdtemp(prefix="gv-bench-commit-", dir=base))
    try:
        samples, by_thread, pages = measure_sides(root)
        machine = measure_machine(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours_cpu, ours_wall = samples.pop("gradvault")
    cpu_targets = {"safetensors save_file+fsync": 1.0, DIRECT: 4.0}
    wall_targets = {"safetensors save_file+fsync": 1.1}
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    threads = thread_note(by_thread)
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
                    note=f"{threads}; {pages}; load average after: {load}"
                    if peer == DIRECT
                    else "",
                )
            )
    if machine is not None:
        rows.append(machine_row(label, machine))
    print_rows("Commit cost: 8.4 MB snapshot, CPU and wall per commit", rows)
    return rows


if __name__ == "__main__":
    run()
