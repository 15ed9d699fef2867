"""Every use of ``transformers.Trainer``'s private attributes and methods, in one module.

``Trainer`` has no public way to save one part of a checkpoint, to read or set the running
loss between logs, or to act after it loads a checkpoint's generator states; resuming
inside a window needs all three. The integration relies on these private names of
``transformers.Trainer`` (checked against transformers 5.25 .. 5.x; see
``SUPPORTED_TRANSFORMERS``), and uses them here only:

- ``_tr_loss`` (the running loss summed since the last log, a tensor on the training
  device) and ``_globalstep_last_logged`` (the step last logged): read at a window's
  start and at a ``checkpoint-N`` save, set before a resumed window's prefetch
  (:func:`running_loss`, :func:`last_logged_step`, :func:`set_logging_state`);
- ``_get_output_dir(trial=None)``: where ``_save_checkpoint`` put ``checkpoint-N``
  (:func:`checkpoint_folder`);
- ``save_model(path, _internal_call=True)``, ``_save_optimizer_and_scheduler``,
  ``_save_scaler`` and ``_save_rng_state``: the parts of ``_save_checkpoint`` that write a
  step's checkpoint files, and the ``trainer_state.json`` block of ``_save_checkpoint``
  (``ExportableState`` callbacks), mirrored (:func:`write_step_checkpoint`);
- ``_load_rng_state``, overridden (:class:`RngLoadHook`): the Trainer loads a checkpoint's
  generator states after prefetching the resumed window, and the mixin puts back the
  states that prefetch ended with just after.

Of accelerate, one attribute, public but undocumented: ``Accelerator.scaler``, the gradient
scaler of fp16 mixed precision or None (:func:`gradient_scaler`).

The rest of the integration uses ``Trainer``'s public methods (``get_train_dataloader``,
``get_resumed_dataloader``, ``get_batch_samples``, ``training_step``) and callback events,
but relies on the order in which ``Trainer._run_epoch`` calls them: a window's prefetch,
then ``training_step`` and ``on_substep_end`` per micro-batch. A test
(tests/integrations/test_transformers_structure.py) checks that no other module of the
package touches a private name of ``Trainer`` or ``Accelerator``.

The installed transformers is checked against ``SUPPORTED_TRANSFORMERS`` once, when this
module is imported (with the package): a version outside it raises
``UnsupportedSetupError`` naming both.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.trainer_callback import ExportableState

from .._rng import RngStates, generators_at
from .._versions import check_release

#: the transformers releases whose Trainer internals the integration is tested against;
#: the same range as the ``hf`` extra's pin in pyproject.toml
SUPPORTED_TRANSFORMERS = ">=5.25,<6"
TRAINER_STATE_NAME = "trainer_state.json"


def check_transformers_version(installed: str) -> None:
    """Raise UnsupportedSetupError unless ``installed`` is in ``SUPPORTED_TRANSFORMERS``."""
    check_release(
        "transformers",
        installed,
        SUPPORTED_TRANSFORMERS,
        "Trainer integration relies on Trainer internals",
    )


check_transformers_version(transformers.__version__)


def running_loss(trainer: Any) -> torch.Tensor:
    """The loss summed since the last log (``Trainer._tr_loss``)."""
    return trainer._tr_loss


def last_logged_step(trainer: Any) -> int:
    """The optimizer step last logged (``Trainer._globalstep_last_logged``)."""
    return trainer._globalstep_last_logged


def set_logging_state(trainer: Any, loss: torch.Tensor, last_logged: int) -> None:
    """Set the loss summed since the last log and the step last logged, as a run that
    never stopped has them before the window it resumes."""
    trainer._tr_loss = loss
    trainer._globalstep_last_logged = last_logged


def checkpoint_folder(trainer: Any) -> Path:
    """The folder ``Trainer._save_checkpoint`` writes ``checkpoint-N`` into at this step."""
    return Path(trainer._get_output_dir(trial=None)) / f"checkpoint-{trainer.state.global_step}"


def write_step_checkpoint(
    trainer: Any,
    folder: Path,
    generators: RngStates,
    *,
    num_input_tokens_seen: int,
    total_flos: float,
) -> None:
    """A normal Trainer checkpoint of the state after step N into ``folder``, written by
    the Trainer's own methods as ``Trainer._save_checkpoint`` writes one: model,
    optimizer, scheduler, scaler, the random generators as ``generators`` holds them, and
    ``trainer_state.json`` with the given token and FLOP counters."""
    path = str(folder)
    trainer.save_model(path, _internal_call=True)
    trainer._save_optimizer_and_scheduler(path)
    trainer._save_scaler(path)
    with generators_at(generators):
        trainer._save_rng_state(path)
    if trainer.args.should_save:
        state = copy.deepcopy(trainer.state)
        state.num_input_tokens_seen = num_input_tokens_seen
        state.total_flos = total_flos
        for callback in trainer.callback_handler.callbacks + [trainer.control]:
            if isinstance(callback, ExportableState):
                name = type(callback).__name__
                if isinstance(state.stateful_callbacks.get(name), list):
                    state.stateful_callbacks[name].append(callback.state())
                else:
                    state.stateful_callbacks[name] = callback.state()
        state.save_to_json(str(folder / TRAINER_STATE_NAME))


def gradient_scaler(trainer: Any) -> Any:
    """accelerate's gradient scaler (``Accelerator.scaler``), or None without one."""
    return getattr(trainer.accelerator, "scaler", None)


class RngLoadHook:
    """Overrides ``Trainer._load_rng_state`` to call :meth:`gradvault_rng_state_loaded`
    after it: put first among the bases of a ``Trainer`` subclass (the mixin derives from
    it)."""

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """``Trainer._load_rng_state``, then :meth:`gradvault_rng_state_loaded`."""
        super()._load_rng_state(checkpoint)  # type: ignore[misc]
        self.gradvault_rng_state_loaded()

    def gradvault_rng_state_loaded(self) -> None:
        """Called after the Trainer loaded a checkpoint's generator states (or found none)."""
