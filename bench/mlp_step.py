"""An MLP training step: gradvault's core against PyTorch CPU, and the cost of snapshots.

The step is one SGD step of an MLP with 1024-wide layers on a batch of 256. Both sides run
interleaved in the same process, each under the BLAS its library ships (the BLAS
configuration of both is reported, from threadpoolctl). Training overhead: steps per second
of the same loop with ``recorder.start_snapshot`` every step and every 10 steps (into a
local store, default Recorder settings) against none, timed until the recorder has closed,
so every snapshot started is durable when the clock stops. Each loop's store is a new one
that already holds one snapshot, committed before the clock starts: a trainer snapshots into
a store it has open (as ``bench/store_io.py``'s rows do, and as the floors below write into
folders made before their clocks start), where a new store's first snapshot also makes its
folders and group documents durably (five more fsyncs), once per store, which in a loop of
30 steps would be one snapshot in three of the every-10 row (0.4% of the loop, 24 alternated
rounds). The every-step loop is also run with the BLAS limited to one thread
(threadpoolctl), for both sides: a core the training step leaves free, to tell the
snapshot's own cost from competition for the cores.

The floor of that cost: the same loop with each step's gradients committed by no
gradvault code at all, in a plain thread, one commit after the other as the recorder
makes them: their crc32c (crc32c-rs, one pass), their bytes written with ``O_DIRECT`` from
memory laid out once (no copy, no stats), a snapshot document beside them, five fsyncs
and a rename (commit_cost's layout floor, ``stats=False``), timed until the last is
durable. Its row against the loop without snapshots says what a durable snapshot every
step costs this machine whoever writes it, and gradvault's against it what gradvault adds.
Below it, the floor of the bytes alone: the same crc32c and ``O_DIRECT`` write, each step
into one new file, fsynced, and nothing else (no folder, no document, no rename:
commit_cost's floor, ``stats=False``): what the bytes' own write and checksum cost the
loop, and, against gradvault's loop, by how much a snapshot costs more than its bytes.
Between the two, the floor of the bytes made durable: the same, and the folder that holds
each new file fsynced after it (no document, no rename). A new file's name is durable only
once its folder is (POSIX; ext4 without a journal makes its new entry durable with the
file's own fsync, so on this project's machines that second fsync writes nothing and
flushes the device's cache again): what any commit that makes one new file a snapshot, and
returns once a power cut would lose nothing, costs the loop whatever its format.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench._timing import Row, interleaved, print_rows, timed

WIDTH, BATCH, CLASSES = 1024, 256, 10
LOOP_STEPS = 30
#: Rounds of the eight training loops: four Williams designs of eight (``round_orders``), so
#: that each loop runs in each place of a round, and right after each of the others,
#: equally often. On this 2-core machine one round's ratio of a loop to the loop without
#: snapshots swings by 0.8-1.5x while the snapshots of the every-10-steps loop cost about
#: 2%: with 5 rounds that row's median moved between 0.96 and 1.18 over fifteen ``make
#: bench`` runs; with 14, between 0.994 and 1.065 over nine, around a median of 1.017 of
#: their 126 rounds (drawn again from those rounds, 22% of medians of 14 are above the
#: row's 1.03, 13% of medians of 28).
LOOP_ROUNDS = 32


def _gradvault_model() -> tuple[object, object]:
    import gradvault.core as gv

    gv.manual_seed(0)
    model = gv.MLP(WIDTH, [WIDTH, WIDTH], CLASSES)
    optimizer = gv.SGD()
    rng = np.random.default_rng(0)
    x = gv.tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = gv.tensor(rng.integers(0, CLASSES, BATCH))

    def step() -> object:
        loss = gv.cross_entropy(model(x), y)
        grads = gv.GradientsParams.from_grads(loss.backward(), model)
        optimizer.step(0.01, model, grads)
        model.zero_grad()
        return grads

    return step, model


def _torch_step() -> object:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, CLASSES),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, CLASSES, BATCH))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def blas_config() -> list[dict]:
    """Every BLAS/OpenMP pool loaded in this process (NumPy's and PyTorch's), per library."""
    from threadpoolctl import threadpool_info

    keys = ("user_api", "internal_api", "prefix", "version", "num_threads", "architecture")
    return [{k: pool.get(k) for k in keys} for pool in threadpool_info()]


def _torch_blas(torch: object) -> str:
    """PyTorch's BLAS (statically linked, so threadpoolctl sees only its OpenMP pool)."""
    settings = torch.__config__.show()  # type: ignore[attr-defined]
    blas = next((part for part in settings.split(", ") if "BLAS_INFO=" in part), "BLAS_INFO=?")
    return (
        f"{blas.split('BLAS_INFO=')[-1]} (static), {torch.get_num_threads()} threads "  # type: ignore[attr-defined]
        f"(OpenMP, libgomp)"
    )


def training_loop(every: int | None, root: Path, blas_threads: int | None = None) -> float:
    """Seconds for LOOP_STEPS training steps, snapshotting every ``every`` steps, until
    every snapshot is durable (the recorder closed); the BLAS limited to ``blas_threads``."""
    from threadpoolctl import threadpool_limits

    import gradvault.core as gv

    step, _ = _gradvault_model()
    store = root / f"store-{time.monotonic_ns()}"
    # leaving the block closes the recorder: every snapshot is durable before the clock stops
    with threadpool_limits(blas_threads), gv.Recorder(store) as recorder:
        recorder.start_snapshot(step(), run="warm-up", step=0).result()  # the store made
        start = time.perf_counter()
        for i in range(LOOP_STEPS):
            grads = step()
            if every is not None and i % every == 0:
                recorder.start_snapshot(grads, run="bench", step=i)
    return time.perf_counter() - start


#: The floors a floor loop commits with (module docstring): the snapshot layout's, the bytes'
#: made durable (the file and its folder fsynced), the bytes' alone (the file fsynced).
FLOORS = ("layout", "durable bytes", "bytes")


def floor_loop(root: Path, floor: str = "layout") -> float:
    """Seconds for LOOP_STEPS training steps, each step's gradients committed in a plain
    thread by ``floor`` (one of FLOORS, module docstring), until the last commit is
    durable."""
    import gradvault.core as gv
    from bench.commit_cost import _aligned_copy, _floor_commit, _layout_floor_commit
    from bench.store_io import fsync_path

    if floor not in FLOORS:
        raise ValueError(f"floor {floor!r} is not one of {FLOORS}")

    step, _ = _gradvault_model()
    grads = step()
    laid_out = [np.ascontiguousarray(e.array) for e in grads.try_to_record().entries]  # type: ignore[attr-defined]
    aligned = _aligned_copy(laid_out, huge_pages=True)
    folder = root / f"floor-{time.monotonic_ns()}"
    (folder / "staging").mkdir(parents=True)
    (folder / "snapshots").mkdir()
    if floor == "layout":
        store = root / f"document-{time.monotonic_ns()}"
        with gv.Recorder(store) as recorder:  # a real snapshot document of these gradients
            info = recorder.start_snapshot(grads, run="bench", step=0).result()
        document = (store / "snapshots" / info.id / "zarr.json").read_bytes()

        def commit(i: int, arrays: list[np.ndarray]) -> None:
            staging, committed = folder / "staging" / str(i), folder / "snapshots" / str(i)
            _layout_floor_commit(staging, committed, arrays, aligned, document, False)

    else:
        durable = floor == "durable bytes"

        def commit(i: int, arrays: list[np.ndarray]) -> None:
            _floor_commit(folder / "snapshots" / str(i), arrays, aligned, False)
            if durable:
                fsync_path(folder / "snapshots")

    with ThreadPoolExecutor(1) as committer:  # leaving the block waits for the last commit
        committer.submit(int).result()  # its thread started, as a recorder's is when made
        start = time.perf_counter()
        for i in range(LOOP_STEPS):
            grads = step()
            arrays = [np.asarray(e.array) for e in grads.try_to_record().entries]  # type: ignore[attr-defined]
            committer.submit(commit, i, arrays)
    return time.perf_counter() - start


def run() -> list[Row]:
    """The autodiff row and the training-overhead rows."""
    import torch

    ours_step, _ = _gradvault_model()
    torch_step = _torch_step()
    steps = interleaved(
        {"gradvault": lambda: timed(ours_step), "torch": lambda: timed(torch_step)},
        repeat=15,
        warmup=2,
    )
    pools = blas_config()
    blas = "; ".join(
        f"{p['internal_api']} {p['version']} {p['num_threads']} threads ({p['prefix']})"
        for p in pools
    )
    rows = [
        Row(
            f"MLP step {WIDTH}-wide, batch {BATCH}, SGD",
            steps["gradvault"],
            "torch CPU",
            steps["torch"],
            "<= 1.2",
            1.2,
            note=f"numpy side: {blas}; torch side: {_torch_blas(torch)}",
        )
    ]
    root = Path(tempfile.mkdtemp(prefix="gv-bench-loop-"))
    try:
        loops = interleaved(
            {
                "none": lambda: training_loop(None, root),
                "every step": lambda: training_loop(1, root),
                "every 10 steps": lambda: training_loop(10, root),
                "none, BLAS 1 thread": lambda: training_loop(None, root, 1),
                "every step, BLAS 1 thread": lambda: training_loop(1, root, 1),
                "every step, layout floor": lambda: floor_loop(root),
                "every step, durable bytes floor": lambda: floor_loop(root, "durable bytes"),
                "every step, bytes floor": lambda: floor_loop(root, "bytes"),
            },
            repeat=LOOP_ROUNDS,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # (figure, its loop, the loop without snapshots it is measured against, target)
    overheads = [
        ("snapshot every step", "every step", "none", ("<= 1.11 (>= 0.9x steps/s)", 1.11)),
        (
            "snapshot every 10 steps",
            "every 10 steps",
            "none",
            ("<= 1.03 (>= 0.97x steps/s)", 1.03),
        ),
        (
            "snapshot every step, BLAS 1 thread",
            "every step, BLAS 1 thread",
            "none, BLAS 1 thread",
            ("", None),
        ),
        ("the layout floor's commit every step", "every step, layout floor", "none", ("", None)),
        ("snapshot every step", "every step", "every step, layout floor", ("", None)),
        (
            "the bytes' durable write and crc32c every step",
            "every step, durable bytes floor",
            "none",
            ("", None),
        ),
        ("snapshot every step", "every step", "every step, durable bytes floor", ("", None)),
        ("the bytes' write and crc32c every step", "every step, bytes floor", "none", ("", None)),
        ("snapshot every step", "every step", "every step, bytes floor", ("", None)),
    ]
    peer_names = {
        "none": "no snapshots",
        "none, BLAS 1 thread": "no snapshots, BLAS 1 thread",
        "every step, layout floor": "the layout floor's commit every step",
        "every step, durable bytes floor": "the bytes' durable write and crc32c every step",
        "every step, bytes floor": "the bytes' write and crc32c every step",
    }
    for figure, loop, base, (target_text, limit) in overheads:
        rows.append(
            Row(
                f"training loop, {figure} (steps/s)",
                [LOOP_STEPS / t for t in loops[loop]],
                peer_names[base],
                [LOOP_STEPS / t for t in loops[base]],
                target_text,
                limit,
                higher_better=True,
                unit="steps/s",
            )
        )
    print_rows("Autodiff and training overhead", rows)
    print(f"BLAS pools: {pools}")
    return rows


if __name__ == "__main__":
    run()
