"""A separate process that snapshots seeded gradients in a loop (for crash and concurrency tests).

``python -m tests.core.snapshot_writer STORE_URL WRITER_NAME COUNT [KEEP_LAST]`` prints
``ready`` once imported, then one ``committed <id> <seed>`` line per committed snapshot;
COUNT 0 means forever. With KEEP_LAST, the recorder keeps that many of the run (its
retention deletes the rest after each commit, and the next commit writes into the
deleted one's folder), and the writer cycles through four seeds, each one's gradients
made once: nearly all its time is then commits and deletes.
"""

from __future__ import annotations

import sys

import numpy as np

import gradvault.core as gv
from gradvault.core.autodiff import backend
from gradvault.core.autodiff.tensor import wrap

#: 5 MiB and a few small ones: one packed chunk, written to the device in 2 MiB pieces
SHAPES = [(1280, 1024), (1024,), (64, 64), (3,)]


def seeded_grads(seed: int, shapes: list[tuple[int, ...]] = SHAPES) -> gv.GradientsParams:
    """The gradients a writer snapshots for ``seed``: ids and values both follow the seed.

    For an even seed the arrays are page-aligned copies (as the engine makes its large
    results, ``backend.copy``), so the large one goes to the device from its own memory;
    for an odd seed they are NumPy's own, copied into the writer's aligned buffer and
    written in pieces. The values are the same either way.
    """
    rng = np.random.default_rng(seed)
    grads = gv.GradientsParams()
    for index, shape in enumerate(shapes):
        array = rng.standard_normal(shape).astype(np.float32)
        if seed % 2 == 0:
            array = backend.copy(array)
        pid = gv.ParamId(int(rng.integers(0, 2**63)))
        grads.register(pid, wrap(array), name=f"layer{index}")
    return grads


def main() -> None:
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keep_last = int(sys.argv[4]) if len(sys.argv) > 4 else None
    print("ready", flush=True)
    made: dict[int, gv.GradientsParams] = {}
    with gv.Recorder(url, keep_last=keep_last) as recorder:
        step = 0
        while count == 0 or step < count:
            seed = hash((name, step if keep_last is None else step % 4)) % (2**31)
            if keep_last is None:
                grads = seeded_grads(seed)
            else:
                grads = made.get(seed) or made.setdefault(seed, seeded_grads(seed))
            info = recorder.start_snapshot(
                grads, run=name, step=step, tags={"seed": str(seed)}
            ).result()
            print(f"committed {info.id} {seed}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
