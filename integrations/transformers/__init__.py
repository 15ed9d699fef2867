"""Exact mid-window resume for Hugging Face ``Trainer`` runs (install ``gradvault[hf]``).

Two lines in a training script::

    trainer = GradvaultTrainer(..., callbacks=[GradvaultCallback("gv-store", every=25)])
    trainer.train(resume_from_checkpoint=latest_checkpoint(args.output_dir))

``GradvaultCallback`` snapshots the gradients accumulated so far in an optimizer step's
window (every ``every`` micro-batches, and on SIGTERM), beside a normal Trainer checkpoint
in ``gradvault-checkpoint-N``; ``GradvaultTrainer`` (or ``GradvaultTrainerMixin`` on a
Trainer subclass of your own) resumes from such a folder at the micro-batch where it
stopped, bit for bit. docs/INTEGRATIONS.md says what is saved and what is refused.
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401 - the extra's presence is checked here, once
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "gradvault.integrations.transformers needs transformers and accelerate; install "
        "the extra: pip install 'gradvault[hf]'"
    ) from error

from gradvault.core.errors import IntegrationError, ResumeStateError, UnsupportedSetupError

from ._callback import GradvaultCallback
from ._folder import FOLDER_PREFIX, STATE_FILE, latest_checkpoint
from ._trainer import GradvaultTrainer, GradvaultTrainerMixin

__all__ = [
    "FOLDER_PREFIX",
    "STATE_FILE",
    "GradvaultCallback",
    "GradvaultTrainer",
    "GradvaultTrainerMixin",
    "IntegrationError",
    "ResumeStateError",
    "UnsupportedSetupError",
    "latest_checkpoint",
]
