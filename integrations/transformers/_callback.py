"""GradvaultCallback: when to snapshot mid-window, and what a SIGTERM does."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gradvault.core import GradientsParams
from gradvault.core.errors import UnsupportedSetupError

from .._grads import snapshot_gradients
from .._ranks import any_rank
from .._target import SnapshotTarget, check_schedule
from ._folder import prune_older
from ._protocol import WindowSnapshot, WindowTrainer

_log = logging.getLogger("gradvault.integrations.transformers")


class GradvaultCallback(TrainerCallback):
    """Snapshots the gradients of a window of micro-batches, beside a Trainer checkpoint.

    ``target`` is a store path or URL (``gv-store``, ``file:///...``, ``s3://...``,
    written through a ``Recorder``) or a service URL (``http://host:8000``, through the
    ``Client``; ``token`` or ``GRADVAULT_TOKEN``). ``every=N`` leaves a place to resume
    from after every N-th micro-batch, counted from the start of training as
    ``global_step * gradient_accumulation_steps + k``: a gradvault snapshot when the
    micro-batch is inside a window, the Trainer's own ``checkpoint-N`` when it ends one
    (``on_train_begin`` warns when every such place ends a window, so no snapshot is ever
    taken there); ``on_sigterm=True`` makes a SIGTERM during micro-batch k
    of a window snapshot after it and stop, and during a window's last micro-batch let
    the optimizer step finish, save a normal ``checkpoint-N`` and stop. ``run`` names the
    snapshots' run (default: ``args.run_name``, else the output folder's name);
    ``keep_last`` is a store's retention (the service applies its own).

    Snapshots commit in a background thread, one at a time: the training loop waits for
    the copy of the gradients to host memory and the Trainer checkpoint files (written
    once per window), not for the upload. With several processes (DDP) the ranks agree
    after every micro-batch whether any got a SIGTERM, so all stop after the same one,
    and commit together in the loop's thread, each rank's ``.grad`` one shard of one
    snapshot in a store every rank sees. A failed snapshot is logged (logger
    ``gradvault.integrations.transformers``) and counted in ``failures``; training goes
    on. Needs a trainer built with ``GradvaultTrainerMixin`` (``GradvaultTrainer``): the
    two talk through the protocols of ``_protocol.py`` (this is a ``SnapshotCallback``).
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        every: int | None = None,
        on_sigterm: bool = True,
        run: str | None = None,
        token: str | None = None,
        keep_last: int | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_schedule(every, on_sigterm, run)
        self.target = SnapshotTarget(
            target, token=token, keep_last=keep_last, store_options=store_options
        )
        self.every = every
        self.on_sigterm = on_sigterm
        self.run = run
        #: ids of the snapshots committed by this callback, oldest first
        self.snapshot_ids: list[str] = []
        #: snapshots that failed (each logged); training went on
        self.failures = 0
        #: True once a SIGTERM made training stop
        self.stopped_by_signal = False
        self._trainer: WindowTrainer | None = None
        self._signal_received = threading.Event()
        self._previous_handler: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    @property
    def signal_received(self) -> bool:
        """Whether a SIGTERM arrived during this ``train()``."""
        return self._signal_received.is_set()

    # ------------------------------------------------------------------ the trainer's side
    def attach(self, trainer: WindowTrainer) -> None:
        """``trainer.train()`` starts: the trainer whose windows to snapshot (called by
        ``GradvaultTrainerMixin.train``)."""
        self._trainer = trainer

    def _run_name(self, args: TrainingArguments) -> str:
        if self.run is not None:
            return self.run
        return args.run_name or Path(args.output_dir or ".").resolve().name or "run"

    def _snapshot(self, trainer: WindowTrainer, args: TrainingArguments) -> None:
        """Ask the trainer for the window's snapshot and commit it in the background."""
        self.wait()  # the snapshot in flight may complete the folder this one rewrites
        snapshot = trainer.gradvault_snapshot(self._run_name(args), self.target.location)
        if snapshot is not None:
            self._submit(snapshot)

    def _submit(self, snapshot: WindowSnapshot) -> None:
        """Commit the window's gradients, then complete the folder with the state: in the
        background for one process (the snapshot in flight before it is waited for by
        ``_snapshot``); with several, every rank's ``.grad`` one shard of one snapshot, a
        collective call in the loop's thread (one thread per process keeps the ranks'
        collectives in the same order)."""
        state, folder = snapshot.state, snapshot.folder
        tags = {
            "framework": "transformers",
            "global_step": str(state.global_step),
            "micro_step": str(state.micro_step),
            "window_size": str(state.window_size),
            "folder": folder.name,
        }

        def commit(push: Callable[[], str]) -> None:
            try:
                state.snapshot_id = push()
                state.write(folder)
                self.snapshot_ids.append(state.snapshot_id)
                if snapshot.prune_older:
                    prune_older(folder.parent, state.global_step)
            except Exception as error:  # noqa: BLE001 - reported, training goes on
                self.failures += 1
                _log.error(
                    "gradvault snapshot of step %d, micro-batch %d to %s failed: %s: %s",
                    state.global_step + 1,
                    state.micro_step,
                    self.target.location,
                    type(error).__name__,
                    error,
                )

        if state.world_size > 1:
            commit(
                lambda: snapshot_gradients(
                    snapshot.model, self.target, run=state.run, step=state.global_step, tags=tags
                )
            )
            return
        record = GradientsParams.from_torch(snapshot.model).try_to_record()  # the capture
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="gradvault-hf")
        self._pending = self._executor.submit(
            commit,
            lambda: self.target.push(record, run=state.run, step=state.global_step, tags=tags),
        )

    def wait(self) -> None:
        """Block until the snapshot in flight (if any) is committed and its folder complete."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def finish(self) -> None:
        """``trainer.train()`` ended (or failed): wait for the snapshot in flight, put back
        the SIGTERM handler, release the target. Calling it again does nothing more."""
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
        self.target.close()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._signal_received.set()

    # ------------------------------------------------------------------ Trainer events
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._trainer is None:
            raise UnsupportedSetupError(
                "GradvaultCallback needs a trainer built with GradvaultTrainerMixin: use "
                "gradvault.integrations.transformers.GradvaultTrainer instead of Trainer, or "
                "put GradvaultTrainerMixin first among your Trainer subclass's bases"
            )
        self._signal_received.clear()
        self.stopped_by_signal = False
        accumulation = args.gradient_accumulation_steps
        if self.every is not None and self.every % accumulation == 0:
            _log.warning(
                "GradvaultCallback(every=%d) with gradient_accumulation_steps=%d: every %d-th "
                "micro-batch ends a window, so each place to resume from is a Trainer "
                "checkpoint-N (every %d optimizer steps) and no gradvault snapshot is taken "
                "except on SIGTERM; for snapshots inside windows, make every not a multiple "
                "of %d",
                self.every,
                accumulation,
                self.every,
                self.every // accumulation,
                accumulation,
            )
        if self.on_sigterm:
            if threading.current_thread() is threading.main_thread():
                self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            else:
                _log.warning(
                    "train() runs outside the main thread, where no signal handler can be "
                    "set: a SIGTERM will not snapshot the window"
                )

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._trainer is not None:
            self._trainer.gradvault_epoch_begin()

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        stop = self._stop_agreed(args)
        micro_step = trainer.gradvault_micro_step()
        if micro_step is None:  # replaying a resumed window: the folder resumed from stands
            if stop:
                self._stop(control)
            return
        if stop or self._due(args, state, micro_step):
            self._snapshot(trainer, args)
        if stop:
            self.wait()
            self._stop(control)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._stop_agreed(args):
            control.should_save = True  # the step finished: a normal checkpoint-N
            self._stop(control)
        elif self._due(args, state, 0):
            control.should_save = True  # the N-th micro-batch ended a window: checkpoint-N

    def _stop_agreed(self, args: TrainingArguments) -> bool:
        """Whether to stop after this micro-batch: a SIGTERM arrived, here or, with several
        processes, on any rank (one small all-reduce per micro-batch, every rank at the
        same point), so that every rank stops after the same micro-batch."""
        stop = self._signal_received.is_set()
        if self.on_sigterm and args.world_size > 1:
            stop = any_rank(stop, args.device)
        return stop

    def _due(self, args: TrainingArguments, state: TrainerState, micro_step: int) -> bool:
        """Whether the micro-batch ``micro_step`` of the window after ``state.global_step``
        steps is an ``every``-th one (counted over the run: docs/INTEGRATIONS.md)."""
        if self.every is None:
            return False
        micro_batches = state.global_step * args.gradient_accumulation_steps + micro_step
        return micro_batches % self.every == 0

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._trainer is not None:
            self._trainer.gradvault_checkpoint_saved()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.finish()

    def _stop(self, control: TrainerControl) -> None:
        control.should_training_stop = True
        self.stopped_by_signal = True


__all__ = ["GradvaultCallback"]
