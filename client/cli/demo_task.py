"""A real training job on the core: an MLP on a synthetic classification task.

``python -m gradvault.client.cli.demo_task`` trains it with SGD and gradient
accumulation, prints the loss curve, snapshots the accumulated gradients in the middle
of some accumulation windows into a local store, and restores them to check they are
bit-identical.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradvault.core.autodiff.accumulator import GradientsAccumulator
from gradvault.core.autodiff.factories import manual_seed, tensor
from gradvault.core.autodiff.gradients_params import GradientsParams
from gradvault.core.autodiff.nn import MLP
from gradvault.core.autodiff.ops import cross_entropy
from gradvault.core.autodiff.optim import SGD, Optimizer
from gradvault.core.autodiff.tensor import Tensor
from gradvault.core.records.record import GradientsParamsRecord
from gradvault.core.store.recorder import Recorder, SnapshotHandle


@dataclass(frozen=True)
class Task:
    """A synthetic classification task: Gaussian blobs around random class centres."""

    features: np.ndarray
    labels: np.ndarray

    @classmethod
    def make(
        cls, samples: int = 2048, in_features: int = 32, classes: int = 4, seed: int = 0
    ) -> Task:
        rng = np.random.default_rng(seed)
        centres = rng.standard_normal((classes, in_features)).astype(np.float32) * 0.6
        labels = rng.integers(0, classes, samples)
        features = centres[labels] + rng.standard_normal((samples, in_features)).astype(np.float32)
        return cls(features.astype(np.float32), labels.astype(np.int64))

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches in a seeded random order, forever."""
        rng = np.random.default_rng(seed)
        while True:
            order = rng.permutation(len(self.labels))
            for start in range(0, len(order) - batch_size + 1, batch_size):
                index = order[start : start + batch_size]
                yield tensor(self.features[index]), tensor(self.labels[index])


def train(
    steps: int = 60,
    micro_batches: int = 4,
    batch_size: int = 64,
    lr: float = 0.05,
    hidden: int = 64,
    seed: int = 0,
    optimizer: Optimizer | None = None,
    on_micro_batch: Callable[[int, int, MLP, GradientsAccumulator], None] | None = None,
) -> tuple[MLP, list[float]]:
    """Train an MLP (two hidden ReLU layers, cross-entropy) with gradient accumulation.

    Returns the model and the mean loss of every optimizer step. ``on_micro_batch(step,
    micro_batch, model, accumulator)`` runs after each micro-batch is accumulated.
    """
    manual_seed(seed)
    task = Task.make(seed=seed)
    model = MLP(task.features.shape[1], [hidden, hidden], int(task.labels.max()) + 1)
    optimizer = optimizer or SGD(momentum=0.9)
    batches = task.batches(batch_size, seed)
    losses = []
    for step in range(steps):
        accumulator = GradientsAccumulator()
        total = 0.0
        for micro in range(micro_batches):
            x, y = next(batches)
            loss = cross_entropy(model(x), y) / micro_batches
            accumulator.accumulate(model, GradientsParams.from_grads(loss.backward(), model))
            total += loss.item()
            if on_micro_batch is not None:
                on_micro_batch(step, micro, model, accumulator)
        model = optimizer.step(lr, model, accumulator.grads())
        model.zero_grad()
        losses.append(total)
    return model, losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--store",
        default=".gradvault/demo-store",
        help="where mid-window snapshots go (a folder or s3://bucket/prefix)",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=10,
        help="snapshot the accumulated gradients every N optimizer steps",
    )
    args = parser.parse_args(argv)
    with Recorder(args.store, keep_last=3) as recorder:
        handles: list[tuple[int, SnapshotHandle, GradientsParamsRecord]] = []

        def snapshot(step: int, micro: int, model: MLP, accumulator: GradientsAccumulator) -> None:
            if step % args.every == 0 and micro == 1:  # mid-window: two micro-batches summed
                current = accumulator.current()
                handles.append(
                    (
                        step,
                        recorder.start_snapshot(current, run="demo", step=step),
                        current.try_to_record(),
                    )
                )

        _, losses = train(steps=args.steps, on_micro_batch=snapshot)
        for step, loss in enumerate(losses):
            if step % 5 == 0 or step == len(losses) - 1:
                print(f"step {step:4d}  loss {loss:.4f}  " + "#" * int(loss * 20))
        print(f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
        captured: dict[str, GradientsParamsRecord] = {}
        for step, handle, record in handles:
            info = handle.result()
            captured[info.id] = record
            print(
                f"snapshot {info.id}: step {step}, {info.num_params} gradients, {info.nbytes} bytes"
            )
        kept = recorder.sync.list(run="demo")
        for info in kept:
            same = recorder.sync.restore(info.id).try_to_record() == captured.get(info.id)
            print(f"restored {info.id} (step {info.step}): bit-identical={same}")
        print(
            f"store: {Path(args.store).resolve() if '://' not in args.store else args.store}"
            f" ({len(kept)} snapshots kept)"
        )


if __name__ == "__main__":
    main()
