"""Tensor: an array on a device with PyTorch's autograd semantics, and its factories."""

from __future__ import annotations

import builtins
import contextlib
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AutogradError, InvalidArgumentError, InvalidArgumentTypeError
from ..records.dtypes import bfloat16, check_device, is_floating
from . import backend
from .backend import Device
from .grad_mode import is_inference_mode_enabled, is_recording, no_grad
from .gradients import Gradients
from .graph import AccumulateGrad, Node, RemovableHandle
from .op_table import op_table

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")

DEFAULT_FLOAT = float32

DTypeLike = np.dtype | str | type | None
DeviceLike = Device | str | None


def as_dtype(dtype: DTypeLike) -> np.dtype | None:
    """``dtype`` as a NumPy dtype (None stays None); Python ``float`` means float32."""
    if dtype is None:
        return None
    if dtype is float:
        return DEFAULT_FLOAT
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise InvalidArgumentTypeError(f"unknown dtype {dtype!r}") from exc


def array_from(data: Any, dtype: np.dtype | None, device: DeviceLike) -> Any:
    """A new array holding a copy of ``data`` as ``dtype`` on ``device`` (for ``tensor()``).

    Lists of floats become float32 and of ints int64; a NumPy array keeps its dtype; a
    tensor or a device array stays on its device unless ``device`` says otherwise.
    """
    if isinstance(data, Tensor):
        array = data._data.copy()
        if device is None:
            device = data.device
    elif isinstance(data, np.ndarray):
        array = data.copy()
    elif hasattr(data, "__cuda_array_interface__"):
        array = data.copy()
        if device is None:
            device = backend.device_of(data)
    else:
        array = np.array(data)
        if dtype is None and array.dtype == np.float64 and not isinstance(data, np.generic):
            array = array.astype(DEFAULT_FLOAT)
        elif dtype is None and array.dtype.kind in "iu":
            array = array.astype(int64)
    if array.dtype.kind not in "iub" and not is_floating(array.dtype):
        raise InvalidArgumentTypeError(f"can't make a tensor from data of dtype {array.dtype}")
    dev = backend.device(device)
    check_device(array.dtype if dtype is None else dtype, dev)  # CuPy has no bfloat16
    if dtype is not None and array.dtype != dtype:
        array = array.astype(dtype)
    if dev.type != "cpu":
        array = backend.to_device(array, dev)
    return array


class Storage:
    """What a tensor shares with its views: the version counter and the aliases of its buffer.

    The one owner of these facts; only Tensor's copy-on-write and in-place methods read or
    change them. ``version`` counts in-place writes (``last_op`` names the latest) so that
    autograd can refuse a tensor changed after it was saved; ``aliased`` is set once a
    view or a raw array of the buffer has been handed out (see the copy-on-write section
    of Tensor); ``views_in_graph`` once such a view requires grad.
    """

    __slots__ = ("version", "last_op", "aliased", "views_in_graph")

    def __init__(self) -> None:
        self.version = 0
        self.last_op: str | None = None
        self.aliased = False
        self.views_in_graph = False

    def bump(self, op: str) -> None:
        """Count one in-place write, done by ``op``."""
        self.version += 1
        self.last_op = op


class Tensor:
    """An n-dimensional array on ``cpu`` or ``cuda:N`` that records operations for autograd."""

    __slots__ = (
        "_data",
        "_requires_grad",
        "_grad",
        "grad_fn",
        "_storage",
        "_hooks",
        "_inference",
        "_base",
        "_cow",
        "_accumulator",
        "__weakref__",
    )
    __array_priority__ = 1000  # NumPy defers ``array * tensor`` to Tensor.__rmul__

    def __init__(
        self,
        data: Any,
        *,
        dtype: DTypeLike = None,
        device: DeviceLike = None,
        requires_grad: bool = False,
    ) -> None:
        self._set_up(array_from(data, as_dtype(dtype), device), False, None)
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _make(cls, data: Any, requires_grad: bool = False, grad_fn: Node | None = None) -> Tensor:
        """Wrap an array without copying (internal)."""
        t = object.__new__(cls)
        t._set_up(data, requires_grad, grad_fn)
        return t

    def _set_up(self, data: Any, requires_grad: bool, grad_fn: Node | None) -> None:
        self._data = data
        self._requires_grad = requires_grad
        self._grad: Tensor | None = None
        self.grad_fn = grad_fn
        self._storage = Storage()  # shared with views
        # RemovableHandle id -> hook (a leaf's; a non-leaf's are on its node)
        self._hooks: dict[int, Callable[[Tensor], Tensor | None]] = {}
        self._inference = is_inference_mode_enabled()
        self._base: Tensor | None = None
        self._cow = False
        self._accumulator: AccumulateGrad | None = None

    @classmethod
    def _make_shared(cls, data: Any) -> Tensor:
        """Wrap an array that others can write too (internal): records of it copy its bytes."""
        t = cls._make(data)
        t._storage.aliased = True
        return t

    # ------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension."""
        return tuple(self._data.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        """``shape``, or the size of one dimension."""
        return self.shape if dim is None else self.shape[dim]

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    def numel(self) -> int:
        return int(self._data.size)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def device(self) -> Device:
        return backend.device_of(self._data)

    @property
    def is_leaf(self) -> bool:
        """True for tensors made by the user and for tensors that do not require grad."""
        return self.grad_fn is None

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` on a leaf (in place) and return it."""
        if self.grad_fn is not None and not requires_grad:
            raise AutogradError(
                "you can only change requires_grad flags of leaf tensors; use detach() to get "
                "a tensor that does not require grad"
            )
        if requires_grad and not is_floating(self.dtype):
            raise AutogradError(
                f"only tensors of floating point dtype can require gradients; got {self.dtype}"
            )
        if requires_grad and self._inference and not is_inference_mode_enabled():
            raise AutogradError(
                "setting requires_grad=True on an inference tensor outside inference_mode is "
                "not allowed; clone it outside inference_mode first"
            )
        self._requires_grad = bool(requires_grad) or self.grad_fn is not None
        return self

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient: None until a backward pass reaches this tensor."""
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise InvalidArgumentTypeError(
                    f"grad must be a Tensor or None; got {type(value).__name__}"
                )
            if value is self:
                raise AutogradError("a tensor cannot be assigned as its own grad")
            for what, found, expected in (
                ("shape", value.shape, self.shape),
                ("dtype", value.dtype, self.dtype),
                ("device", value.device, self.device),
            ):
                if found != expected:
                    raise AutogradError(
                        f"assigned grad has {what} {found}; the tensor has {what} {expected}"
                    )
        self._grad = value

    @property
    def data(self) -> Tensor:
        """A tensor on this one's buffer, outside the graph, with a version counter of its own.

        Writes through it are not seen by autograd's in-place checks: that is what ``.data``
        is for (as in PyTorch); ``detach()`` is the checked alias.
        """
        return self._alias(share_version=False)

    @data.setter
    def data(self, value: Tensor) -> None:
        """Make this tensor read and write ``value``'s buffer; its graph and flags stay.

        As in PyTorch the shape, dtype and device may change, but a tensor that requires
        grad only takes floating data.
        """
        if not isinstance(value, Tensor):
            raise InvalidArgumentTypeError(f"data must be a Tensor; got {type(value).__name__}")
        if self.requires_grad and not is_floating(value.dtype):
            raise AutogradError(
                f"data of a tensor that requires grad must be floating point; got {value.dtype}"
            )
        self._take_buffer(value)

    @property
    def version(self) -> int:
        """In-place writes to this tensor's storage so far (its views share the count)."""
        return self._storage.version

    @property
    def _version(self) -> int:
        """PyTorch's spelling of ``version`` (``tensor._version``), for code written for it."""
        return self._storage.version

    @property
    def last_inplace_op(self) -> str | None:
        """The in-place op that last wrote this tensor's storage (None if none did)."""
        return self._storage.last_op

    def is_inference(self) -> bool:
        """Whether this tensor was made under ``inference_mode`` (or is a view of one)."""
        return self._inference

    @property
    def grad_hooks(self) -> dict[int, Callable[[Tensor], Tensor | None]]:
        """A leaf's hooks from ``register_hook``, by handle id (a non-leaf's are on its node)."""
        return self._hooks

    # ------------------------------------------------------------------ graph helpers
    def detach(self) -> Tensor:
        """A tensor sharing the storage and version counter, outside the graph."""
        return self._alias(share_version=True)

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place (not a view: use ``detach()`` there)."""
        if self._base is not None:
            raise AutogradError(
                f"can't detach a view in place (shape {self.shape}, a view of a tensor of shape "
                f"{self._base.shape}); use detach() instead"
            )
        self.grad_fn = None
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Populate ``.grad`` of this non-leaf tensor during backward."""
        if not self.requires_grad:
            raise AutogradError("can't retain_grad on a tensor that has requires_grad=False")
        if self.grad_fn is not None:
            self.grad_fn.retained = weakref.ref(self)

    @property
    def retains_grad(self) -> bool:
        return self.grad_fn is not None and self.grad_fn.retained is not None

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """Call ``hook(grad)`` when this tensor's gradient is computed; it may return a new one.

        A returned gradient must have the same shape, dtype and device. Returns a handle
        whose ``remove()`` unregisters the hook.
        """
        if not self.requires_grad:
            raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
        hooks = self._hooks if self.grad_fn is None else self.grad_fn.tensor_hooks
        return RemovableHandle(hooks, hook)

    def backward(
        self,
        gradient: Tensor | None = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Sequence[Tensor] | Tensor | None = None,
    ) -> Gradients:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``; return this pass's gradients.

        The returned ``Gradients`` maps each leaf reached to the gradient of this pass alone
        (Burn's ``B::Gradients``); ``GradientsParams.from_grads`` consumes it.
        """
        return op_table.backward(self, gradient, retain_graph, create_graph, inputs)

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (shares memory on the cpu)."""
        if self.requires_grad:
            raise AutogradError(
                "can't call numpy() on a tensor that requires grad; use tensor.detach().numpy()"
            )
        if self.device.type != "cpu":
            return backend.to_host(self._data)  # a copy: nothing to keep apart
        return self._alias_array()

    def __dlpack__(self, **options: Any) -> Any:
        """The buffer itself as a DLPack capsule (``torch.from_dlpack(t)`` shares memory)."""
        if self.requires_grad:
            raise AutogradError(
                "can't export a tensor that requires grad; use tensor.detach() first"
            )
        return self._alias_array().__dlpack__(**options)

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack (device type, index) of the buffer."""
        return self._data.__dlpack_device__()

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise InvalidArgumentError(
                f"only one-element tensors can be converted; shape is {self.shape}"
            )
        return backend.to_host(self._data).reshape(()).item()

    def tolist(self) -> Any:
        return backend.to_host(self._data).tolist()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The data for ``np.asarray(tensor)``: on the cpu the buffer itself, as ``numpy()``."""
        if self.device.type != "cpu":
            host = backend.to_host(self._data)  # a copy already
            return host if dtype is None else host.astype(dtype, copy=False)
        converts = dtype is not None and np.dtype(dtype) != self.dtype
        if copy or converts:
            if copy is False:
                raise InvalidArgumentError(
                    f"a {self.dtype} tensor cannot be read as {dtype} without a copy"
                )
            return np.array(self._data, dtype=dtype, copy=True)
        return self._alias_array()

    def to(self, device: DeviceLike | DTypeLike = None, dtype: DTypeLike = None) -> Tensor:
        """This tensor on ``device`` and/or as ``dtype``; itself when nothing changes."""
        if device is not None and not isinstance(device, Device | str):
            device, dtype = None, device
        if isinstance(device, str) and device not in ("cpu",) and not device.startswith("cuda"):
            device, dtype = None, device
        out = self
        if dtype is not None and as_dtype(dtype) != self.dtype:
            check_device(as_dtype(dtype), self.device)  # CuPy has no bfloat16
            out = op_table.to_dtype(out, as_dtype(dtype))
        if device is not None and backend.device(device) != self.device:
            out = op_table.to_device(out, backend.device(device))
        return out

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def cuda(self, index: int = 0) -> Tensor:
        return self.to(f"cuda:{index}")

    def float(self) -> Tensor:
        return self.to(dtype=float32)

    def double(self) -> Tensor:
        return self.to(dtype=float64)

    def half(self) -> Tensor:
        return self.to(dtype=float16)

    def bfloat16(self) -> Tensor:
        return self.to(dtype=bfloat16)

    def long(self) -> Tensor:
        return self.to(dtype=int64)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise InvalidArgumentTypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(
                f"boolean value of a tensor with {self.numel()} elements is ambiguous"
            )
        return bool(self.item())

    # ``builtins.float``: inside the class, ``float`` is the method ``Tensor.float``
    def __float__(self) -> builtins.float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise InvalidArgumentTypeError(
                "only integer tensors of a single element can be an index"
            )
        return int(self.item())

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        body = np.array2string(backend.to_host(self._data), separator=", ", precision=4)
        extra = []
        if self.device.type != "cpu":
            extra.append(f"device='{self.device}'")
        if self.dtype != float32 and self.dtype != int64:
            extra.append(f"dtype={self.dtype}")
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{self.grad_fn.name}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        return "tensor(" + ", ".join([body, *extra]) + ")"

    # ------------------------------------------------------------------ ops as methods
    # Each op's registration (``@register_op(methods=...)`` in ``core/autodiff/ops``) makes
    # the op's function a method here: ``t.exp()`` is ``exp(t)``, ``t + u`` is ``add(t, u)``.
    # Type checkers see them declared in the block below, which never runs: it is written
    # from the op table (``python scripts/op_methods.py``), and a test checks it against the
    # table. Only the methods built from several ops, or from an op with other arguments,
    # are written out after it.
    if TYPE_CHECKING:  # the op methods, written by scripts/op_methods.py

        def abs(self) -> Tensor: ...
        def add(self, other: Any) -> Tensor: ...
        def __add__(self, other: Any) -> Tensor: ...
        def __radd__(self, other: Any) -> Tensor: ...
        def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor: ...
        def clamp(self, min: Any = None, max: Any = None) -> Tensor: ...
        def clip(self, min: Any = None, max: Any = None) -> Tensor: ...
        def clone(self) -> Tensor: ...
        def contiguous(self) -> Tensor: ...
        def div(self, other: Any) -> Tensor: ...
        def __truediv__(self, other: Any) -> Tensor: ...
        def __rtruediv__(self, other: Any) -> Tensor: ...
        def __eq__(self, b: Any) -> Tensor: ...  # type: ignore[override]
        def erf(self) -> Tensor: ...
        def exp(self) -> Tensor: ...
        def expand(self, *shape: Any) -> Tensor: ...
        def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor: ...
        def __getitem__(self, index: Any) -> Tensor: ...
        def __gt__(self, b: Any) -> Tensor: ...
        def __ge__(self, b: Any) -> Tensor: ...
        def __lt__(self, b: Any) -> Tensor: ...
        def __le__(self, b: Any) -> Tensor: ...
        def log(self) -> Tensor: ...
        def log_softmax(self, dim: int) -> Tensor: ...
        def __and__(self, b: Any) -> Tensor: ...
        def __invert__(self) -> Tensor: ...
        def __or__(self, b: Any) -> Tensor: ...
        def matmul(self, other: Tensor) -> Tensor: ...
        def __matmul__(self, other: Tensor) -> Tensor: ...
        def __rmatmul__(self, other: Tensor) -> Tensor: ...
        def max(self, dim: int | None = None, keepdim: bool = False) -> Any: ...
        def mean(self, dim: Any = None, keepdim: bool = False) -> Tensor: ...
        def min(self, dim: int | None = None, keepdim: bool = False) -> Any: ...
        def mul(self, other: Any) -> Tensor: ...
        def __mul__(self, other: Any) -> Tensor: ...
        def __rmul__(self, other: Any) -> Tensor: ...
        def neg(self) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __ne__(self, b: Any) -> Tensor: ...  # type: ignore[override]
        def permute(self, *dims: Any) -> Tensor: ...
        def pow(self, exponent: Any) -> Tensor: ...
        def __pow__(self, exponent: Any) -> Tensor: ...
        def __rpow__(self, other: Any) -> Tensor: ...
        def relu(self) -> Tensor: ...
        def reshape(self, *shape: Any) -> Tensor: ...
        def view(self, *shape: Any) -> Tensor: ...
        def sigmoid(self) -> Tensor: ...
        def softmax(self, dim: int) -> Tensor: ...
        def sqrt(self) -> Tensor: ...
        def squeeze(self, dim: int | None = None) -> Tensor: ...
        def std(
            self,
            dim: Any = None,
            *,
            correction: int = 1,
            unbiased: bool | None = None,
            keepdim: bool = False,
        ) -> Tensor: ...
        def sub(self, other: Any) -> Tensor: ...
        def __sub__(self, other: Any) -> Tensor: ...
        def __rsub__(self, other: Any) -> Tensor: ...
        def sum(self, dim: Any = None, keepdim: bool = False) -> Tensor: ...
        def tanh(self) -> Tensor: ...
        def transpose(self, dim0: int, dim1: int) -> Tensor: ...
        def unsqueeze(self, dim: int) -> Tensor: ...
        def var(
            self,
            dim: Any = None,
            *,
            correction: int = 1,
            unbiased: bool | None = None,
            keepdim: bool = False,
        ) -> Tensor: ...

        # (end of the op methods written by scripts/op_methods.py)

    def square(self) -> Tensor:
        return op_table.mul(self, self)

    def view_as(self, other: Tensor) -> Tensor:
        return op_table.reshape(self, other.shape)

    @property
    def T(self) -> Tensor:
        """The dims reversed (a view)."""
        return op_table.permute(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:
        """The last two dims swapped (a view)."""
        return op_table.transpose(self, -1, -2)

    def expand_as(self, other: Tensor) -> Tensor:
        return op_table.expand(self, other.shape)

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    # ------------------------------------------------------------------ copy-on-write
    # A snapshot, or another tensor, may hold this tensor's buffer instead of a copy. Two
    # facts keep later writes away from such a holder, and only these methods touch them:
    #   _cow              the buffer is held elsewhere too: the next write through this
    #                     tensor, or the next alias of it handed out, first moves this tensor
    #                     to a buffer of its own (unshare_);
    #   _storage.aliased  a view, a ``.data``/``detach()`` alias or a raw array (numpy(),
    #                     np.asarray) of the buffer was handed out: those write without
    #                     passing through here, so a new holder gets a copy (lend).
    # Holding costs a flag per tensor, not a copy of its bytes, unless it was aliased.
    # Copies keep the strides' order (order="K"): a gradient keeps the layout it was given.
    def unshare_(self) -> None:
        """Give this tensor its own buffer if a snapshot or another tensor still reads it.

        Called before any write and before a view or alias of the buffer is handed out, so
        that neither can reach the buffer a snapshot holds (copy-on-write).
        """
        if self._cow:
            self._data = backend.copy(self._data)  # page-aligned when large, on the host
            self._cow = False

    def _alias_array(self) -> Any:
        """The buffer itself, for a caller who may write through it (``numpy()``, ``__array__``)."""
        self.unshare_()
        self._storage.aliased = True
        return self._data

    def _alias(self, *, share_version: bool) -> Tensor:
        """A tensor on this buffer, outside the graph and not a view (it has no ``_base``).

        ``detach()`` shares the version counter; ``.data`` (``share_version=False``) does not.
        """
        self.unshare_()
        self._storage.aliased = True
        out = Tensor._make(self._data)
        if share_version:
            out._storage = self._storage
        else:
            out._storage.aliased = True
        out._inference = self._inference
        return out

    def track_versions_of(self, source: Tensor) -> None:
        """Make this tensor, computed from ``source``, share its version counter.

        For a stand-in (bfloat16's float32 widening, core/autodiff/bfloat16.py): saving it for
        backward then still catches a later in-place change of ``source``; it is an
        inference tensor when ``source`` is one.
        """
        self._storage = source._storage
        self._inference = source._inference

    def _take_buffer(self, source: Tensor) -> None:
        """``self.data = source``: from now on this tensor shares ``source``'s buffer.

        The buffer it had stays with whatever else holds it (a snapshot, views); the two
        tensors keep their own version counters, and both count as aliased.
        """
        source.unshare_()
        source._storage.aliased = True
        self._data = source._data
        self._cow = False
        self._storage.aliased = True

    def adopt_view(self, view: Tensor) -> None:
        """Make ``view`` (whose array shares this tensor's buffer) a view of this tensor.

        They share the version counter; the buffer counts as aliased from now on.
        """
        view._storage = self._storage
        view._base = self if self._base is None else self._base
        view._inference = self._inference  # a view of an inference tensor is one too
        self._storage.aliased = True
        if view.requires_grad:
            self._storage.views_in_graph = True

    def lend(self) -> Any:
        """This tensor's values as a buffer that nothing done to this tensor later changes.

        The buffer itself, flagged copy-on-write, when only this tensor can write to it; a
        copy when some alias, a base or a broadcast could (then no flag could protect it).
        """
        data = self._data
        if (
            self._storage.aliased
            or self._base is not None
            # a broadcast of another buffer (an array that owns its buffer is no broadcast)
            or (data.base is not None and not getattr(data.flags, "writeable", True))
        ):
            return data.copy(order="K")
        self._cow = True
        return data

    def twin(self) -> Tensor:
        """A new tensor with this one's values, sharing the buffer until either is written."""
        data = self.lend()
        twin = Tensor._make(data)
        twin._cow = data is self._data
        return twin

    def accumulate_(self, grad: Tensor) -> None:
        """``self += grad`` for gradient accumulation, honouring copy-on-write.

        A shared buffer is not copied first: the sum goes straight into a new one (one pass
        over the bytes, as an in-place add), keeping this tensor's dtype.
        """
        array = grad._data
        if self._cow:
            data = self._data
            total = backend.empty_like(data)  # page-aligned when large, on the host
            backend.xp_of(data).add(data, array, out=total)
            self._data = total
            self._cow = False
        else:
            self._data += array
        self._bump("accumulate_grad")

    # ------------------------------------------------------------------ in-place machinery
    def _prepare_write(self, op: str) -> None:
        if self._inference and not is_inference_mode_enabled():
            raise AutogradError(
                f"in-place update ({op}) of an inference tensor outside inference_mode is not "
                "allowed"
            )
        self.unshare_()

    def _bump(self, op: str) -> None:
        self._storage.bump(op)

    @contextlib.contextmanager
    def writable(self, op: str) -> Iterator[Any]:
        """The buffer, to be written in place by ``op`` (an optimizer's update), outside the graph.

        Copy-on-write first gives this tensor a buffer of its own if a snapshot holds it;
        the version counter counts the write when the block ends.
        """
        self._prepare_write(op)
        yield self._data
        self._bump(op)

    def set_values_(self, op: str, array: Any) -> None:
        """Replace the values with ``array`` (same shape and dtype, taken as it is), in place.

        For ``op`` (``load_record``) outside the graph; counted by the version counter.
        """
        self._prepare_write(op)
        self._data = array
        self._bump(op)

    def move_to_(self, device: DeviceLike) -> None:
        """Move this tensor, and its ``.grad``, to ``device`` in place (``Module.to``)."""
        dev = backend.device(device)
        self._data = backend.to_device(self._data, dev)
        if self._grad is not None:
            self._grad = self._grad.to(dev)

    def host_copy(self) -> np.ndarray:
        """A NumPy array with this tensor's values and a buffer of its own (never an alias)."""
        host = backend.to_host(self._data)
        return host.copy() if host is self._data else host

    def init_leaf_from(self, source: Tensor) -> None:
        """Make this new tensor (a Tensor subclass being built) a leaf on ``source``'s buffer.

        For ``Param``: it takes ``source``'s buffer, storage and flags, without graph,
        gradient or hooks, as a tensor of its own class.
        """
        for name in Tensor.__slots__[:-1]:
            setattr(self, name, getattr(source, name))
        self.grad_fn = None
        self._grad = None
        self._hooks = {}
        self._accumulator = None
        self._requires_grad = False

    def _inplace(
        self, op: str, out_of_place: Callable[[Tensor], Tensor], others: Sequence[Any] = ()
    ) -> Tensor:
        """Apply ``out_of_place`` and write its result into this tensor's storage."""
        recording = is_recording() and (
            self.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in others)
        )
        if recording:
            if self.grad_fn is None and self.requires_grad:
                raise AutogradError(
                    f"a leaf tensor that requires grad is being used in an in-place operation "
                    f"({op}); do it under no_grad() or on a clone"
                )
            if self._base is not None and self._base.requires_grad:
                raise AutogradError(
                    f"in-place operation ({op}) on a view of a tensor that requires grad is "
                    "not supported; use the out-of-place op"
                )
            if self._storage.views_in_graph:
                raise AutogradError(
                    f"in-place operation ({op}) on a tensor whose views are part of the "
                    "autograd graph is not supported (their gradients would be wrong); use "
                    "the out-of-place op"
                )
            previous = Tensor._make(self._data.copy(), self.requires_grad, self.grad_fn)
            result = out_of_place(previous)
            self._prepare_write(op)
            self._data[...] = result._data
            old_node, new_node = self.grad_fn, result.grad_fn
            self.grad_fn = new_node
            if (
                old_node is not None
                and new_node is not None
                and old_node.retained is not None
                and old_node.retained() is self
            ):
                new_node.retained = old_node.retained  # retain_grad follows the tensor
            self._requires_grad = True
        else:
            with no_grad():
                result = out_of_place(self)
            self._prepare_write(op)
            self._data[...] = result._data
        self._bump(op)
        return self

    def add_(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        return self._inplace(
            "add_", lambda s: s + (other * alpha if alpha != 1 else other), (other,)
        )

    def sub_(self, other: Any, *, alpha: builtins.float = 1) -> Tensor:
        return self._inplace(
            "sub_", lambda s: s - (other * alpha if alpha != 1 else other), (other,)
        )

    def mul_(self, other: Any) -> Tensor:
        return self._inplace("mul_", lambda s: s * other, (other,))

    def div_(self, other: Any) -> Tensor:
        return self._inplace("div_", lambda s: s / other, (other,))

    def pow_(self, exponent: Any) -> Tensor:
        return self._inplace("pow_", lambda s: s**exponent, (exponent,))

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:
        return self._inplace("clamp_", lambda s: s.clamp(min, max))

    def zero_(self) -> Tensor:
        return self._fill("zero_", 0)

    def fill_(self, value: Any) -> Tensor:
        return self._fill("fill_", value)

    def _fill(self, op: str, value: Any) -> Tensor:
        if isinstance(value, Tensor) or (is_recording() and self.requires_grad):
            return self._inplace(op, lambda s: s * 0 + value, (value,))
        self._prepare_write(op)
        self._data[...] = value
        self._bump(op)
        return self

    def copy_(self, src: Any) -> Tensor:
        if not isinstance(src, Tensor):
            src = Tensor(src, dtype=self.dtype, device=self.device)
        src = src.to(self.device)
        return self._inplace("copy_", lambda s: (s * 0 + src).to(dtype=self.dtype), (src,))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._inplace("__setitem__", lambda s: op_table.index_put(s, index, value), (value,))

    def __iadd__(self, other: Any) -> Tensor:
        return self.add_(other)

    def __isub__(self, other: Any) -> Tensor:
        return self.sub_(other)

    def __imul__(self, other: Any) -> Tensor:
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> Tensor:
        return self.div_(other)


op_table.attach(Tensor)  # the ops' registrations add their methods (core/autodiff/op_table.py)

#: The array a tensor reads, for the ops' forward rules and the engine. Read it, never
#: write through it or keep a view of it: views go through ``Tensor.adopt_view``, writes
#: through the in-place methods, so copy-on-write and the version counter see them.
array_of: Callable[[Tensor], Any] = operator.attrgetter("_data")

#: A tensor on ``array`` (not copied) for an op's result: ``wrap(array, requires_grad,
#: grad_fn)``. The array must be new, never one that a caller still holds.
wrap = Tensor._make

#: A tensor on ``array`` (not copied) that others can write too (an array shared through
#: DLPack or with PyTorch): a record taken of it copies its bytes.
wrap_shared = Tensor._make_shared


def leaf_node(t: Tensor) -> AccumulateGrad:
    """The AccumulateGrad node of a leaf that requires grad (one per leaf)."""
    accumulator = t._accumulator
    if accumulator is None:
        accumulator = t._accumulator = AccumulateGrad(t)
    return accumulator
