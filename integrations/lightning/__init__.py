"""Exact mid-window resume for Lightning ``Trainer(accumulate_grad_batches=k)`` runs.

Install ``gradvault[lightning]``. Two lines in a training script::

    trainer = Trainer(accumulate_grad_batches=4, callbacks=[GradvaultCallback("gv-store")])
    trainer.fit(model, datamodule, ckpt_path="last")

``GradvaultCallback`` snapshots the gradients accumulated so far in an optimizer step's
window (every ``every`` micro-batches, and on SIGTERM) beside a Lightning checkpoint that
holds the batch position and the random generators' states; ``fit(ckpt_path=...)`` from
that checkpoint resumes at the next micro-batch, bit for bit. docs/INTEGRATIONS.md says
what is saved and what is refused.
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401 - the extra's presence is checked here, once
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "gradvault.integrations.lightning needs lightning; install the extra: "
        "pip install 'gradvault[lightning]'"
    ) from error

from gradvault.core.errors import IntegrationError, ResumeStateError, UnsupportedSetupError

from ._callback import GradvaultCallback
from ._loop_internals import SUPPORTED_LIGHTNING

__all__ = [
    "SUPPORTED_LIGHTNING",
    "GradvaultCallback",
    "IntegrationError",
    "ResumeStateError",
    "UnsupportedSetupError",
]
