"""The demo's training job: an MLP on a synthetic task, with gradient accumulation.

:mod:`gradvault.client.cli.demo` runs it three ways: uninterrupted in its own process (the
reference); as a trainer process that pushes the accumulated gradients to the service
every few micro-batches and is killed in the middle of a window (the preemption); and as
a fresh process that resumes from the trainer's last checkpoint (model and optimizer,
written after every optimizer step, as trainers do) and the newest snapshot on the
service. ``python -m gradvault.client.cli.demo_trainer {train,resume} ...`` starts the latter two.

Every micro-batch is a pure function of (seed, step, micro-batch), so a resumed process
sees exactly the data the preempted one would have seen.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradvault.client.cli.demo_task import Task
from gradvault.core import (
    MLP,
    SGD,
    GradientsAccumulator,
    GradientsParams,
    ModuleRecord,
    OptimizerRecord,
    ParamId,
    cross_entropy,
    manual_seed,
    tensor,
)
from gradvault.core.autodiff.nn import ParamState

from .main import EXIT_INTERRUPTED

CHECKPOINT = "checkpoint.npz"
JOURNAL = "journal.jsonl"
RESUMED = "resumed.npz"


@dataclass(frozen=True)
class Plan:
    """What the demo trains: ``steps`` optimizer steps of ``micro_batches`` micro-batches,
    a snapshot every ``snapshot_every`` micro-batches, the ``keep_last`` newest kept."""

    steps: int = 10
    micro_batches: int = 4
    snapshot_every: int = 2
    keep_last: int = 3
    batch_size: int = 32
    hidden: int = 64
    lr: float = 0.05
    seed: int = 0

    @property
    def preempt_at(self) -> tuple[int, int]:
        """(step, micro-batch), counted from 0, after which the trainer is killed: in a
        window two thirds of the way through, before its last micro-batch."""
        return (2 * self.steps) // 3, max(0, self.micro_batches - 2)

    def snapshots_after(self, step: int, micro: int) -> bool:
        """Whether a snapshot is pushed once this micro-batch is accumulated."""
        return (step * self.micro_batches + micro + 1) % self.snapshot_every == 0


class Training:
    """The model, its optimizer and the data; :meth:`run` trains from a given point."""

    def __init__(self, plan: Plan, *, model_seed: int | None = None) -> None:
        self.plan = plan
        self.task = Task.make(seed=plan.seed)
        manual_seed(plan.seed if model_seed is None else model_seed)
        classes = int(self.task.labels.max()) + 1
        self.model = MLP(self.task.features.shape[1], [plan.hidden, plan.hidden], classes)
        self.optimizer = SGD(momentum=0.9)

    def micro_batch(self, accumulator: GradientsAccumulator, step: int, micro: int) -> float:
        """Accumulate one micro-batch's gradients; its share of the step's loss."""
        rng = np.random.default_rng([self.plan.seed, step, micro])
        index = rng.choice(len(self.task.labels), self.plan.batch_size, replace=False)
        x, y = tensor(self.task.features[index]), tensor(self.task.labels[index])
        loss = cross_entropy(self.model(x), y) / self.plan.micro_batches
        accumulator.accumulate(self.model, GradientsParams.from_grads(loss.backward(), self.model))
        return loss.item()

    def run(
        self,
        *,
        from_step: int = 0,
        from_micro: int = 0,
        accumulator: GradientsAccumulator | None = None,
        after_micro: Callable[[int, int, GradientsAccumulator], None] | None = None,
        after_step: Callable[[int, float], None] | None = None,
        skip: Callable[[int, int], bool] | None = None,
    ) -> None:
        """Train to the plan's last step, starting at micro-batch ``from_micro`` of step
        ``from_step`` with ``accumulator`` holding the window's earlier micro-batches.

        ``skip(step, micro)`` leaves micro-batches out (what losing them looks like).
        """
        plan = self.plan
        for step in range(from_step, plan.steps):
            resuming = step == from_step and accumulator is not None
            window = accumulator if resuming else GradientsAccumulator()
            assert window is not None
            loss = 0.0
            for micro in range(from_micro if step == from_step else 0, plan.micro_batches):
                if skip is not None and skip(step, micro):
                    continue
                loss += self.micro_batch(window, step, micro)
                if after_micro is not None:
                    after_micro(step, micro, window)
            self.model = self.optimizer.step(plan.lr, self.model, window.grads())
            self.model.zero_grad()
            if after_step is not None:
                after_step(step, loss)

    def parameters(self) -> dict[str, np.ndarray]:
        """Host copies of the parameters, by module path."""
        return {name: p.detach().numpy().copy() for name, p in self.model.named_parameters()}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: Path, next_step: int) -> None:
        """Model and optimizer state (values and ParamIds) to ``path``, atomically."""
        module = self.model.state_record()
        optimizer = self.optimizer.state_record()
        # Any: np.savez's stubs would take a key "allow_pickle" for its own keyword
        arrays: dict[str, Any] = {
            f"param/{name}": state.value for name, state in module.params.items()
        }
        for pid, state in optimizer.state.items():
            arrays.update({f"optimizer/{pid}/{key}": value for key, value in state.items()})
        meta = {
            "next_step": next_step,
            "param_ids": {name: str(state.id) for name, state in module.params.items()},
            "optimizer": {
                "kind": optimizer.kind,
                "hyperparameters": optimizer.hyperparameters,
                "steps": {str(pid): count for pid, count in optimizer.steps.items()},
                "state": {str(pid): sorted(state) for pid, state in optimizer.state.items()},
            },
        }
        arrays["meta"] = np.array(json.dumps(meta))
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(part, path)

    def load_checkpoint(self, path: Path) -> int:
        """Load what :meth:`save_checkpoint` wrote; the step to go on with."""
        with np.load(path, allow_pickle=False) as arrays:
            meta = json.loads(str(arrays["meta"]))
            params = {
                name: ParamState(ParamId.parse(pid), arrays[f"param/{name}"])
                for name, pid in meta["param_ids"].items()
            }
            saved = meta["optimizer"]
            state = {
                ParamId.parse(pid): {key: arrays[f"optimizer/{pid}/{key}"] for key in keys}
                for pid, keys in saved["state"].items()
            }
        self.model.load_record(ModuleRecord(params))
        steps = {ParamId.parse(pid): count for pid, count in saved["steps"].items()}
        record = OptimizerRecord(saved["kind"], saved["hyperparameters"], state, steps)
        self.optimizer.load_record(record, self.model)
        return int(meta["next_step"])


def _journal(workdir: Path, **event: object) -> None:
    with open(workdir / JOURNAL, "a") as file:
        file.write(json.dumps(event) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _say(text: str) -> None:
    print(f"  [pid {os.getpid()}] {text}", flush=True)


def train(plan: Plan, run: str, workdir: Path, url: str, token: str | None) -> None:
    """Train, push snapshots and checkpoints, and be killed at ``plan.preempt_at``."""
    from .targets import ServiceTarget

    service = ServiceTarget(url, token)
    training = Training(plan)
    checkpoint = workdir / CHECKPOINT
    training.save_checkpoint(checkpoint, 0)
    pushed: list[str] = []
    removed: list[str] = []

    def after_micro(step: int, micro: int, window: GradientsAccumulator) -> None:
        if plan.snapshots_after(step, micro):
            record = window.current().try_to_record()  # the point in time, no byte copied
            tags = {"micro_batches": str(micro + 1), "of": str(plan.micro_batches)}
            info = service.push(record, run=run, step=step, tags=tags, progress=None)
            gone = service.apply_retention(plan.keep_last, None, run)
            _journal(workdir, pushed=info.id, step=step, micro_batches=micro + 1, removed=gone)
            pushed.append(info.id)
            removed.extend(gone)
        if (step, micro) == plan.preempt_at:
            _say(
                f"step {step}: micro-batch {micro + 1} of {plan.micro_batches} accumulated; "
                "the job is preempted now (SIGKILL)"
            )
            os.kill(os.getpid(), signal.SIGKILL)

    def after_step(step: int, loss: float) -> None:
        training.save_checkpoint(checkpoint, step + 1)
        _say(
            f"step {step}: loss {loss:.4f}; {len(pushed)} snapshots pushed so far, "
            f"{len(removed)} deleted by retention; checkpoint saved"
        )

    training.run(after_micro=after_micro, after_step=after_step)


def resume(plan: Plan, run: str, workdir: Path, url: str, token: str | None) -> None:
    """A fresh model from the checkpoint, the window's gradients from the service, then
    training to the end; the final parameters go to ``workdir/resumed.npz``."""
    from .targets import ServiceTarget

    service = ServiceTarget(url, token)
    training = Training(plan, model_seed=plan.seed + 1)  # other values and ids until loaded
    step = training.load_checkpoint(workdir / CHECKPOINT)
    _say(f"a fresh process and model: checkpoint loaded, training goes on at step {step}")
    newest = service.list(run, None, None, 1)
    accumulator, micro = None, 0
    if newest and newest[0].step == step:
        snapshot = newest[0]
        detail = service.detail(snapshot.id)
        micro = int(detail["tags"]["micro_batches"])
        grads = service.client.restore(snapshot.id, "cpu", module=training.model)
        accumulator = GradientsAccumulator()
        accumulator.accumulate(training.model, grads)
        _say(
            f"restored snapshot {snapshot.id} from {url}: the sum of micro-batches 1-{micro} "
            f"of step {step} ({snapshot.num_params} gradients, checksums verified); "
            f"micro-batches {micro + 1}-{plan.micro_batches} are computed again"
        )
        _journal(workdir, resumed_from=snapshot.id, step=step, micro_batches=micro)
    else:
        _say(f"no snapshot of step {step}: its window starts again from micro-batch 1")

    def after_step(done: int, loss: float) -> None:
        if done == step and micro:
            rest = f"{micro + 1}-{plan.micro_batches}"
            _say(f"step {done}: window complete (loss of micro-batches {rest}: {loss:.4f})")
        else:
            _say(f"step {done}: loss {loss:.4f}")

    training.run(from_step=step, from_micro=micro, accumulator=accumulator, after_step=after_step)
    with open(workdir / RESUMED, "wb") as file:
        parameters: dict[str, Any] = training.parameters()  # Any: as for np.savez above
        np.savez(file, **parameters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradvault.client.cli.demo_trainer")
    parser.add_argument("role", choices=("train", "resume"))
    parser.add_argument("--plan", required=True, help="the Plan as JSON")
    parser.add_argument("--run", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--url", required=True)
    args = parser.parse_args(argv)
    plan = Plan(**json.loads(args.plan))
    token = os.environ.get("GRADVAULT_TOKEN") or None  # never on a command line
    job = train if args.role == "train" else resume
    try:
        job(plan, args.run, args.workdir, args.url, token)
    except KeyboardInterrupt:  # SIGINT sent to this process alone: one line, as the CLI says it
        print(f"{parser.prog} {args.role}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def plan_json(plan: Plan) -> str:
    """``plan`` as the ``--plan`` argument."""
    return json.dumps(asdict(plan))


if __name__ == "__main__":
    sys.exit(main())
