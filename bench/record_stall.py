"""How long a training loop is blocked while its gradients are captured for a snapshot.

1 GiB of float32 gradients in 256 parameters. gradvault's ``to_record_async`` (the time
until control returns to the loop) against a plain copy of the same bytes and against the
blocking part of ``torch.distributed.checkpoint.async_save`` on the same tensors.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import warnings

import numpy as np

from bench._timing import Row, best_time, print_rows

PARAMS, TOTAL_BYTES = 256, 1 << 30


def _arrays() -> list[np.ndarray]:
    per = TOTAL_BYTES // PARAMS // 4
    rng = np.random.default_rng(0)
    base = rng.standard_normal(per).astype(np.float32)
    return [base + i for i in range(PARAMS)]


def _gradvault_stall(arrays: list[np.ndarray]) -> float:
    import gradvault.core as gv

    grads = gv.GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(gv.ParamId(), gv.Tensor._make(array.copy()), name=f"layer{i}.weight")

    async def measure() -> float:
        start = time.perf_counter()
        record = await grads.to_record_async()
        elapsed = time.perf_counter() - start
        assert record.nbytes == TOTAL_BYTES
        return elapsed

    return min(asyncio.run(measure()) for _ in range(5))


def _dcp_stall(arrays: list[np.ndarray]) -> float | None:
    try:
        import torch
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return None
    state = {f"layer{i}.weight": torch.from_numpy(a.copy()) for i, a in enumerate(arrays)}
    best = float("inf")
    for _ in range(3):
        folder = tempfile.mkdtemp(prefix="gradvault-bench-dcp-")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                start = time.perf_counter()
                future = dcp.async_save(state, checkpoint_id=folder)
                best = min(best, time.perf_counter() - start)
                future.result()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return best


def run() -> list[Row]:
    arrays = _arrays()
    ours = _gradvault_stall(arrays)
    copy = best_time(lambda: [a.copy() for a in arrays], repeat=3)
    rows = [
        Row(
            "to_record_async stall, 1 GiB / 256 params",
            ours,
            "memcpy of the bytes",
            copy,
            "<= 0.01",
        )
    ]
    dcp = _dcp_stall(arrays)
    if dcp is not None:
        rows.append(
            Row(
                "to_record_async stall, 1 GiB / 256 params",
                ours,
                "dcp.async_save block",
                dcp,
                "<= 0.01",
            )
        )
    print_rows("Capture: time the training loop is blocked", rows)
    return rows


if __name__ == "__main__":
    run()
