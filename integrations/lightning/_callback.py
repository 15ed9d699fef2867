"""GradvaultCallback: a place to resume from inside an accumulation window, and the resume."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from lightning.pytorch.utilities.exceptions import SIGTERMException

from gradvault.core.errors import ResumeStateError, UnsupportedSetupError

from .._grads import restore_gradients, snapshot_gradients
from .._rng import RngStates
from .._target import SnapshotTarget, check_schedule
from ._loop_internals import batches_processed, restart_training_iterator, training_loaders
from ._ranks import gather_from_ranks

_log = logging.getLogger("gradvault.integrations.lightning")

#: the version of what the callback keeps in a checkpoint (``state_dict``)
STATE_FORMAT = 1


class GradvaultCallback(OnExceptionCheckpoint):
    """Snapshots the gradients accumulated inside a window, beside a Lightning checkpoint.

    Added to ``Trainer(callbacks=[...])`` with ``accumulate_grad_batches=k``. ``target`` is a
    store path or URL (written through a ``Recorder``, ``keep_last`` its retention) or a
    service URL (through the ``Client``; ``token`` or ``GRADVAULT_TOKEN``). At a place to
    resume from (after every ``every``-th micro-batch, counted over the run as
    ``global_step * k + micro-batches done in the window``, and after the micro-batch
    during which a SIGTERM arrived) it snapshots every ``.grad`` when the window is not
    complete, then writes a Lightning checkpoint, ``dirpath/gradvault-last.ckpt``
    (default ``dirpath``: ``./gradvault``), whose callback state holds the snapshot's id,
    the batch position in the epoch and the random generators' states.

    ``trainer.fit(model, datamodule, ckpt_path=...)`` with that file (or ``"last"``, which
    finds it: this is an ``OnExceptionCheckpoint``) resumes at the micro-batch after it, bit
    for bit: the loader positioned, the gradients put back before the next micro-batch,
    the generators as they were. ``on_sigterm=True`` snapshots first, then hands the
    SIGTERM to Lightning's own handler, which stops training as it always does; with DDP
    the ranks agree on it after each micro-batch, snapshot together (each rank's sums a
    shard of one snapshot) and stop together with Lightning's ``SIGTERMException``.
    docs/INTEGRATIONS.md says what is saved and what is refused.
    """

    FILENAME = "gradvault-last"

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        every: int | None = None,
        on_sigterm: bool = True,
        run: str | None = None,
        token: str | None = None,
        keep_last: int | None = None,
        dirpath: str | os.PathLike[str] | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_schedule(every, on_sigterm, run)
        folder = Path(dirpath) if dirpath is not None else Path.cwd() / "gradvault"
        super().__init__(os.fspath(folder), filename=self.FILENAME)
        self.target = SnapshotTarget(
            target, token=token, keep_last=keep_last, store_options=store_options
        )
        self.every = every
        self.on_sigterm = on_sigterm
        self.run = run
        #: ids of the snapshots committed by this callback, oldest first
        self.snapshot_ids: list[str] = []
        #: places to resume from that failed (each logged); training went on
        self.failures = 0
        #: True once a SIGTERM made training stop after a place to resume from was saved
        self.stopped_by_signal = False
        self._signal = threading.Event()
        self._lightning_handler: Any = None
        self._trainer: Trainer | None = None
        #: the generators before the running epoch's training iterator was made (JSON form)
        self._epoch_rng: dict[str, Any] | None = None
        self._fit_start_rng: dict[str, Any] | None = None
        #: whether the next epoch's iterator was made when fit started (Lightning makes
        #: the first epoch's before ``on_train_epoch_start``, later ones after it)
        self._iterator_made_at_fit_start = False
        #: the snapshot id of the checkpoint being written by this callback, else None
        self._saving_snapshot: str | None = None
        #: the state loaded from the checkpoint resumed from, until the resume is set up
        self._loaded: dict[str, Any] | None = None
        #: what to put back before the resumed epoch's next training step
        self._pending: dict[str, Any] | None = None

    @property
    def signal_received(self) -> bool:
        """Whether a SIGTERM arrived during this ``fit``."""
        return self._signal.is_set()

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """What a resume needs beside Lightning's own checkpoint (plain values only)."""
        trainer = self._trainer
        if trainer is None:
            return {}
        processed = batches_processed(trainer)
        return {
            "format": STATE_FORMAT,
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "batches_done": processed,
            "micro_step": _micro_step(trainer, processed),
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "num_training_batches": _batch_count(trainer),
            "world_size": trainer.world_size,
            "snapshot_id": self._saving_snapshot,
            "target": self.target.location,
            # every rank's generators (Lightning keeps rank 0's callback state only)
            "epoch_rng_by_rank": gather_from_ranks(trainer, self._epoch_rng),
            "rng_by_rank": gather_from_ranks(trainer, RngStates.capture().to_json()),
            "scale": _scaler_scale(trainer),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict.get("format") != STATE_FORMAT:
            raise ResumeStateError(
                f"the checkpoint's gradvault state has format {state_dict.get('format')!r}; "
                f"this gradvault reads format {STATE_FORMAT}"
            )
        self._loaded = dict(state_dict)

    # ------------------------------------------------------------------ setup and teardown
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        _check_setup(trainer, pl_module, self.target.is_service)
        self._trainer = trainer
        self._signal.clear()
        self.stopped_by_signal = False

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # the first epoch's training iterator is made after this hook (sanity checking in
        # between keeps the generators as they were)
        self._fit_start_rng = RngStates.capture().to_json()
        self._iterator_made_at_fit_start = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install_sigterm_handler()
        loaded, self._loaded = self._loaded, None
        if loaded is None:
            self._epoch_rng = self._fit_start_rng
            return
        self._resume(trainer, loaded)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._iterator_made_at_fit_start:
            self._iterator_made_at_fit_start = False  # made already, from _fit_start_rng
            return
        # a later epoch's training iterator is made just after this hook
        self._epoch_rng = RngStates.capture().to_json()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        # unlike OnExceptionCheckpoint, nothing is saved here: after an exception the
        # gradients may be half accumulated; the last place to resume from stands
        self._finish()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # OnExceptionCheckpoint deletes its file here; this one is the place to resume from
        self._finish()

    def _finish(self) -> None:
        if self._lightning_handler is not None:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._lightning_handler)
            self._lightning_handler = None
        self.target.close()

    # ------------------------------------------------------------------ SIGTERM
    def _install_sigterm_handler(self) -> None:
        """Put this callback's handler in front of the one Lightning set for SIGTERM."""
        if not self.on_sigterm:
            return
        if threading.current_thread() is not threading.main_thread():
            _log.warning(
                "fit() runs outside the main thread, where no signal handler can be set: a "
                "SIGTERM will not snapshot the window"
            )
            return
        self._lightning_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._signal.set()

    def _hand_sigterm_to_lightning(self, trainer: Trainer) -> None:
        """The place to resume from is saved: let Lightning handle the SIGTERM its way.

        With several processes every rank stops here, together, with the exception
        Lightning's loop raises on SIGTERM: Lightning's handler would forward the signal
        from rank 0 to the others and broadcast it inside the handler, out of step with
        ranks that have already agreed to stop.
        """
        handler, self._lightning_handler = self._lightning_handler, None
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
        if trainer.world_size > 1:
            raise SIGTERMException
        if callable(handler):
            handler(signal.SIGTERM, None)  # Lightning's: stops after this batch
        else:
            trainer.should_stop = True  # no handler of Lightning's: stop all the same

    # ------------------------------------------------------------------ training events
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if batch_idx != pending["batches_done"]:
            raise ResumeStateError(
                f"the resumed epoch's first batch is batch {batch_idx}; the checkpoint was "
                f"saved after {pending['batches_done']} batches of the epoch"
            )
        scale = _scaler_scale(trainer)
        if scale != pending["scale"]:
            raise ResumeStateError(
                f"the gradient scaler's scale is {scale} after loading the checkpoint; it "
                f"was {pending['scale']} when the window's gradients were saved"
            )
        if pending["snapshot_id"] is not None:
            restore_gradients(pl_module, self.target, pending["snapshot_id"])
        rng = pending["rng_by_rank"][trainer.global_rank]
        RngStates.from_json(rng, "the checkpoint's gradvault state").restore()

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        micro_step = _micro_step(trainer, batches_processed(trainer))
        stop = self._signal.is_set()
        if self.on_sigterm and trainer.world_size > 1:
            # a SIGTERM on any rank stops every rank after this micro-batch
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop or self._due(trainer, micro_step):
            self._save(trainer, pl_module, micro_step)
        if stop:
            self.stopped_by_signal = True
            self._hand_sigterm_to_lightning(trainer)

    def _due(self, trainer: Trainer, micro_step: int) -> bool:
        if self.every is None:
            return False
        micro_batches = trainer.global_step * trainer.accumulate_grad_batches + micro_step
        return micro_batches % self.every == 0

    def _run_name(self, trainer: Trainer) -> str:
        if self.run is not None:
            return self.run
        return Path(trainer.default_root_dir).resolve().name or "run"

    def _save(self, trainer: Trainer, pl_module: LightningModule, micro_step: int) -> None:
        """Snapshot the window's gradients (when it is not complete), then the checkpoint."""
        try:
            snapshot_id = None
            if micro_step:
                tags = {
                    "framework": "lightning",
                    "global_step": str(trainer.global_step),
                    "micro_step": str(micro_step),
                    "epoch": str(trainer.current_epoch),
                    "batches_done": str(batches_processed(trainer)),
                }
                snapshot_id = snapshot_gradients(
                    pl_module,
                    self.target,
                    run=self._run_name(trainer),
                    step=trainer.global_step,
                    tags=tags,
                )
            path = Path(self.ckpt_path)
            partial = path.with_name(path.name + ".partial")
            self._saving_snapshot = snapshot_id
            try:
                trainer.save_checkpoint(partial)
            finally:
                self._saving_snapshot = None
            if trainer.is_global_zero:  # the rank that wrote it
                os.replace(partial, path)
        except Exception as error:  # noqa: BLE001 - reported, training goes on
            self.failures += 1
            _log.error(
                "gradvault place to resume from after step %d, micro-batch %d failed: %s: %s",
                trainer.global_step,
                micro_step,
                type(error).__name__,
                error,
            )
            return
        if snapshot_id is not None:
            self.snapshot_ids.append(snapshot_id)

    # ------------------------------------------------------------------ resuming
    def _resume(self, trainer: Trainer, loaded: dict[str, Any]) -> None:
        """Check the checkpoint's state against this run and position the training data."""
        for key, found in (
            ("accumulate_grad_batches", trainer.accumulate_grad_batches),
            ("num_training_batches", _batch_count(trainer)),
            ("world_size", trainer.world_size),
        ):
            if loaded.get(key) != found:
                raise ResumeStateError(
                    f"the checkpoint was saved with {key}={loaded.get(key)}; this run has {found}"
                )
        if loaded["micro_step"] and loaded["snapshot_id"] is None:
            _log.warning(
                "the checkpoint was saved after micro-batch %d of a window by another callback: "
                "the window's gradients were not saved, and the resumed window misses them",
                loaded["micro_step"],
            )
        batches_done = int(loaded["batches_done"])
        if batches_done == loaded["num_training_batches"] and not _resumes_its_loaders(trainer):
            # saved after an epoch's last micro-batch: in the run that saved, the next
            # epoch's iterator was made from the generators as they were then; Lightning
            # made this one already, from this process's
            rng = loaded["rng_by_rank"][trainer.global_rank]
            RngStates.from_json(rng, "the checkpoint's gradvault state").restore()
            restart_training_iterator(trainer, trainer.current_epoch, 0)
            self._epoch_rng = rng
            return
        if not 0 < batches_done < (loaded["num_training_batches"] or float("inf")):
            self._epoch_rng = self._fit_start_rng
            return
        self._epoch_rng = loaded["epoch_rng_by_rank"][trainer.global_rank]
        self._iterator_made_at_fit_start = False  # this epoch's start hook does not run again
        if not _resumes_its_loaders(trainer):
            if self._epoch_rng is None:
                raise ResumeStateError(
                    "the checkpoint holds no generator states for its epoch's data order"
                )
            RngStates.from_json(self._epoch_rng, "the checkpoint's gradvault state").restore()
            restart_training_iterator(trainer, trainer.current_epoch, batches_done)
        self._pending = loaded


def _check_setup(trainer: Trainer, pl_module: LightningModule, to_service: bool) -> None:
    """UnsupportedSetupError for what the callback cannot resume exactly."""
    strategy = trainer.strategy
    if isinstance(strategy, FSDPStrategy | DeepSpeedStrategy | ModelParallelStrategy):
        raise UnsupportedSetupError(
            f"GradvaultCallback does not support {type(strategy).__name__}: its gradients are "
            "sharded or partitioned across processes, with no plain .grad to snapshot"
        )
    if not isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
        raise UnsupportedSetupError(
            f"GradvaultCallback supports a single device and DDPStrategy; the strategy is "
            f"{type(strategy).__name__}"
        )
    if to_service and trainer.world_size > 1:
        raise UnsupportedSetupError(
            "with several processes the ranks commit one snapshot together, and this "
            "callback commits it to a store only (not yet through a service URL): give a "
            "store every rank sees"
        )
    if not pl_module.automatic_optimization:
        raise UnsupportedSetupError(
            "GradvaultCallback needs automatic optimization (accumulate_grad_batches); the "
            "module sets automatic_optimization = False"
        )
    device = strategy.root_device
    if device.type not in ("cpu", "cuda"):
        raise UnsupportedSetupError(
            f"GradvaultCallback restores gradients onto cpu or cuda devices; the module is on "
            f"{device}"
        )


def _resumes_its_loaders(trainer: Trainer) -> bool:
    """Whether Lightning restores the training loaders' position itself (each has
    ``state_dict`` and ``load_state_dict``, as torchdata's ``StatefulDataLoader``)."""
    loaders = training_loaders(trainer)
    return bool(loaders) and all(
        callable(getattr(loader, "state_dict", None))
        and callable(getattr(loader, "load_state_dict", None))
        for loader in loaders
    )


def _batch_count(trainer: Trainer) -> int | None:
    count = trainer.num_training_batches
    return None if count == float("inf") else int(count)


def _micro_step(trainer: Trainer, processed: int) -> int:
    """Micro-batches done in the current window (0 once its optimizer step ran)."""
    count = _batch_count(trainer)
    if count is not None and processed >= count:
        return 0  # an epoch's last window, shortened or not, steps at its last batch
    return processed % trainer.accumulate_grad_batches


def _scaler_scale(trainer: Trainer) -> float | None:
    """The precision plugin's gradient scale (16-mixed), else None."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return None
    return float(scaler.get_scale())


__all__ = ["GradvaultCallback"]
