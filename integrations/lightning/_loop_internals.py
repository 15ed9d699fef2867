"""Every use of Lightning's private names, in one module, behind a version check.

A Lightning checkpoint saved inside an epoch brings back the loops' counters, but not the
training data's position: a loader without ``state_dict``/``load_state_dict`` starts the
resumed epoch from its first batch (Lightning warns "your dataloader is not resumable").
The callback positions it, and for that relies on these private names of Lightning
(checked against ``SUPPORTED_LIGHTNING``), used here only:

- ``Trainer.fit_loop._combined_loader``: the training ``CombinedLoader`` (its public
  ``flattened`` lists the loaders), to tell whether Lightning resumes them itself
  (:func:`training_loaders`);
- ``Trainer.fit_loop._data_fetcher``: the fetcher the epoch loop draws batches from; its
  iterator is made again and the batches already trained are drawn from it before the
  resumed epoch's first step (:func:`restart_training_iterator`);
- ``lightning.fabric.utilities.data._set_sampler_epoch``: the epoch given to a loader's
  sampler (a ``DistributedSampler``'s order depends on it) before that iterator is made,
  as Lightning gives it before each epoch.

It reads besides the loops' public progress counters
(``fit_loop.epoch_loop.batch_progress.current.processed``: the batches of the epoch
whose training step ran, :func:`batches_processed`).

The installed Lightning is checked against ``SUPPORTED_LIGHTNING`` once, when this module
is imported (with the package): a version outside it raises ``UnsupportedSetupError``
naming both.
"""

from __future__ import annotations

from typing import Any

import lightning
from lightning.fabric.utilities.data import _set_sampler_epoch

from .._versions import check_release

#: the Lightning releases whose loop internals the integration is tested against; the same
#: range as the ``lightning`` extra's pin in pyproject.toml
SUPPORTED_LIGHTNING = ">=2.6,<2.7"


def check_lightning_version(installed: str) -> None:
    """Raise UnsupportedSetupError unless ``installed`` is in ``SUPPORTED_LIGHTNING``."""
    check_release(
        "lightning",
        installed,
        SUPPORTED_LIGHTNING,
        "Lightning integration relies on loop internals",
    )


check_lightning_version(lightning.__version__)


def batches_processed(trainer: Any) -> int:
    """The batches of the current epoch whose training step ran (backward included)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def training_loaders(trainer: Any) -> list[Any]:
    """The training loaders Lightning iterates (after it set them up), or [] before."""
    combined = trainer.fit_loop._combined_loader
    return [] if combined is None else list(combined.flattened)


def restart_training_iterator(trainer: Any, epoch: int, skip: int) -> None:
    """Make the training iterator of ``epoch`` again and draw ``skip`` batches from it,
    unused.

    Called before the resumed epoch loop starts, with the generators as they were before
    the epoch's iterator was made in the run that saved: the loader shuffles as it did
    (a ``DistributedSampler`` told its epoch first, which Lightning does only later),
    and the next batch drawn is the one that run trained after ``skip``.
    """
    for loader in training_loaders(trainer):
        _set_sampler_epoch(loader, epoch)
    fetcher = trainer.fit_loop._data_fetcher
    iter(fetcher)
    for _ in range(skip):
        next(fetcher.iterator)


__all__ = [
    "SUPPORTED_LIGHTNING",
    "batches_processed",
    "check_lightning_version",
    "restart_training_iterator",
    "training_loaders",
]
