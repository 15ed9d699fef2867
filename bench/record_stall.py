"""How long a training loop is blocked while its gradients are captured for a snapshot.

1 GiB of float32 gradients in 256 parameters, and 10,000 gradients of 1 KiB.
gradvault's ``to_record_async`` (until the host record exists) against a plain copy of
the same bytes, and (informational) the blocking part of
``torch.distributed.checkpoint.async_save`` on the same tensors. For the 10,000 small
gradients also ``Recorder.start_snapshot``: what a loop that snapshots through the
recorder waits for (the capture; the record and the commit follow in the background,
awaited outside the timed part).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable

import numpy as np

from bench._timing import Row, interleaved, print_rows, timed


def _arrays(params: int, total_bytes: int) -> list[np.ndarray]:
    per = total_bytes // params // 4
    rng = np.random.default_rng(0)
    base = rng.standard_normal(per).astype(np.float32)
    return [base + i for i in range(params)]


def _gradvault_stall(arrays: list[np.ndarray]) -> Callable[[], float]:
    import gradvault.core as gv

    grads = gv.GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(gv.ParamId(), gv.Tensor._make(array.copy()), name=f"layer{i}.weight")

    async def measure() -> float:
        start = time.perf_counter()
        record = await grads.to_record_async()
        elapsed = time.perf_counter() - start
        assert len(record) == len(arrays)
        return elapsed

    return lambda: asyncio.run(measure())


def _recorder_stall(arrays: list[np.ndarray], folder: str) -> Callable[[], float]:
    import gradvault.core as gv

    grads = gv.GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(gv.ParamId(), gv.Tensor._make(array.copy()), name=f"layer{i}.weight")
    recorder = gv.Recorder(folder, keep_last=1)
    steps = iter(range(1 << 30))

    def measure() -> float:
        start = time.perf_counter()
        handle = recorder.sync.start_snapshot(grads, run="stall", step=next(steps))
        elapsed = time.perf_counter() - start
        assert handle.result().num_params == len(arrays)
        return elapsed

    return measure


def _dcp_stall(arrays: list[np.ndarray]) -> float | None:
    try:
        import torch
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return None
    state = {f"layer{i}.weight": torch.from_numpy(a.copy()) for i, a in enumerate(arrays)}
    folder = tempfile.mkdtemp(prefix="gradvault-bench-dcp-")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=folder)
            elapsed = time.perf_counter() - start
            future.result()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return elapsed


def run() -> list[Row]:
    """Capture stall rows: 1 GiB in 256 gradients, and 10,000 gradients of 1 KiB."""
    rows = []
    for label, params, total in (
        ("1 GiB / 256 params", 256, 1 << 30),
        ("10,000 params x 1 KiB", 10_000, 10_000 * 1024),
    ):
        arrays = _arrays(params, total)
        samples = interleaved(
            {
                "gradvault": _gradvault_stall(arrays),
                "copy": lambda arrays=arrays: timed(lambda: [a.copy() for a in arrays]),
            },
            repeat=7,
            warmup=1,
        )
        rows.append(
            Row(
                f"capture stall (to_record_async), {label}",
                samples["gradvault"],
                "copy of the bytes",
                samples["copy"],
                "<= 1.0",
                1.0,
            )
        )
    small = _arrays(10_000, 10_000 * 1024)
    folder = tempfile.mkdtemp(prefix="gradvault-bench-stall-")
    try:
        samples = interleaved(
            {
                "gradvault": _recorder_stall(small, folder),
                "copy": lambda: timed(lambda: [a.copy() for a in small]),
            },
            repeat=7,
            warmup=1,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows.append(
        Row(
            "capture stall (Recorder.start_snapshot), 10,000 params x 1 KiB",
            samples["gradvault"],
            "copy of the bytes",
            samples["copy"],
            "<= 1.0",
            1.0,
        )
    )
    dcp = _dcp_stall(_arrays(256, 1 << 30))
    if dcp is not None:
        rows.append(
            Row(
                "capture stall (to_record_async), 1 GiB / 256 params",
                rows[0].ours,
                "dcp.async_save block",
                [dcp],
            )
        )
    print_rows("Capture: time the training loop is blocked", rows)
    return rows


if __name__ == "__main__":
    run()
