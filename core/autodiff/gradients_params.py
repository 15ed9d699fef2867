"""GradientsParams: gradients keyed by ParamId, with Burn's names, and their records.

Taking a record is a point-in-time capture done by copy-on-write: the record keeps the
gradient's current buffer and the gradient tensor is flagged, so the next in-place write
to it (accumulation, ``zero_``, an optimizer touching it) first moves it to a new buffer.
The trainer therefore waits for a number of flag updates that grows with the number of
parameters, never for a copy of their bytes (on the cpu; on a cuda device ``to_record``
reads them to host, while the Recorder's commit streams them to the store through a ring
of pinned buffers).
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    BackendMismatchError,
    DtypeMismatchError,
    DuplicateParamError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ParamIdMismatchError,
    ShapeMismatchError,
)
from ..records.param_id import ParamId, as_param_id
from ..records.record import (
    GradientRecordEntry,
    GradientsParamsRecord,
    LazyArrays,
    RecordColumns,
    paused_gc,
    read_only_array,
)
from ..records.record_rules import DTYPE_NAMES, check_dtype, check_name
from . import backend as array_backend
from .gradients import Gradients
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


_DTYPE_OF = operator.attrgetter("dtype")
_NBYTES_OF = operator.attrgetter("nbytes")
_SHAPE_OF = operator.attrgetter("shape")
_lend = Tensor.lend


class _LentArrays(LazyArrays):
    """The host buffers a capture lent, as a record's arrays: read-only views of them,
    built all at once when the record is first read.

    The buffers are the gradients' own, flagged copy-on-write (or copies), so nothing can
    change them, their shapes or their dtypes after the capture.
    """

    __slots__ = ("_buffers",)

    def __init__(self, buffers: list[np.ndarray]) -> None:
        self._buffers = buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def build(self) -> list[np.ndarray]:
        return list(map(read_only_array, self._buffers))

    @property
    def nbytes(self) -> int:
        return sum(map(_NBYTES_OF, self._buffers))

    def shapes(self, count: int) -> list[tuple[int, ...]]:
        return list(map(_SHAPE_OF, self._buffers[:count]))


class GradientsCapture:
    """A point-in-time capture of GradientsParams: each gradient's frozen buffer, by id.

    Made by ``GradientsParams.capture()``; ``try_to_record``, ``to_record_async`` and the
    recorder all start from one. The buffers are still on their device: ``to_record``
    (blocking) or ``await to_record_async()`` (device reads in a thread) turns them into a
    GradientsParamsRecord of host arrays.
    """

    __slots__ = ("_ids", "_names", "_buffers", "_unique", "_entries", "device")

    def __init__(self, entries: tuple[tuple[ParamId, str, Any], ...]) -> None:
        self._entries: tuple[tuple[ParamId, str, Any], ...] | None = tuple(entries)
        self._ids = [pid for pid, _, _ in self._entries]
        self._names = [name for _, name, _ in self._entries]
        self._buffers = [array for _, _, array in self._entries]
        self._unique = False  # ids given by a caller: the record checks them
        self._set_device()

    @classmethod
    def _of(cls, ids: list[ParamId], names: list[str], tensors: list[Tensor]) -> GradientsCapture:
        """The capture of ``tensors`` under ``ids`` (unique: a dict's keys) and ``names``."""
        capture = cls.__new__(cls)
        capture._entries = None
        capture._ids, capture._names, capture._unique = ids, names, True
        capture._buffers = list(map(_lend, tensors))  # one flag per gradient (copy-on-write)
        capture._set_device()
        return capture

    def _set_device(self) -> None:
        if set(map(type, self._buffers)) <= {np.ndarray}:
            self.device = "cpu"  # the common case, without a device lookup per gradient
        else:
            devices = {str(array_backend.device_of(array)) for array in self._buffers}
            self.device = ",".join(sorted(devices)) if devices - {"cpu"} else "cpu"
        """Where the arrays are: ``"cpu"``, or the sorted devices joined by commas."""

    @property
    def entries(self) -> tuple[tuple[ParamId, str, Any], ...]:
        """``(param_id, name, array)`` for each gradient, in registration order."""
        if self._entries is None:
            self._entries = tuple(zip(self._ids, self._names, self._buffers, strict=True))
        return self._entries

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Total bytes of the captured gradients."""
        return sum(map(_NBYTES_OF, self._buffers))

    def to_record(self) -> GradientsParamsRecord:
        """The capture as a record of host arrays (device reads done before it returns)."""
        metadata = {"device": self.device}
        if self._unique and self.device == "cpu":
            kinds = set(map(_DTYPE_OF, self._buffers))
            if kinds <= _RECORD_DTYPES:  # else each entry is checked, and the error raised
                # held by column: no entry, nor read-only view, is built until one is read
                if len(kinds) == 1:
                    dtypes = [DTYPE_NAMES[kinds.pop()]] * len(self._buffers)
                else:
                    dtypes = [DTYPE_NAMES[dtype] for dtype in map(_DTYPE_OF, self._buffers)]
                return GradientsParamsRecord.from_columns(
                    self._ids,
                    self._names,
                    dtypes,
                    _LentArrays(self._buffers),
                    metadata=metadata,
                    unique_ids=True,
                )
        return GradientsParamsRecord.from_checked_entries(
            [
                GradientRecordEntry.from_array(pid, name, array_backend.to_host(array))
                for pid, name, array in zip(self._ids, self._names, self._buffers, strict=True)
            ],
            metadata=metadata,
        )

    async def to_record_async(self) -> GradientsParamsRecord:
        """``to_record`` without blocking the event loop: device reads run in a thread."""
        if self.device == "cpu":  # host arrays: nothing to read, nothing to wait for
            return self.to_record()
        return await asyncio.to_thread(self.to_record)


#: dtypes a record holds (from_array names the others in its error)
_RECORD_DTYPES = frozenset(DTYPE_NAMES)


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
            return as_param_id(param_id) in self._grads
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
        ids, names = list(self._grads), self._names
        # register and remove keep both dicts in one order; compared by identity, at C speed
        name_list = (
            list(names.values()) if list(names) == ids else [names.get(pid, "") for pid in ids]
        )
        return GradientsCapture._of(ids, name_list, list(self._grads.values()))

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
        if not targets and not self._grads:  # by column: no entry object is built
            self._fill_columns(record.columns(), dev, copy)
            return
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

    def _fill_columns(self, columns: RecordColumns, dev: array_backend.Device, copy: bool) -> None:
        """``_fill`` of an empty container, column by column (a record's ids are unique)."""
        arrays: list[Any] = list(columns.arrays)
        if not _LITTLE:  # a record's arrays are little-endian: native here only
            arrays = [_host_buffer(array, copy) for array in arrays]
        else:
            arrays = [array.copy() for array in arrays] if copy else list(map(_taken, arrays))
        if dev.type != "cpu":
            arrays = [array_backend.to_device(array, dev) for array in arrays]
        self._grads = dict(zip(columns.param_ids, map(wrap, arrays), strict=True))
        self._names = dict(zip(columns.param_ids, columns.names, strict=True))


def _foreign_order(dtype: np.dtype) -> bool:
    """Whether ``dtype``'s byte order is not this machine's."""
    return dtype.byteorder == ">" or (dtype.byteorder == "<" and not _LITTLE)


def _taken(array: np.ndarray) -> np.ndarray:
    """``array`` made writable where its base buffer is (a copy where it is not)."""
    try:
        array.flags.writeable = True
    except ValueError:
        return array.copy()
    return array


def _host_buffer(array: np.ndarray, copy: bool) -> np.ndarray:
    """A writable, native-order array with ``array``'s values (its own buffer when copying)."""
    if _foreign_order(array.dtype):
        return array.astype(array.dtype.newbyteorder("="))
    return array.copy() if copy else _taken(array)


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
