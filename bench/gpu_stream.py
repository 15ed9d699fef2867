"""GPU figures (``scripts/gpu-check.sh``): streamed device-to-host copy, and capture stall.

Streamed D2H: 4 GiB on ``cuda:0`` through the ring of pinned buffers (each piece also
checksummed with crc32c, as a snapshot write would) against CuPy's own copy of the same
bytes into one pinned host buffer (``ndarray.get(out=pinned)``). Target >= 0.8x CuPy's
throughput. Capture stall: ``to_record_async`` of 1 GiB in 256 gradients on the device
against a device-to-device copy of the same bytes. Snapshot commit: the same 1 GiB written
to a local store streamed from the device through a ring pool (as the recorder does)
against reading it to host whole first. Prints the rows; exits 0 with a line saying so
where there is no GPU.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import crc32c_rs
import numpy as np

from bench._timing import Row, interleaved, print_rows

STREAM_BYTES = 4 << 30


def run() -> list[Row]:
    """The GPU rows; an empty list without CuPy or a device."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception as error:  # noqa: BLE001 - any failure here means "no usable GPU"
        print(f"gpu figures: no usable CUDA device ({error}); skipped")
        return []
    from gradvault.core.store._device_stream import CupyCopier, RingStreamer

    source = cupy.random.default_rng(0).integers(0, 256, STREAM_BYTES, dtype=cupy.uint8)
    cupy.cuda.Device(0).synchronize()
    ring = RingStreamer(CupyCopier(0))
    pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(STREAM_BYTES), np.uint8, STREAM_BYTES)

    def streamed() -> float:
        start = time.perf_counter()
        crc = 0
        for view in ring.stream(source, STREAM_BYTES):
            crc = crc32c_rs.crc32c(view, crc)
        return time.perf_counter() - start

    def cupy_copy() -> float:
        start = time.perf_counter()
        source.get(out=pinned)
        cupy.cuda.Device(0).synchronize()
        return time.perf_counter() - start

    gib = STREAM_BYTES / (1 << 30)
    samples = interleaved({"ours": streamed, "cupy": cupy_copy}, repeat=5, warmup=1)
    rows = [
        Row(
            "streamed D2H 4 GiB + crc32c, ring 4 x 16 MiB pinned (GiB/s)",
            [gib / t for t in samples["ours"]],
            "cupy get(out=pinned)",
            [gib / t for t in samples["cupy"]],
            "<= 1.25 (>= 0.8x)",
            1.25,
            higher_better=True,
            unit="GiB/s",
        )
    ]

    import gradvault.core as gv

    arrays = [cupy.full((1 << 20,), i, cupy.float32) for i in range(256)]
    grads = gv.GradientsParams()
    for i, array in enumerate(arrays):
        grads.register(gv.ParamId(), gv.Tensor._make(array), name=f"layer{i}.weight")

    def stall() -> float:
        async def measure() -> float:
            start = time.perf_counter()
            task = asyncio.ensure_future(grads.to_record_async())
            await asyncio.sleep(0)  # control is back in the loop here
            elapsed = time.perf_counter() - start
            await task
            return elapsed

        return asyncio.run(measure())

    def device_copy() -> float:
        start = time.perf_counter()
        copies = [a.copy() for a in arrays]
        cupy.cuda.Device(0).synchronize()
        del copies
        return time.perf_counter() - start

    samples = interleaved({"ours": stall, "copy": device_copy}, repeat=5, warmup=1)
    rows.append(
        Row(
            "capture stall on cuda:0, 1 GiB / 256 params",
            samples["ours"],
            "device copy of the bytes",
            samples["copy"],
            "<= 1.0",
            1.0,
        )
    )
    rows.append(_commit_row(cupy, grads))
    print_rows("GPU", rows)
    return rows


def _commit_row(cupy: Any, grads: Any) -> Row:
    """A snapshot's commit from cuda:0 through the store: streamed through the recorder's
    kind of ring pool (host memory: the rings) against reading every gradient to host
    whole first (host memory: the snapshot)."""
    import tempfile

    # the store's device path on its own, as the Recorder drives it (its own internals)
    from gradvault.core.store import DEFAULT_CHUNK_BYTES, open_store
    from gradvault.core.store._device_snapshot import DeviceSnapshot
    from gradvault.core.store._device_stream import CupyCopier, RingPool

    capture = grads.capture()
    ids, names, arrays = zip(*capture.entries, strict=True)
    pool = RingPool(CupyCopier(0), slot_bytes=DEFAULT_CHUNK_BYTES)

    async def streamed_source() -> Any:
        return DeviceSnapshot.of(ids, names, arrays, pool, {"device": "cuda:0"})

    with tempfile.TemporaryDirectory() as folder:

        def commit(source: Callable[[], Awaitable[Any]]) -> float:
            async def measure() -> float:
                store = open_store(folder)
                try:
                    start = time.perf_counter()
                    written = await source()
                    info = await store.write_snapshot(written, run="b", step=0, device="cuda:0")
                    elapsed = time.perf_counter() - start
                    await store.delete(info.id)
                finally:
                    await store.close()
                return elapsed

            return asyncio.run(measure())

        samples = interleaved(
            {
                "ours": lambda: commit(streamed_source),
                "whole": lambda: commit(capture.to_record_async),
            },
            repeat=3,
            warmup=1,
        )
    return Row(
        f"snapshot commit from cuda:0, 1 GiB / 256 params, streamed (rings: "
        f"{pool.peak_host_bytes >> 20} MiB pinned)",
        samples["ours"],
        "read to host whole, then written",
        samples["whole"],
        "<= 1.25",
        1.25,
    )


if __name__ == "__main__":
    run()
    sys.exit(0)
