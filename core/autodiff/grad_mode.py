"""Grad modes: ``no_grad``, ``enable_grad`` and ``inference_mode``, thread-local as in PyTorch."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    """The modes of the current thread. Ops record a graph only when ``grad_enabled`` is
    on and ``inference`` is off: inference mode wins over ``enable_grad()``, as in PyTorch.
    """

    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference = False


_state = _State()


def is_grad_enabled() -> bool:
    """True when grad mode is on (inside ``inference_mode`` ops still record nothing)."""
    return _state.grad_enabled


def is_inference_mode_enabled() -> bool:
    """True inside ``inference_mode()``."""
    return _state.inference


def is_recording() -> bool:
    """True when ops record a graph: grad mode on and not inside ``inference_mode``."""
    return _state.grad_enabled and not _state.inference


class _Mode:
    """Base of the grad-mode context managers; instances also decorate functions.

    A decorated function runs under a fresh instance on every call (so the mode is taken
    at call time, and calls may nest or run in several threads); a decorated generator
    function runs under the mode while its body runs, not between its yields.
    """

    def _enter(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> None:
        self._saved = (_state.grad_enabled, _state.inference)
        self._enter()

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled, _state.inference = self._saved

    def __call__(self, fn: F) -> F:
        fresh = functools.partial(self.__class__, *self._args())
        if inspect.isgeneratorfunction(fn):
            return cast(F, _wrap_generator(fn, fresh))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with fresh():
                return fn(*args, **kwargs)

        return cast(F, wrapper)  # the same signature: it passes everything on

    def _args(self) -> tuple[Any, ...]:
        return ()


def _wrap_generator(fn: Callable[..., Generator], mode: Callable[[], _Mode]) -> Callable:
    """``fn`` (a generator function) with each step of its body run under ``mode()``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Generator:
        generator = fn(*args, **kwargs)
        try:
            with mode():
                response = generator.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with mode():
                        generator.close()
                    raise
                except BaseException as exc:  # handed on to the generator
                    with mode():
                        response = generator.throw(exc)
                else:
                    with mode():
                        response = generator.send(request)
        except StopIteration as stop:
            return stop.value

    return wrapper


class _NoParamMode(_Mode):
    """A mode that also decorates without parentheses (``@no_grad``), as in PyTorch 2."""

    def __new__(cls, orig_func: Callable[..., Any] | None = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParamMode):  # PyTorch's name
    """Operations inside record no graph; results do not require grad."""

    def _enter(self) -> None:
        _state.grad_enabled = False


class enable_grad(_NoParamMode):  # PyTorch's name
    """Turn grad mode back on inside a ``no_grad`` block (not inside ``inference_mode``)."""

    def _enter(self) -> None:
        _state.grad_enabled = True


class inference_mode(_Mode):  # PyTorch's name
    """Like ``no_grad``; tensors made inside are inference tensors, which no graph may save.

    ``@inference_mode`` decorates without parentheses too, as in PyTorch.
    """

    def __new__(cls, mode: bool | Callable[..., Any] = True) -> Any:
        if isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)

    def _enter(self) -> None:
        if self.mode:
            _state.grad_enabled = False
            _state.inference = True
        else:  # inference_mode(False) inside inference_mode turns it off, as in PyTorch
            _state.inference = False
            _state.grad_enabled = True


class set_grad_enabled(_Mode):  # PyTorch's name
    """Turn grad mode on or off: at once when called, restored on leaving a ``with``.

    As a decorator it changes nothing until the function runs, and only while it runs.
    """

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self._before = _state.grad_enabled
        _state.grad_enabled = self.mode

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)

    def __call__(self, fn: F) -> F:
        _state.grad_enabled = self._before  # constructing it switched the mode at once
        return super().__call__(fn)

    def __enter__(self) -> None:
        _state.grad_enabled = self.mode

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled = self._before
