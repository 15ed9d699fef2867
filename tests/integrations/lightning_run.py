"""One training run of the Lightning resume tests; ``python -m tests.integrations.lightning_run``.

A small classifier with dropout, AdamW and a per-step LambdaLR schedule, trained on 40
fixed random samples shuffled by a LightningDataModule (batches of 4: ten micro-batches an
epoch) with ``accumulate_grad_batches=3`` (windows of 3, 3, 3 and 1 micro-batches), two
epochs: 20 micro-batches, 8 optimizer steps. Every ``self.log`` call reaches a logger that
appends it to ``OUT/logged.jsonl``, so an interrupted run and its resume write one log
together. The result (final parameters, optimizer and scheduler state, global step, the
log) goes to ``OUT/result.pt``; with several precisions (``--precision 32-true,16-mixed``)
the process runs them one after the other, each in ``OUT/<precision>``.

Modes: ``baseline`` (no gradvault, uninterrupted), ``sigterm`` (``GradvaultCallback``;
prints READY at the start of micro-batch ``--stop`` (counted from 0 over the run) and waits
there for the SIGTERM the test sends, once per precision), ``every`` (``GradvaultCallback(every=...,
on_sigterm=False)``; kills itself with SIGKILL at the start of the micro-batch after
``--stop``), ``resume`` (``fit(ckpt_path="last")`` with the callback),
``stock-sigterm``/``stock-resume`` (Lightning's own ``OnExceptionCheckpoint``, stopped by
SIGTERM as ``sigterm`` is, and resumed from its checkpoint). ``--processes 2`` runs under
``strategy=DDPStrategy(process_group_backend="gloo")`` with two ranks on the CPU and
``SAMPLES`` samples for each (Lightning starts the second rank by running this command
again); rank 0 writes the result and the log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from gradvault.integrations.lightning import GradvaultCallback

ACCUMULATION = 3
EPOCHS = 2
SAMPLES = 40
BATCH_SIZE = 4
MAX_STEPS = 8  # optimizer steps: (3 full windows + 1 shortened) per epoch, two epochs
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
SIGNAL_WAIT_SECONDS = 120


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        loss = F.cross_entropy(self.net(features), labels)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.02, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Samples(L.LightningDataModule):
    """``SAMPLES`` samples for each process (a DistributedSampler gives each its share)."""

    def __init__(self, processes: int = 1) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1234)
        self.features = torch.randn(SAMPLES * processes, 8, generator=generator)
        self.labels = torch.randint(0, 4, (SAMPLES * processes,), generator=generator)

    def train_dataloader(self) -> DataLoader:
        dataset = TensorDataset(self.features, self.labels)
        return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)


class JsonLinesLogger(Logger):
    """Appends every logged metric to a file, one JSON object a line (floats round-trip)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    @property
    def name(self) -> str:
        return "jsonl"

    @property
    def version(self) -> str:
        return "0"

    @property
    def save_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps({"step": step, **metrics}) + "\n")

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class StopAt(Callback):
    """At the start of micro-batch ``stop`` (over the run): READY and wait for a SIGTERM,
    or (``kill``) SIGKILL this process at the start of the micro-batch after ``stop``."""

    def __init__(self, stop: int, kill: bool, waits_on: GradvaultCallback | None) -> None:
        self.stop = stop
        self.kill = kill
        self.waits_on = waits_on

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
        micro_batch = trainer.current_epoch * trainer.num_training_batches + idx
        if self.kill:
            if micro_batch == self.stop + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return
        if micro_batch != self.stop or trainer.global_rank != 0:
            return  # with DDP, rank 0 waits (the test signals it); the others wait in a collective
        print("READY", flush=True)
        deadline = time.monotonic() + SIGNAL_WAIT_SECONDS
        while not self._signalled(trainer):
            if time.monotonic() > deadline:
                raise TimeoutError("no SIGTERM came")
            time.sleep(0.01)

    def _signalled(self, trainer: L.Trainer) -> bool:
        if self.waits_on is not None:
            return self.waits_on.signal_received
        return trainer.received_sigterm


def precision_settings(precision: str) -> dict[str, Any]:
    """The Trainer arguments for ``precision``. Lightning turns 16-mixed into bf16-mixed on a
    CPU; float16 autocast and a GradScaler are set up here as Lightning sets them up on a
    GPU, with a scale that grows every step (so the scaler's state changes as it trains)."""
    if precision != "16-mixed":
        return {"precision": precision}
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1)
    return {"plugins": [MixedPrecision("16-mixed", "cpu", scaler)]}


def make_trainer(out: Path, precision: str, callbacks: list[Any], processes: int = 1) -> L.Trainer:
    ddp = {"strategy": DDPStrategy(process_group_backend="gloo")} if processes > 1 else {}
    return L.Trainer(
        accelerator="cpu",
        devices=processes,
        **ddp,
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        **precision_settings(precision),
        callbacks=callbacks,
        logger=JsonLinesLogger(out / "logged.jsonl"),
        log_every_n_steps=1,
        default_root_dir=str(out),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def save_result(trainer: L.Trainer, module: Classifier, out: Path) -> None:
    lines = (out / "logged.jsonl").read_text().splitlines()
    torch.save(
        {
            "global_step": trainer.global_step,
            "params": {name: value.detach().clone() for name, value in module.state_dict().items()},
            "optimizer": trainer.optimizers[0].state_dict(),
            "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
            "logged": [json.loads(line) for line in lines],
        },
        out / "result.pt",
    )


def run(
    mode: str, out: Path, precision: str, store: str, stop: int, every: int, processes: int
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(0, verbose=False)
    module, data = Classifier(), Samples(processes)
    callbacks: list[Any] = []
    ckpt_path: str | None = None
    gradvault_folder = out / "gradvault"
    if mode in ("sigterm", "every", "resume"):
        callback = GradvaultCallback(
            store,
            every=every if mode == "every" else None,
            on_sigterm=mode != "every",
            dirpath=gradvault_folder,
        )
        callbacks.append(callback)
        if mode == "resume":
            ckpt_path = "last"
        else:
            callbacks.append(StopAt(stop, kill=mode == "every", waits_on=callback))
    elif mode in ("stock-sigterm", "stock-resume"):
        stock = OnExceptionCheckpoint(out / "stock")
        callbacks.append(stock)
        if mode == "stock-resume":
            ckpt_path = stock.ckpt_path
        else:
            callbacks.append(StopAt(stop, kill=False, waits_on=None))
    elif mode != "baseline":
        raise ValueError(f"unknown mode {mode!r}")
    trainer = make_trainer(out, precision, callbacks, processes)
    try:
        trainer.fit(module, data, ckpt_path=ckpt_path)
    except SIGTERMException:  # Lightning's stop on SIGTERM (a SystemExit): the next run
        return
    if trainer.is_global_zero:
        save_result(trainer, module, out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--store", default="")
    parser.add_argument("--stop", type=int, default=14)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--processes", type=int, default=1, help="DDP ranks (gloo) when > 1")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    precisions = args.precision.split(",")
    for precision in precisions:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be among {PRECISIONS}; got {precision!r}")
        out = args.out / precision if len(precisions) > 1 else args.out
        store = args.store or str(args.out / "store")
        run(args.mode, out, precision, store, args.stop, args.every, args.processes)


if __name__ == "__main__":
    main(sys.argv[1:])
