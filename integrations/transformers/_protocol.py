"""How ``GradvaultCallback`` and ``GradvaultTrainerMixin`` talk: two protocols of public methods.

The work is split by what each half can see. The callback sees the Trainer's events (a
micro-batch ended, a checkpoint was saved, an epoch begins) and a SIGTERM, decides when to
snapshot and commits snapshots in the background; the mixin sees inside the training loop
(the window of micro-batches being run, the generators, the running loss) and knows what
resuming inside a window needs. Each calls the other only through the methods below, so
either can change inside without the other following, and neither reaches into the
other's private state (a test, tests/integrations/test_transformers_structure.py, checks
that no module of the package uses another module's private names).

One window, as the two halves see it::

    callback.on_epoch_begin      -> trainer.gradvault_epoch_begin()
    callback.on_substep_end      -> trainer.gradvault_micro_step()           (k, or None)
      (every-th micro-batch, or SIGTERM)
                                 -> trainer.gradvault_snapshot(run, target)  (a WindowSnapshot)
                                    the callback commits it in the background
    callback.on_save             -> trainer.gradvault_checkpoint_saved()
    trainer.train()              -> callback.attach(trainer) ... callback.finish()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ._folder import WindowState

if TYPE_CHECKING:
    from .._target import SnapshotTarget


@dataclass
class WindowSnapshot:
    """What the trainer hands the callback to commit: the model whose ``.grad`` hold the
    gradients accumulated so far in the window, the state resuming there needs (its
    ``snapshot_id`` filled in once the snapshot commits), and the resume folder that
    state completes."""

    model: Any
    state: WindowState
    folder: Path
    #: whether the folders of earlier windows are deleted once this one is complete (a
    #: single process; with several, each completes its own state file in the folder)
    prune_older: bool


class WindowTrainer(Protocol):
    """What the callback asks of the trainer; ``GradvaultTrainerMixin`` implements it."""

    def gradvault_epoch_begin(self) -> None:
        """An epoch begins: note the generators before its dataloader is iterated."""
        ...

    def gradvault_micro_step(self) -> int | None:
        """Micro-batches run in the current window, or None while a resumed window is
        replayed (or before the first window)."""
        ...

    def gradvault_snapshot(self, run: str, target: str) -> WindowSnapshot | None:
        """The window's gradients so far and what resuming after them needs, for a
        snapshot of run ``run`` in ``target``; the step's checkpoint files are in the
        resume folder when it returns. None when no window is running. The callback waits
        for the snapshot in flight before asking: the folder may be the same one."""
        ...

    def gradvault_checkpoint_saved(self) -> None:
        """The Trainer saved ``checkpoint-N``: add beside it what resuming from it exactly
        needs."""
        ...


class SnapshotCallback(Protocol):
    """What the trainer asks of the callback; ``GradvaultCallback`` implements it."""

    #: where the snapshots go, and where a resume fetches its snapshot from
    target: SnapshotTarget
    #: whether the callback handles SIGTERM (the trainer refuses a second handler)
    on_sigterm: bool

    def attach(self, trainer: WindowTrainer) -> None:
        """``trainer.train()`` starts: the trainer whose windows to snapshot."""
        ...

    def wait(self) -> None:
        """Block until the snapshot in flight (if any) is committed and its folder complete."""
        ...

    def finish(self) -> None:
        """``trainer.train()`` ended (or failed): wait for the snapshot in flight, put back
        the SIGTERM handler, release the target. Calling it again does nothing more."""
        ...
