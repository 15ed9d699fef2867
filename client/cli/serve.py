"""``gradvault serve``: the HTTP service, every setting of :class:`Settings` as a flag.

The flags are derived from the settings model itself (``store_options`` becomes
``--store-options``, ``public_read`` becomes ``--public-read/--no-public-read``), so a
setting added to the service is a flag here without a change to this module. A flag left
out falls back to its ``GRADVAULT_*`` variable, then to the default. Ctrl-C (SIGINT) or
SIGTERM stops the service after the requests in flight, and the command exits 0.

:class:`BackgroundService` runs the same app in a thread of this process, for the demo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .errors import MissingExtraError, ServeError, UsageError
from .main import EXIT_OK

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
STARTUP_DEADLINE_SECONDS = 60
#: the signals that stop a service the command keeps running
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _settings_class() -> Any:
    try:
        from gradvault.service import Settings
    except ImportError as error:
        raise MissingExtraError("gradvault serve", "service", error) from error
    return Settings


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_raw_text(field: Any) -> bool:
    """Whether the setting takes its text as it is (``tokens``), not as JSON."""
    from pydantic_settings import NoDecode

    return any(item is NoDecode or isinstance(item, NoDecode) for item in field.metadata)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object; {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object; got {text!r}")
    return value


def _default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "none" if not value else json.dumps(value)
    return "none" if field.default is None else str(field.default).lower()


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of the service's Settings, each defaulting to "not given"."""
    settings = _settings_class()
    prefix = settings.model_config.get("env_prefix", "")
    group = parser.add_argument_group("settings (each also from its environment variable)")
    for name, field in settings.model_fields.items():
        variable = f"{prefix}{name}".upper()
        what = field.description or name.replace("_", " ")
        help_text = f"{what} ({variable}; default {_default_text(field)})"
        if field.annotation is bool:
            group.add_argument(
                _flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif getattr(field.annotation, "__origin__", None) is dict and not _is_raw_text(field):
            group.add_argument(
                _flag(name), type=_json_object, metavar="JSON", default=None, help=help_text
            )
        else:
            group.add_argument(
                _flag(name), metavar=name.split("_")[-1].upper(), default=None, help=help_text
            )


def settings_from(args: argparse.Namespace) -> Any:
    """The Settings the flags name (environment and defaults for the others)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    settings = _settings_class()
    given = {
        name: getattr(args, name)
        for name in settings.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return settings(**given)
    except ValidationError as error:
        raise UsageError(_explain(error, settings), prog="gradvault serve") from None
    except SettingsError as error:  # a variable that is not valid JSON: it names no value
        raise UsageError(str(error), prog="gradvault serve") from None


#: settings whose values are secrets, or may hold some (S3 keys in store_options)
SECRET_SETTINGS = frozenset({"tokens", "store_options"})


def _explain(error: Any, settings: Any) -> str:
    """One line per refused setting; the value given is echoed only for a known, public one.

    A name that is not a setting (a misspelt ``GRADVAULT_TOKEN``) may carry a secret too.
    """
    prefix = settings.model_config.get("env_prefix", "")
    problems = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else "settings"
        where = f"{_flag(name)} ({prefix}{name.upper()})"
        public = name in settings.model_fields and name not in SECRET_SETTINGS
        found = f", got {problem.get('input')!r}" if public else ""
        problems.append(f"{where}: {problem['msg']}{found}")
    return "; ".join(problems)


def serve_command(args: argparse.Namespace) -> int:
    """Run the service in the foreground until Ctrl-C or SIGTERM."""
    settings = settings_from(args)
    from gradvault.core import StoreUnavailableError
    from gradvault.service import OpenBindingError
    from gradvault.service.server import check_store, serve_checked
    from gradvault.service.settings import check_binding

    try:
        check_binding(settings)
    except OpenBindingError as error:
        raise UsageError(str(error), prog="gradvault serve") from None
    try:
        check_store(settings)  # before it says it serves
    except StoreUnavailableError as error:
        raise ServeError(f"will not serve: {error}") from None
    if settings.port:
        print(
            f"gradvault serve: store {settings.store}; API docs at "
            f"http://{settings.host}:{settings.port}/docs",
            file=sys.stderr,
            flush=True,
        )
    try:
        with sigterm_as_interrupt():
            serve_checked(settings, log_level=args.log_level)
    except KeyboardInterrupt:
        pass  # uvicorn has shut down cleanly, then passed the signal on
    except SystemExit as stop:  # uvicorn's way to give up, a port in use for one
        if stop.code:
            raise ServeError(
                f"the service did not start on {settings.host}:{settings.port} "
                f"(uvicorn's exit status {stop.code}; its log above says why)"
            ) from None
    print("gradvault serve: stopped", file=sys.stderr)
    return EXIT_OK


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``serve``; its settings flags are read from the service when it is the command."""
    sub = subparsers.add_parser(
        "serve",
        help="run the HTTP service (every GRADVAULT_* setting is a flag)",
        description="Run the HTTP service over a snapshot store until Ctrl-C. Every setting "
        "is a flag and an environment variable; a flag wins over its variable. Without "
        "tokens the service is open and binds loopback only.",
        parents=parents,
        populate=add_settings_flags,
    )
    sub.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level (info)"
    )
    sub.set_defaults(handler=serve_command)


class BackgroundService:
    """The service app under uvicorn in a thread of this process, on ``host:port``.

    ``port`` 0 takes a free port; ``url`` says which once started. ``stop()`` shuts it
    down after the requests in flight.
    """

    def __init__(self, settings: Any, *, log_level: str = "warning") -> None:
        import uvicorn

        from gradvault.service import create_app
        from gradvault.service.server import uvicorn_options

        self._socket = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((settings.host, settings.port))
        except OSError as error:
            self._socket.close()
            raise OSError(
                error.errno,
                f"cannot listen on {settings.host}:{settings.port}: {error.strerror}",
            ) from None
        self.host, self.port = settings.host, self._socket.getsockname()[1]
        # the service's connection limits; a connection still open at Ctrl-C gets a few
        # seconds, never holds the stop for ever
        config = uvicorn.Config(
            create_app(settings), log_level=log_level, **uvicorn_options(settings)
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="gradvault-service",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> BackgroundService:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._socket.close()
                raise RuntimeError(f"the service did not start on {self.url}")
            time.sleep(0.02)
        return self

    def wait(self) -> None:
        """Block until the service stops (Ctrl-C in this thread raises KeyboardInterrupt)."""
        # sleep, not Thread.join: a KeyboardInterrupt that lands inside join() can leave
        # the thread marked as finished while it still runs, and stop() would not wait
        while self._thread.is_alive():
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop after the requests in flight; the socket is closed once uvicorn is done."""
        self._server.should_exit = True
        self._thread.join(STARTUP_DEADLINE_SECONDS)
        if not self._thread.is_alive():
            self._socket.close()

    def __enter__(self) -> BackgroundService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise KeyboardInterrupt, so both stop the service.

    SIGINT is set too because a process started with it ignored (a background job of a
    shell without job control) would otherwise never see Ctrl-C; uvicorn does the same.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, interrupt) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
