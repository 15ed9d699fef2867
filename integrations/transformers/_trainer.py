"""GradvaultTrainerMixin: follows each window of micro-batches, and resumes inside one.

A window is the micro-batches of one optimizer step. The Trainer prefetches a whole
window (``get_batch_samples``) and then runs ``training_step`` on each micro-batch; the
mixin remembers, per window, what resuming inside it needs: the random generators'
states before the prefetch and before the collate of each batch collated ahead of it
(``CollateRecorder``), the running loss and counters, each micro-batch's loss.

Resuming from ``gradvault-checkpoint-N`` lets the Trainer load the step-N checkpoint and
skip the dataloader to the window of step N + 1 as usual; the mixin then prefetches that
window with the generators as they were, replays micro-batches 1 .. k without running
them (their saved losses are returned), and before micro-batch k + 1 puts back the saved
gradients and the generators' states: the run goes on bit for bit. A ``checkpoint-N``
saved under the mixin keeps what the window after it needs to be prefetched as it was.

With several processes (DDP) each rank keeps its own window state and generators, writes
its own state file, and the ranks restore their shards of the snapshot together.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import Trainer
from transformers.trainer_utils import TrainOutput

from gradvault.core import GradientsParams
from gradvault.core.errors import ResumeStateError, UnsupportedSetupError

from .._grads import restore_gradients
from .._rng import RngStates
from .._target import SnapshotTarget
from ._callback import GradvaultCallback
from ._collate import CollateRecorder
from ._folder import (
    WindowState,
    folder_for,
    is_resume_folder,
    latest_checkpoint,
    read_logging_state,
    write_logging_state,
)
from ._protocol import WindowSnapshot
from ._trainer_internals import (
    RngLoadHook,
    checkpoint_folder,
    gradient_scaler,
    last_logged_step,
    running_loss,
    set_logging_state,
    write_step_checkpoint,
)

_DEVICE_TYPES = ("cpu", "cuda")


@dataclass
class _Window:
    """The window of micro-batches the Trainer is running now."""

    batches: list[Any]
    first_in_epoch: bool
    rng_at_epoch_begin: RngStates | None
    rng_at_window_start: RngStates
    collated_ahead: list[RngStates] | None  # before the collates of its batches collated ahead
    tr_loss_at_start: torch.Tensor
    globalstep_last_logged: int
    tokens_at_start: int
    flos_at_start: float
    losses: list[torch.Tensor] = field(default_factory=list)
    folder: Path | None = None  # the resume folder written for this window
    resumed_from: Path | None = None  # the folder this window was resumed from

    @property
    def done(self) -> int:
        """Micro-batches of this window that have run (or been replayed)."""
        return len(self.losses)


@dataclass
class _Resume:
    """A resume in progress: the folder's state, and the gradients fetched for it (one
    process) or the target every rank's shard is restored from (several)."""

    folder: Path
    state: WindowState
    gradients: GradientsParams | None
    target: SnapshotTarget


# Type checkers read the mixin as a Trainer, so that its super() calls reach Trainer's
# methods; at run time it has no base but the hook, and sits before a Trainer in the bases
# of a class.
if TYPE_CHECKING:
    from transformers import Trainer as _MixinBase
else:
    _MixinBase = object


class GradvaultTrainerMixin(RngLoadHook, _MixinBase):
    """Put first among a ``transformers.Trainer`` subclass's bases to resume mid-window.

    ``class MyTrainer(GradvaultTrainerMixin, SFTTrainer): ...``; ``GradvaultTrainer`` is
    this mixin on ``Trainer``. It needs exactly one ``GradvaultCallback`` among the
    trainer's callbacks. ``train(resume_from_checkpoint=...)`` takes a
    ``gradvault-checkpoint-N`` folder as well as a ``checkpoint-N`` one, and ``True``
    picks the newest of both kinds in ``args.output_dir``.

    The callback calls the ``gradvault_*`` methods (the ``WindowTrainer`` protocol of
    ``_protocol.py``); the Trainer's private names are used through
    ``_trainer_internals.py`` only.
    """

    _gradvault_window: _Window | None = None
    _gradvault_resume: _Resume | None = None
    _gradvault_epoch_rng: RngStates | None = None
    _gradvault_epoch_fresh: bool = False
    _gradvault_logging: dict[str, Any] | None = None
    _gradvault_collates: CollateRecorder | None = None
    _gradvault_rng_after_prefetch: RngStates | None = None

    # ------------------------------------------------------------------ train
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """``Trainer.train``, resuming inside a window from a ``gradvault-checkpoint-N`` folder."""
        trainer: Any = self
        callback = self._gradvault_setup()
        try:
            if resume_from_checkpoint is True:
                found = latest_checkpoint(trainer.args.output_dir)
                if found is not None:
                    resume_from_checkpoint = str(found)
            self._gradvault_resume = None
            self._gradvault_window = None
            self._gradvault_logging = None
            self._gradvault_rng_after_prefetch = None
            if isinstance(resume_from_checkpoint, str | os.PathLike):
                folder = Path(resume_from_checkpoint)
                if is_resume_folder(folder):
                    self._gradvault_resume = self._gradvault_load(folder, callback)
                else:
                    self._gradvault_logging = read_logging_state(
                        folder, trainer.args.process_index, trainer.args.world_size
                    )
                resume_from_checkpoint = os.fspath(resume_from_checkpoint)
            return super().train(
                resume_from_checkpoint=resume_from_checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
            )
        finally:
            self._gradvault_resume = None
            callback.finish()

    def _gradvault_setup(self) -> GradvaultCallback:
        """The one GradvaultCallback, bound; refuses what cannot be resumed exactly."""
        trainer: Any = self
        found = [
            callback
            for callback in trainer.callback_handler.callbacks
            if isinstance(callback, GradvaultCallback)
        ]
        if len(found) != 1:
            raise UnsupportedSetupError(
                f"{type(self).__name__} needs exactly one GradvaultCallback among its callbacks; "
                f"found {len(found)} (pass callbacks=[GradvaultCallback(...)])"
            )
        callback = found[0]
        if getattr(trainer, "is_deepspeed_enabled", False):
            raise UnsupportedSetupError(
                "DeepSpeed partitions gradients and exposes no plain .grad to snapshot; "
                "gradvault's Trainer integration refuses DeepSpeed runs"
            )
        if getattr(trainer, "is_fsdp_enabled", False) or getattr(
            trainer, "is_fsdp_xla_enabled", False
        ):
            raise UnsupportedSetupError(
                "FSDP shards gradients and exposes no plain .grad to snapshot; gradvault's "
                "Trainer integration refuses FSDP runs (untested: accelerate runs FSDP on "
                "GPUs only); an FSDP2 loop of your own snapshots and restores its sharded "
                "gradients through gradvault.integrations.torch"
            )
        if trainer.args.enable_jit_checkpoint and callback.on_sigterm:
            raise UnsupportedSetupError(
                "enable_jit_checkpoint and GradvaultCallback(on_sigterm=True) both handle "
                "SIGTERM; turn one of them off"
            )
        if trainer.args.device.type not in _DEVICE_TYPES:
            raise UnsupportedSetupError(
                f"training on {trainer.args.device.type!r}: gradvault's Trainer integration "
                f"saves the random generators of {' and '.join(_DEVICE_TYPES)} devices only"
            )
        for name, param in trainer.model.named_parameters():
            if param.requires_grad and param.dtype == torch.bfloat16 and param.device.type != "cpu":
                raise UnsupportedSetupError(
                    f"parameter {name!r} is bfloat16 on {param.device}; gradvault shares "
                    "bfloat16 gradients on the cpu only (CuPy has no bfloat16): train on the "
                    "cpu, in float32, or with bf16=True mixed precision, which keeps float32 "
                    "parameters"
                )
        if trainer.args.world_size > 1 and callback.target.is_service:
            raise UnsupportedSetupError(
                f"{trainer.args.world_size} processes commit one snapshot together, each "
                f"rank's gradients one shard; this integration commits them to a store only "
                f"(not yet through a service such as {callback.target.location}): give a "
                "store every process sees"
            )
        callback.attach(self)
        return callback

    def _gradvault_load(self, folder: Path, callback: GradvaultCallback) -> _Resume:
        """The state and gradients of ``folder``, checked against this run."""
        args: Any = getattr(self, "args")  # noqa: B009 - the Trainer's, not the mixin's
        if args.ignore_data_skip:
            raise UnsupportedSetupError(
                "ignore_data_skip=True would replay another window than the one snapshotted; "
                f"resuming from {folder} needs the dataloader skipped as usual"
            )
        state = WindowState.read(folder, args.process_index, args.world_size)
        expected = {
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "world_size": args.world_size,
        }
        for name, value in expected.items():
            if getattr(state, name) != value:
                raise ResumeStateError(
                    f"{folder} was saved with {name}={getattr(state, name)}; this run has "
                    f"{value}: the window would not be the same"
                )
        if args.world_size > 1:  # each rank's shard, restored together at micro-batch k + 1
            return _Resume(folder, state, None, callback.target)
        record = callback.target.fetch(state.snapshot_id)
        gradients = GradientsParams.from_record(record, self._gradvault_device())
        return _Resume(folder, state, gradients, callback.target)

    def _gradvault_device(self) -> str:
        model: Any = getattr(self, "model")  # noqa: B009 - the Trainer's
        devices = {param.device for param in model.parameters()}
        if len(devices) != 1:
            raise UnsupportedSetupError(
                f"the model's parameters are on {len(devices)} devices; gradvault's Trainer "
                "integration restores gradients onto one"
            )
        (device,) = devices
        return f"cuda:{device.index or 0}" if device.type == "cuda" else device.type

    # ------------------------------------------------------------------ windows
    def get_train_dataloader(self) -> Any:
        """``Trainer.get_train_dataloader``, its collator noting the generators' states before
        each batch it collates (:class:`CollateRecorder`)."""
        trainer: Any = self
        collator = trainer.data_collator
        recorder = CollateRecorder(collator)
        trainer.data_collator = recorder  # only while the dataloader is built around it
        try:
            loader = super().get_train_dataloader()
        finally:
            trainer.data_collator = collator
        self._gradvault_collates = recorder
        return loader

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """``Trainer.get_resumed_dataloader``: the epoch resumes after its first windows."""
        self._gradvault_epoch_fresh = False
        return super().get_resumed_dataloader(dataloader, num_batches)

    def gradvault_rng_state_loaded(self) -> None:
        """After the Trainer loaded a checkpoint's generator states (which it does after a
        resumed window's prefetch): the generators as that prefetch left them, as in the
        run that saved (see ``get_batch_samples``)."""
        after, self._gradvault_rng_after_prefetch = self._gradvault_rng_after_prefetch, None
        if after is not None:
            after.restore()

    def gradvault_epoch_begin(self) -> None:
        """An epoch begins: the generators before its dataloader is iterated (called by the
        callback)."""
        self._gradvault_epoch_rng = RngStates.capture()
        self._gradvault_epoch_fresh = True
        if self._gradvault_collates is not None:
            self._gradvault_collates.reset()

    def get_batch_samples(
        self, epoch_iterator: Iterator[Any], num_batches: int, device: torch.device
    ) -> tuple[list[Any], Any]:
        """``Trainer.get_batch_samples``, remembering the window it starts.

        The first window after a resume is prefetched as it was: from the generators' states
        before its prefetch, and its batches collated ahead (during the window before's
        prefetch) each from the states before its collate.
        """
        trainer: Any = self
        resume = self._gradvault_resume
        first_in_epoch = self._gradvault_epoch_fresh
        self._gradvault_epoch_fresh = False
        recorder = self._gradvault_collates
        ahead = 0 if recorder is None else len(recorder.ahead)
        replayed: list[RngStates] | None = None
        if resume is not None:  # the window snapshotted: as it was before its prefetch
            state = resume.state
            RngStates.from_json(state.rng_at_window_start, str(resume.folder)).restore()
            set_logging_state(
                trainer,
                _tensor_from_bits(state.tr_loss_at_window_start, trainer.args.device),
                state.globalstep_last_logged,
            )
            first_in_epoch = state.first_in_epoch
            replayed = state.collated_ahead_states(str(resume.folder))
        elif self._gradvault_logging is not None:  # a checkpoint-N saved under the mixin
            logging_state, self._gradvault_logging = self._gradvault_logging, None
            set_logging_state(
                trainer,
                _tensor_from_bits(logging_state["tr_loss"], trainer.args.device),
                logging_state["globalstep_last_logged"],
            )
            if not first_in_epoch:
                # the dataloader was skipped to this window, and the Trainer loads the
                # checkpoint's generators after the prefetch: the prefetch starts from them
                # here, and the states it ends with are put back after that load
                logging_state["rng_at_save"].restore()
                replayed = logging_state["collated_ahead"]
        window_start = RngStates.capture()
        if replayed is not None:
            ahead = len(replayed)
            if recorder is not None:
                recorder.replay(replayed, then=window_start)
        tr_loss = running_loss(trainer).detach().clone()
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if replayed is not None and resume is None:
            self._gradvault_rng_after_prefetch = RngStates.capture()
        collated = None if recorder is None else recorder.take(len(batches))
        self._gradvault_window = _Window(
            batches=batches,
            first_in_epoch=first_in_epoch,
            rng_at_epoch_begin=self._gradvault_epoch_rng if first_in_epoch else None,
            rng_at_window_start=window_start,
            collated_ahead=None if collated is None else collated[:ahead],
            tr_loss_at_start=tr_loss,
            globalstep_last_logged=last_logged_step(trainer),
            tokens_at_start=trainer.state.num_input_tokens_seen,
            flos_at_start=trainer.state.total_flos + trainer.current_flos,
        )
        if resume is not None:
            self._gradvault_check_window(resume, batches)
            self._gradvault_window.folder = self._gradvault_window.resumed_from = resume.folder
        return batches, num_items_in_batch

    def _gradvault_check_window(self, resume: _Resume, batches: list[Any]) -> None:
        state = resume.state
        if len(batches) != state.window_size or _digest(batches) != state.batches_digest:
            raise ResumeStateError(
                f"the dataloader gave another window for step {state.global_step + 1} than the "
                f"run that saved {resume.folder} ({len(batches)} micro-batches, "
                f"{state.window_size} saved, or other data): the dataset, its order or the "
                "collator changed"
            )

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """``Trainer.training_step``; a resumed window's first micro-batches are replayed."""
        window = self._gradvault_window
        resume = self._gradvault_resume
        if resume is not None and window is not None:
            if window.done < resume.state.micro_step:
                args: Any = getattr(self, "args")  # noqa: B009
                loss = _tensor_from_bits(resume.state.losses[window.done], args.device)
                window.losses.append(loss)
                return loss
            self._gradvault_finish_resume(resume)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if window is not None:
            window.losses.append(loss.detach())
        return loss

    def _gradvault_finish_resume(self, resume: _Resume) -> None:
        """Before micro-batch k + 1: the saved gradients, scaler check, generators."""
        trainer: Any = self
        saved_scaler = resume.state.scaler
        scaler = gradient_scaler(trainer)
        now = None if scaler is None else _scaler_state(scaler)
        if now != saved_scaler:
            raise ResumeStateError(
                f"{resume.folder} was saved with gradient scaler state {saved_scaler}; this "
                f"run's is {now} (mixed precision settings changed?)"
            )
        if resume.gradients is None:  # several processes: collective, each rank its shard
            restore_gradients(trainer.model, resume.target, resume.state.snapshot_id)
        else:
            resume.gradients.to_torch(trainer.model)
        RngStates.from_json(resume.state.rng_at_micro_step, str(resume.folder)).restore()
        self._gradvault_resume = None

    def gradvault_micro_step(self) -> int | None:
        """Micro-batches run in the current window, or None while a resume replays it (or
        before the first window)."""
        if self._gradvault_resume is not None or self._gradvault_window is None:
            return None
        return self._gradvault_window.done

    def gradvault_checkpoint_saved(self) -> None:
        """After the Trainer saved ``checkpoint-N``: add the loss not yet logged beside it.

        Resuming from that checkpoint with this mixin then logs the same losses as a run
        that never stopped (the stock Trainer drops the steps since the last log).
        """
        trainer: Any = self
        args = trainer.args
        if args.world_size <= 1 and not args.should_save:
            return
        folder = checkpoint_folder(trainer)
        if folder.is_dir():  # with several processes, each writes its own
            write_logging_state(
                folder,
                {
                    "tr_loss": _tensor_bits(running_loss(trainer)),
                    "globalstep_last_logged": last_logged_step(trainer),
                    "rng_at_save": RngStates.capture().to_json(),
                    "collated_ahead": None
                    if self._gradvault_collates is None
                    else [states.to_json() for states in self._gradvault_collates.ahead],
                },
                args.process_index,
                args.world_size,
            )

    # ------------------------------------------------------------------ snapshots
    def gradvault_snapshot(self, run: str, target: str) -> WindowSnapshot | None:
        """The gradients accumulated so far in this window and what resuming after them
        needs, for a snapshot of run ``run`` in ``target`` (the callback commits it); the
        step's checkpoint files are written into the resume folder first, once a window."""
        trainer: Any = self
        window = self._gradvault_window
        if window is None:
            return None
        args = trainer.args
        folder = folder_for(args.output_dir, trainer.state.global_step)
        if window.folder != folder:
            self._gradvault_write_checkpoint(folder, window)
            window.folder = folder
        scaler = gradient_scaler(trainer)
        state = WindowState(
            snapshot_id="",
            target=target,
            run=run,
            global_step=trainer.state.global_step,
            micro_step=window.done,
            window_size=len(window.batches),
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            per_device_train_batch_size=args.per_device_train_batch_size,
            world_size=args.world_size,
            process_index=args.process_index,
            first_in_epoch=window.first_in_epoch,
            batches_digest=_digest(window.batches),
            losses=[_tensor_bits(loss) for loss in window.losses],
            tr_loss_at_window_start=_tensor_bits(window.tr_loss_at_start),
            globalstep_last_logged=window.globalstep_last_logged,
            rng_at_window_start=window.rng_at_window_start.to_json(),
            rng_at_micro_step=RngStates.capture().to_json(),
            collated_ahead=None
            if window.collated_ahead is None
            else [states.to_json() for states in window.collated_ahead],
            scaler=None if scaler is None else _scaler_state(scaler),
        )
        return WindowSnapshot(trainer.model, state, folder, prune_older=args.world_size <= 1)

    def _gradvault_write_checkpoint(self, folder: Path, window: _Window) -> None:
        """A normal Trainer checkpoint of the state after step N, into ``folder``."""
        if folder.exists():  # left by an earlier run: no longer complete while rewritten
            for stale in folder.glob("gradvault_resume*.json"):
                stale.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        # a resumed window's step-N checkpoint is the folder it was resumed from: copied, since
        # this process never saw the generators as they were when that window began
        if window.resumed_from is not None:
            args: Any = getattr(self, "args")  # noqa: B009 - the Trainer's
            for source in window.resumed_from.iterdir():
                if source.is_file() and _copied_by(source.name, args):
                    shutil.copy2(source, folder / source.name)
            return
        # the generators as a checkpoint-N would hold them: the Trainer loads this file
        # before iterating a new epoch's dataloader, or after prefetching a window; the
        # counters of the window's start, since the replayed micro-batches count again
        write_step_checkpoint(
            self,
            folder,
            window.rng_at_epoch_begin or window.rng_at_window_start,
            num_input_tokens_seen=window.tokens_at_start,
            total_flos=window.flos_at_start,
        )


class GradvaultTrainer(GradvaultTrainerMixin, Trainer):
    """``transformers.Trainer`` that resumes inside a window from ``gradvault-checkpoint-N``."""


def _copied_by(name: str, args: Any) -> bool:
    """Whether this process copies file ``name`` of a resumed window's step-N checkpoint
    (never a state file): with several processes each copies its own generators' file,
    and the first one the rest, as the Trainer writes them."""
    if name.startswith("gradvault_"):
        return False
    if args.world_size <= 1 or name == f"rng_state_{args.process_index}.pth":
        return True
    return args.should_save and not name.startswith("rng_state_")


def _tensor_bits(tensor: torch.Tensor) -> dict[str, str]:
    """A tensor's dtype, shape and exact bytes (hex)."""
    host = tensor.detach().to("cpu").contiguous()
    return {
        "dtype": str(host.dtype).removeprefix("torch."),
        "shape": ",".join(str(size) for size in host.shape),
        "bytes": host.reshape(-1).view(torch.uint8).numpy().tobytes().hex(),
    }


def _tensor_from_bits(bits: Mapping[str, str], device: torch.device) -> torch.Tensor:
    try:
        dtype = getattr(torch, bits["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{bits['dtype']!r} is not a torch dtype")
        shape = [int(size) for size in bits["shape"].split(",") if size]
        raw = torch.frombuffer(bytearray.fromhex(bits["bytes"]), dtype=torch.uint8)
        return raw.view(dtype).reshape(shape).to(device)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise ResumeStateError(f"a saved tensor is malformed: {error}") from None


def _scaler_state(scaler: Any) -> dict[str, Any]:
    state = scaler.state_dict()
    return {
        key: float(value) if isinstance(value, float) else value for key, value in state.items()
    }


def _digest(batches: list[Any]) -> str:
    """A digest of a window's micro-batches: every tensor's dtype, shape and bytes, the
    keys, and plain values (str, numbers, None)."""
    hasher = hashlib.blake2b(digest_size=16)

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            host = value.detach().to("cpu").contiguous()
            hasher.update(f"{host.dtype}{tuple(host.shape)}".encode())
            hasher.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, Mapping):
            for key in sorted(value, key=str):
                hasher.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                feed(item)
        elif value is None or isinstance(value, str | int | float | bool):
            hasher.update(repr(value).encode())
        else:  # an object's repr may hold its address: only its type is compared
            hasher.update(type(value).__qualname__.encode())

    for batch in batches:
        feed(batch)
    return hasher.hexdigest()
