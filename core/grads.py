"""GradientsParams: gradients keyed by ParamId, with Burn's names, and their records.

Taking a record is a point-in-time capture done by copy-on-write: the record keeps the
gradient's current buffer and the gradient tensor is flagged, so the next in-place write
to it (accumulation, ``zero_``, an optimizer touching it) first moves it to a new buffer.
The trainer therefore waits for a number of flag updates that grows with the number of
parameters, never for a copy of their bytes (on the cpu; a cuda device is read to host).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import backend as array_backend
from .errors import (
    BackendMismatchError,
    DtypeMismatchError,
    DuplicateParamError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ParamIdMismatchError,
    ShapeMismatchError,
)
from .gradients import Gradients
from .param_id import ParamId, as_param_id
from .record import GradientRecordEntry, GradientsParamsRecord, paused_gc
from .record_rules import check_dtype, check_name
from .tensor import Tensor, wrap
from .torch_adapter import to_torch, torch_gradients

if TYPE_CHECKING:
    from .nn.module import Module


def _backend_name(spec: Any) -> str:
    """``"numpy"`` or ``"cupy"`` from a backend name, a device string or a Device."""
    if isinstance(spec, array_backend.Device):
        return spec.backend
    text = str(spec).lower()
    if text in ("numpy", "cupy"):
        return text
    try:
        return array_backend.device(text).backend
    except Exception:
        raise BackendMismatchError(
            f"unknown backend {spec!r}; expected 'numpy', 'cupy' or a device such as 'cpu'"
        ) from None


class GradientsCapture:
    """A point-in-time capture of GradientsParams: each gradient's frozen buffer, by id.

    Made by ``GradientsParams.capture()``; ``try_to_record``, ``to_record_async`` and the
    recorder all start from one. The buffers are still on their device: ``to_record``
    (blocking) or ``await to_record_async()`` (device reads in a thread) turns them into a
    GradientsParamsRecord of host arrays.
    """

    __slots__ = ("entries", "device")

    def __init__(self, entries: tuple[tuple[ParamId, str, Any], ...]) -> None:
        self.entries = entries
        """``(param_id, name, array)`` for each gradient, in registration order."""
        if all(type(array) is np.ndarray for _, _, array in entries):
            self.device = "cpu"  # the common case, without a device lookup per gradient
        else:
            devices = {str(array_backend.device_of(array)) for _, _, array in entries}
            self.device = ",".join(sorted(devices)) if devices - {"cpu"} else "cpu"
        """Where the arrays are: ``"cpu"``, or the sorted devices joined by commas."""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Total bytes of the captured gradients."""
        return sum(int(array.nbytes) for _, _, array in self.entries)

    def to_record(self) -> GradientsParamsRecord:
        """The capture as a record of host arrays (device reads done before it returns)."""
        return GradientsParamsRecord.from_checked_entries(
            [
                GradientRecordEntry.from_array(pid, name, array_backend.to_host(array))
                for pid, name, array in self.entries
            ],
            metadata={"device": self.device},
        )

    async def to_record_async(self) -> GradientsParamsRecord:
        """``to_record`` without blocking the event loop: device reads run in a thread."""
        if self.device == "cpu":  # host arrays: nothing to read, nothing to wait for
            return self.to_record()
        return await asyncio.to_thread(self.to_record)


class GradientsParams:
    """Gradients keyed by ParamId (Burn's ``GradientsParams``)."""

    def __init__(self) -> None:
        self._grads: dict[ParamId, Tensor] = {}
        self._names: dict[ParamId, str] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_grads(cls, grads: Gradients, module: Module) -> GradientsParams:
        """The gradients of ``module``'s params out of one backward pass; ``grads`` is consumed."""
        out = cls.from_module(grads, module)
        for leaf, _ in list(grads):
            grads.remove(leaf)
        return out

    @classmethod
    def from_module(cls, grads: Gradients, module: Module) -> GradientsParams:
        """Take (remove) the gradients of ``module``'s params out of ``grads``."""
        return cls.from_params(grads, module, None)

    @classmethod
    def from_params(
        cls, grads: Gradients, module: Module, params: Iterable[ParamId | str] | None
    ) -> GradientsParams:
        """Take (remove) the gradients of the listed ParamIds of ``module`` out of ``grads``."""
        wanted = None if params is None else {as_param_id(p) for p in params}
        out = cls()
        for name, param in module.named_parameters():
            if wanted is not None and param.id not in wanted:
                continue
            grad = grads.remove(param)
            if grad is not None:
                out.register(param.id, grad, name=name)
        return out

    @classmethod
    def from_module_grad(cls, module: Module) -> GradientsParams:
        """The ``.grad`` of every param of ``module`` (PyTorch-style accumulation), shared."""
        out = cls()
        for name, param in module.named_parameters():
            if param.grad is not None:
                out.register(param.id, param.grad, name=name)
        return out

    @classmethod
    def from_torch(cls, module: Any) -> GradientsParams:
        """The ``.grad`` of a ``torch.nn.Module``'s parameters, memory shared (torch_adapter)."""
        grads = cls()
        for param_id, tensor, name in torch_gradients(module):
            grads.register(param_id, tensor, name=name)
        return grads

    def to_torch(self, module: Any, *, match: str = "id") -> None:
        """Set a ``torch.nn.Module``'s ``.grad`` to these gradients, shared (torch_adapter)."""
        to_torch(module, self, match=match)

    # ------------------------------------------------------------------ container
    def _checked(
        self, param_id: ParamId | str, grad: Tensor | None, ndim: int | None
    ) -> Tensor | None:
        if grad is not None and ndim is not None and grad.ndim != ndim:
            pid = as_param_id(param_id)
            name = self._names.get(pid, "?")
            raise ShapeMismatchError(
                f"gradient for param {pid} ({name!r}) has {grad.ndim} dims (shape "
                f"{grad.shape}); the caller asked for {ndim}"
            )
        return grad

    def get(self, param_id: ParamId | str, ndim: int | None = None) -> Tensor | None:
        """The gradient for ``param_id`` or None; a wrong ``ndim`` raises."""
        pid = as_param_id(param_id)
        return self._checked(pid, self._grads.get(pid), ndim)

    def remove(self, param_id: ParamId | str, ndim: int | None = None) -> Tensor | None:
        """Take the gradient for ``param_id`` out, or None; a wrong ``ndim`` raises."""
        pid = as_param_id(param_id)
        self._checked(pid, self._grads.get(pid), ndim)
        self._names.pop(pid, None)
        return self._grads.pop(pid, None)

    def register(self, param_id: ParamId | str, tensor: Tensor, *, name: str | None = None) -> None:
        """Store ``tensor`` as the gradient of ``param_id``, replacing what was there.

        The name (module path) and the tensor's dtype must be ones a snapshot can hold
        (``record_rules``): InvalidFieldError or DtypeMismatchError otherwise.
        """
        if not isinstance(tensor, Tensor):
            raise InvalidArgumentTypeError(
                f"a gradient must be a Tensor; got {type(tensor).__name__}"
            )
        pid = as_param_id(param_id)
        # refused here, not when a snapshot is written or, worse, read back
        if name is not None:
            name = check_name(name, pid)
        check_dtype(tensor.dtype, pid, self._names.get(pid, "") if name is None else name)
        self._grads[pid] = tensor
        if name is not None:
            self._names[pid] = name
        else:
            self._names.setdefault(pid, "")

    def name(self, param_id: ParamId | str) -> str:
        """The module path recorded for ``param_id`` ("" when unknown)."""
        return self._names.get(as_param_id(param_id), "")

    def len(self) -> int:
        return len(self._grads)

    def __len__(self) -> int:
        return len(self._grads)

    def is_empty(self) -> bool:
        return not self._grads

    def __contains__(self, param_id: object) -> bool:
        try:
            return as_param_id(param_id) in self._grads  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False

    def __iter__(self) -> Iterator[ParamId]:
        return iter(list(self._grads))

    def items(self) -> Iterator[tuple[ParamId, Tensor]]:
        return iter(list(self._grads.items()))

    def to_device(self, device: array_backend.Device | str, module: Module) -> GradientsParams:
        """Move the gradients of ``module``'s params to ``device``; returns self."""
        dev = array_backend.device(device)
        for param in module.parameters():
            grad = self._grads.get(param.id)
            if grad is not None:
                self._grads[param.id] = grad.to(dev)
        return self

    def __repr__(self) -> str:
        lines = [f"GradientsParams({len(self)} gradients)"]
        for pid, grad in list(self._grads.items())[:20]:
            lines.append(
                f"  {pid} {self._names.get(pid, '')!r} {grad.dtype}{list(grad.shape)} "
                f"on {grad.device}"
            )
        if len(self) > 20:
            lines.append(f"  ... {len(self) - 20} more")
        return "\n".join(lines)

    # ------------------------------------------------------------------ records
    def _check_backend(self, backend: Any) -> None:
        if backend is None:
            return
        asked = _backend_name(backend)
        for pid, grad in self._grads.items():
            if grad.device.backend != asked:
                raise BackendMismatchError(
                    f"gradient for param {pid} ({self._names.get(pid, '')!r}) is on "
                    f"{grad.device} ({grad.device.backend}); the record was asked for on the "
                    f"{asked} backend"
                )

    def capture(self, backend: Any = None) -> GradientsCapture:
        """The gradients at this point in time, frozen by copy-on-write in O(number of them).

        Nothing done to the gradients afterwards changes what the capture holds. Only a
        gradient that has handed out an alias (a view, ``.data``, a NumPy array) is copied:
        its aliases could still write into the buffer. ``backend`` ("numpy", "cupy" or a
        device), when given, must be the one the gradients live on (BackendMismatchError).
        """
        self._check_backend(backend)
        names = self._names
        entries = tuple((pid, names.get(pid, ""), grad.lend()) for pid, grad in self._grads.items())
        return GradientsCapture(entries)

    def try_to_record(self, backend: Any = None) -> GradientsParamsRecord:
        """A record of host copies of every gradient, leaving this container as it was.

        Device reads are complete when it returns. ``backend`` ("numpy", "cupy" or a device)
        must be the one the gradients live on, or BackendMismatchError is raised.
        """
        return self.capture(backend).to_record()

    async def to_record_async(self, backend: Any = None) -> GradientsParamsRecord:
        """``try_to_record`` without blocking the event loop: device reads run in a thread.

        The capture (the point in time) happens before the first await.
        """
        return await self.capture(backend).to_record_async()

    @classmethod
    def from_record(
        cls,
        record: GradientsParamsRecord,
        device: array_backend.Device | str = "cpu",
        *,
        module: Module | None = None,
        match: str = "id",
        copy: bool = True,
    ) -> GradientsParams:
        """New gradients on ``device`` from ``record``; nothing else is summed into or cleared.

        Every entry's dtype, shape and byte count is validated. With ``module``, the record's
        ids must be the module's ids (load the model record first), or with ``match="name"``
        entries are mapped to the module's params by module path. ``copy=False`` lets the
        cpu tensors take over the record's buffers where they are writable (the record
        must not be used afterwards); the recorder's restore does this.
        """
        if match not in ("id", "name"):
            raise InvalidArgumentError(f"match must be 'id' or 'name'; got {match!r}")
        dev = array_backend.device(device)
        targets = _match_targets(record, module, match) if module is not None else {}
        out = cls()
        with paused_gc():
            out._fill(record, dev, targets, copy)
        return out

    def _fill(
        self,
        record: GradientsParamsRecord,
        dev: array_backend.Device,
        targets: dict[ParamId, tuple[ParamId, str]],
        copy: bool,
    ) -> None:
        grads, names = self._grads, self._names
        for entry in record:  # the record validated every entry when it was built
            array = _host_buffer(entry.array, copy)
            if dev.type != "cpu":
                array = array_backend.to_device(array, dev)
            pid, name = targets.get(entry.param_id, (entry.param_id, entry.name))
            if pid in grads:
                raise DuplicateParamError(f"two record entries map to param {pid} ({name!r})")
            grads[pid] = wrap(array)
            names[pid] = name


def _host_buffer(array: np.ndarray, copy: bool) -> np.ndarray:
    """A writable, native-order array with ``array``'s values (its own buffer when copying)."""
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "<" and not _LITTLE):
        return array.astype(array.dtype.newbyteorder("="))
    if not copy:
        try:
            array.flags.writeable = True  # works when the base buffer is writable
            return array
        except ValueError:
            pass
    return array.copy()


_LITTLE = np.little_endian


def _match_targets(
    record: GradientsParamsRecord, module: Module, match: str
) -> dict[ParamId, tuple[ParamId, str]]:
    """For each record entry, the module parameter (id, path) it restores onto."""
    params = list(module.named_parameters())
    by_id = {p.id: (p.id, name, p.shape, p.dtype) for name, p in params}
    by_name = {name: (p.id, name, p.shape, p.dtype) for name, p in params}
    targets: dict[ParamId, tuple[ParamId, str]] = {}
    for entry in record:
        target = by_id.get(entry.param_id) if match == "id" else by_name.get(entry.name)
        if target is None:
            hint = (
                (
                    "load the model record first (module.load_record) so the ids match, or "
                    "pass match='name'"
                )
                if match == "id"
                else "the module has no parameter of that name"
            )
            raise ParamIdMismatchError(
                f"record's gradient for param {entry.param_id} ({entry.name!r}) matches no "
                f"parameter of the module by {match}; {hint}"
            )
        if tuple(entry.shape) != tuple(target[2]):
            raise ShapeMismatchError(
                f"gradient for param {entry.param_id} ({entry.name!r}) has shape "
                f"{tuple(entry.shape)}; the module's parameter {target[1]!r} has "
                f"{tuple(target[2])}"
            )
        if np.dtype(entry.dtype) != target[3]:
            raise DtypeMismatchError(
                f"gradient for param {entry.param_id} ({entry.name!r}) has dtype "
                f"{entry.dtype}; the module's parameter {target[1]!r} has {target[3]}"
            )
        targets[entry.param_id] = target[:2]
    return targets
