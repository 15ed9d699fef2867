"""Grad modes: ``no_grad``, ``enable_grad`` and ``inference_mode``, thread-local as in PyTorch."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference = False


_state = _State()


def is_grad_enabled() -> bool:
    """True when operations record a graph."""
    return _state.grad_enabled


def is_inference_mode_enabled() -> bool:
    """True inside ``inference_mode()``."""
    return _state.inference


class _Mode:
    """Base of the grad-mode context managers; instances also decorate functions."""

    def _enter(self) -> tuple[bool, bool]:
        raise NotImplementedError

    def __enter__(self) -> None:
        self._saved = (_state.grad_enabled, _state.inference)
        self._enter()

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled, _state.inference = self._saved

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _args(self) -> tuple[Any, ...]:
        return ()


class _NoParamMode(_Mode):
    """A mode that also decorates without parentheses (``@no_grad``), as in PyTorch 2."""

    def __new__(cls, orig_func: Callable[..., Any] | None = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParamMode):  # noqa: N801 - PyTorch's name
    """Operations inside record no graph; results do not require grad."""

    def _enter(self) -> tuple[bool, bool]:
        _state.grad_enabled = False
        return self._saved


class enable_grad(_NoParamMode):  # noqa: N801 - PyTorch's name
    """Turn graph recording back on inside a ``no_grad`` block."""

    def _enter(self) -> tuple[bool, bool]:
        _state.grad_enabled = True
        return self._saved


class inference_mode(_Mode):  # noqa: N801 - PyTorch's name
    """Like ``no_grad``; tensors made inside are inference tensors that can never enter a graph."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)

    def _enter(self) -> tuple[bool, bool]:
        if self.mode:
            _state.grad_enabled = False
            _state.inference = True
        else:  # inference_mode(False) inside inference_mode turns it off, as in PyTorch
            _state.inference = False
            _state.grad_enabled = True
        return self._saved


class set_grad_enabled(_Mode):  # noqa: N801 - PyTorch's name
    """Turn graph recording on or off: at once when called, restored on leaving a ``with``."""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self._before = (_state.grad_enabled, _state.inference)
        _state.grad_enabled = self.mode

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)

    def __enter__(self) -> None:
        self._saved = self._before

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled, _state.inference = self._saved
