"""The errors gradvault raises.

Every error derives from one root, and the recorder's errors say what was expected and
what was found, naming the parameter::

    GradvaultError
    ├── AutogradError (RuntimeError)          misuse of the autodiff engine
    │   ├── InplaceModificationError          a saved tensor was changed in place
    │   ├── GradcheckError                    an analytic gradient disagrees with finite
    │   │                                     differences (gradcheck)
    │   ├── ConflictingOptionsError (ValueError)  options that cannot be used together
    │   └── UnsupportedOptionError (NotImplementedError)  options not implemented (as in
    │                                                     PyTorch)
    ├── InvalidArgumentError (ValueError)     an argument with a value the call cannot take
    ├── InvalidArgumentTypeError (TypeError)  an argument of a type the call cannot take
    ├── DeviceError (ValueError)              unknown device, a backend that is not installed,
    │                                         or CuPy without a usable CUDA device
    ├── InvalidParamIdError (ValueError)      text (or an int) that is not a ParamId
    ├── InvalidUploadError (ValueError)       a safetensors file (an upload) that is malformed
    ├── AuthError (PermissionError)           the service refused the token (HTTP 401 or 403)
    ├── ClientRequestError                    the service answered another error, or none
    ├── IntegrationError                      a training framework's run that an integration
    │   │                                     cannot snapshot or resume exactly
    │   ├── UnsupportedSetupError (NotImplementedError)  FSDP, DeepSpeed, bf16 parameters, ...
    │   ├── ResumeStateError (ValueError)     a resume folder that is incomplete or does not
    │   │                                     match the run resuming from it
    │   └── DistributedSnapshotError (RuntimeError)  a collective snapshot or restore
    │                                         that failed on a rank, or whose ranks did not
    │                                         all arrive within the timeout
    └── RecorderError                         records, the store and the recorder
        ├── BackendMismatchError              record asked for on another backend
        ├── MissingGradientError (KeyError)   a gradient the caller needs is absent
        ├── DuplicateParamError (ValueError)  the same ParamId twice in one record
        ├── DtypeMismatchError (ValueError)
        ├── ShapeMismatchError (ValueError)
        ├── SizeMismatchError (ValueError)    byte count does not match dtype x shape
        ├── ParamIdMismatchError (KeyError)   record's ids are not the module's ids
        ├── ChecksumMismatchError (ValueError) a stored chunk fails its crc32c
        ├── FormatVersionError (ValueError)   written by an incompatible format version
        │   └── ManifestError                 a snapshot's manifest or array document is
        │                                     malformed, or the manifest fails its own
        │                                     checksum (its version is fine)
        ├── SnapshotNotFoundError (KeyError)
        ├── ShardedSnapshotError (ValueError)  a whole-snapshot read of a sharded snapshot
        │                                     that needs one rank's shard (pass rank=)
        ├── StoreKeyNotFoundError (KeyError)  no readable store key at that path
        ├── StoreNotFoundError (FileNotFoundError)  a read of a local store folder that does
        │                                           not exist
        ├── SnapshotBusyError                 a snapshot is in flight and the policy rejects
        ├── InvalidSnapshotIdError (ValueError)
        ├── InvalidStorePathError (ValueError)  a store path that could leave the readable keys
        ├── InvalidRangeError (ValueError)    a byte range outside a gradient or a store key
        ├── InvalidFieldError (ValueError)    a name, run, step, tags or metadata it cannot hold
        └── StoreUnavailableError (OSError)   the store cannot be reached or written
"""

from __future__ import annotations

#: How much of a caller's input a message echoes: longer input is cut, and its length said.
ECHO_LIMIT = 64


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters of ``value`` with an
    ellipsis and the full length when it is longer (an 8,000-character id is not echoed whole)."""
    text = repr(value)
    if len(text) <= limit + 2:
        return text
    length = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters"
    return f"{text[: limit + 1]}… ({length})"


class GradvaultError(Exception):
    """Root of every error gradvault raises."""

    def __str__(self) -> str:  # KeyError subclasses would otherwise quote the message
        return " ".join(str(arg) for arg in self.args) if self.args else ""


class AutogradError(GradvaultError, RuntimeError):
    """The autodiff engine was used in a way PyTorch would reject too."""


class InplaceModificationError(AutogradError):
    """A tensor saved for backward was modified in place before backward ran."""


class GradcheckError(AutogradError):
    """An analytic gradient disagrees with finite differences (``gradcheck``)."""


class ConflictingOptionsError(AutogradError, ValueError):
    """Options that contradict each other (``materialize_grads=True, allow_unused=False``)."""


class UnsupportedOptionError(AutogradError, NotImplementedError):
    """An option or combination of options that is not implemented (as in PyTorch)."""


class InvalidArgumentError(GradvaultError, ValueError):
    """An argument whose value the call cannot take (``on_busy="later"``, ``p=2.0``)."""


class InvalidArgumentTypeError(GradvaultError, TypeError):
    """An argument whose type the call cannot take (a NumPy array where a Tensor goes)."""


class DeviceError(GradvaultError, ValueError):
    """An unknown device string, or a device whose backend is not installed."""


class InvalidParamIdError(GradvaultError, ValueError):
    """Text that is not a ParamId (16 lowercase hex digits), or an int outside [0, 2**64)."""


class InvalidUploadError(GradvaultError, ValueError):
    """A safetensors file (an upload) that is malformed: the message says what is wrong."""


class AuthError(GradvaultError, PermissionError):
    """The service refused the request's token: missing, wrong, or without the scope (401/403).

    Raised by the client; ``status``, ``request`` and ``response`` say what was refused.
    """


class ClientRequestError(GradvaultError):
    """The service answered an error status the client has no narrower error for, or could
    not be reached (``status`` is then None).

    ``status``, ``request`` and ``response`` (None without one) and the server's ``detail``
    and ``error`` (its JSON error body; None when the body is not one) say what happened.
    """

    status: int | None = None
    detail: str | None = None
    error: str | None = None
    request: object = None
    response: object = None


class IntegrationError(GradvaultError):
    """A training framework's run that an integration cannot snapshot or resume exactly."""


class UnsupportedSetupError(IntegrationError, NotImplementedError):
    """A setup the integration refuses rather than resume inexactly (FSDP, DeepSpeed, ...)."""


class ResumeStateError(IntegrationError, ValueError):
    """A resume folder that is incomplete, unreadable or does not match the resuming run."""


class DistributedSnapshotError(IntegrationError, RuntimeError):
    """A collective snapshot or restore that did not complete on every rank of its group.

    A rank that failed (its message is quoted), or one that did not reach a step of the
    call within the timeout (dead, or stuck): every rank raises it, and nothing the call
    would have committed or restored is visible.
    """


class RecorderError(GradvaultError):
    """Records, the store and the recorder."""


class BackendMismatchError(RecorderError, ValueError):
    """A record was asked for on a backend other than the gradients' own."""


class MissingGradientError(RecorderError, KeyError):
    """A gradient that the caller needs is not there."""


class DuplicateParamError(RecorderError, ValueError):
    """The same ParamId appears twice in one record."""


class DtypeMismatchError(RecorderError, ValueError):
    """A gradient's dtype is not the one expected."""


class ShapeMismatchError(RecorderError, ValueError):
    """A gradient's shape is not the one expected."""


class SizeMismatchError(RecorderError, ValueError):
    """A gradient's byte count does not match its dtype and shape."""


class ParamIdMismatchError(RecorderError, KeyError):
    """The record's ParamIds are not the module's ParamIds."""


class ChecksumMismatchError(RecorderError, ValueError):
    """Stored bytes do not match their crc32c checksum."""


class FormatVersionError(RecorderError, ValueError):
    """Data written by a format version this release cannot read."""


class ManifestError(FormatVersionError):
    """A snapshot's manifest or array document is malformed, or the manifest fails its own
    checksum (edited or damaged since it was written), though its version is one this
    release reads. A FormatVersionError too, so that code catching that for any snapshot it
    cannot read still catches this; catch ManifestError to tell the two apart."""


class SnapshotNotFoundError(RecorderError, KeyError):
    """No committed snapshot has that id."""


class ShardedSnapshotError(RecorderError, ValueError):
    """A call that needs one snapshot's gradients met a sharded snapshot it cannot merge.

    The message names the snapshot, its world size and why (a ParamId in two shards, a
    streaming read that serves one shard at a time); passing ``rank=`` reads one shard.
    """


class StoreKeyNotFoundError(RecorderError, KeyError):
    """No key that the store's read-only view serves is at that path."""


class StoreNotFoundError(RecorderError, FileNotFoundError):
    """A read (``list``, ``info``, ...) of a local store folder that does not exist.

    Only a snapshot creates the folder: a read of a mistyped path says so instead of
    answering "no snapshots".
    """


class SnapshotBusyError(RecorderError):
    """A snapshot is in flight and the backpressure policy is to reject."""


class InvalidSnapshotIdError(RecorderError, ValueError):
    """A string that is not a well-formed snapshot id."""


class InvalidStorePathError(RecorderError, ValueError):
    """A store path refused before any I/O: traversal, hidden names, control characters."""


class InvalidRangeError(RecorderError, ValueError):
    """A byte range that is not within the gradient (or store key) it asks for."""


class InvalidFieldError(RecorderError, ValueError):
    """A gradient name, run, step, tags or metadata that a snapshot cannot hold (or read back)."""


class StoreUnavailableError(RecorderError, OSError):
    """The store cannot be reached, read or written."""


__all__ = [
    "AuthError",
    "AutogradError",
    "BackendMismatchError",
    "ChecksumMismatchError",
    "ClientRequestError",
    "ConflictingOptionsError",
    "DeviceError",
    "DistributedSnapshotError",
    "DtypeMismatchError",
    "DuplicateParamError",
    "FormatVersionError",
    "GradcheckError",
    "GradvaultError",
    "InplaceModificationError",
    "IntegrationError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidFieldError",
    "InvalidParamIdError",
    "InvalidRangeError",
    "InvalidSnapshotIdError",
    "InvalidStorePathError",
    "InvalidUploadError",
    "ManifestError",
    "MissingGradientError",
    "ParamIdMismatchError",
    "RecorderError",
    "ResumeStateError",
    "ShapeMismatchError",
    "SizeMismatchError",
    "SnapshotBusyError",
    "SnapshotNotFoundError",
    "StoreKeyNotFoundError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "UnsupportedOptionError",
    "UnsupportedSetupError",
]
