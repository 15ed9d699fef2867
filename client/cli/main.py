"""The ``gradvault`` command line: its parser, its dispatch, its exit codes and error lines.

Exit status 0 when a command did what it was asked, 1 when it failed (the service or the
store refused, a file could not be read, nothing answered), 2 when the command line itself
is wrong. A failure is printed on stderr as one line naming what is wrong; ``--debug``
prints the traceback before it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_URL = "http://127.0.0.1:8000"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, raised as UsageError.

    ``populate(parser)``, if given, adds arguments the first time this parser parses or
    prints help: ``serve`` reads its flags from the service's settings only when used.
    """

    def __init__(
        self,
        *args: Any,
        populate: Callable[[argparse.ArgumentParser], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._populate = populate

    def _populated(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._populated()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._populated()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        from .errors import UsageError

        raise UsageError(f"{message} (see '{self.prog} --help')", prog=self.prog)


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``, else a usage error naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0; got {text!r}")
    return value


def _where_options() -> argparse.ArgumentParser:
    """``--url``/``--token`` (the service) or ``--store`` (the store itself)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("where the snapshots are")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--url",
        help=f"the service's base URL (default: $GRADVAULT_URL, else {DEFAULT_URL})",
    )
    exclusive.add_argument(
        "--store",
        metavar="URL",
        help="work on this store directly, without a service: a folder, file:// or "
        "s3://bucket/prefix URL (S3 settings from the AWS_* variables)",
    )
    group.add_argument(
        "--token",
        help="bearer token for the service (default: $GRADVAULT_TOKEN)",
    )
    group.add_argument(
        "--retries",
        type=count(0),
        default=3,
        help="more tries after a connection error or a 429/502/503/504 (default 3)",
    )
    return parent


def service_url(url: str | None) -> str:
    """``--url`` as given, else ``$GRADVAULT_URL``, else :data:`DEFAULT_URL`."""
    return url or os.environ.get("GRADVAULT_URL") or DEFAULT_URL


def service_token(token: str | None) -> str | None:
    """``--token`` as given, else ``$GRADVAULT_TOKEN`` (None when neither is set)."""
    return token or os.environ.get("GRADVAULT_TOKEN") or None


def _debug_option() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of a failure",
    )
    return parent


def build_parser() -> CommandParser:
    """The parser of every command (``serve``'s options are read from the service's settings
    only when ``serve`` is the command)."""
    from . import commands, demo, serve

    debug = _debug_option()
    where = _where_options()
    parser = CommandParser(
        prog="gradvault",
        description="Snapshot and restore gradients: run the service, list, inspect, pull, "
        "push and delete snapshots, or watch the demo resume a preempted run bit for bit.",
        parents=[debug],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command", required=True
    )

    def add(name: str, help: str, handler: Callable[[argparse.Namespace], int], **kw: Any):
        sub = subparsers.add_parser(
            name, help=help, description=help[:1].upper() + help[1:] + ".", **kw
        )
        sub.set_defaults(handler=handler)
        return sub

    serve.add_parser(subparsers, [debug])
    commands.add_parsers(add, [debug, where])
    demo.add_parser(add, [debug])
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gradvault")
    except PackageNotFoundError:
        return "(not installed)"


def describe(error: BaseException) -> str:
    """One line that says what went wrong, for a person reading a terminal."""
    from gradvault.core import AuthError, ClientRequestError, SnapshotNotFoundError

    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, AuthError):
        return f"authentication failed (check --token or GRADVAULT_TOKEN): {text}"
    if isinstance(error, SnapshotNotFoundError):
        return f"not found: {text}"
    if isinstance(error, ClientRequestError) and getattr(error, "status", None) is None:
        return f"cannot reach the service (is 'gradvault serve' running there?): {text}"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {error.filename}"
    from gradvault.core.errors import GradvaultError

    if isinstance(error, GradvaultError | OSError):
        return text
    return f"{type(error).__name__}: {text} (an unexpected error; --debug shows where)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gradvault`` command line ``argv`` (default ``sys.argv[1:]``); its exit status."""
    from .errors import UsageError

    arguments = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in arguments
    prog = "gradvault"
    try:
        parser = build_parser()
        args, extras = parser.parse_known_args(arguments)
        prog = f"gradvault {args.command}"
        if extras:
            raise UsageError(
                f"unrecognized arguments: {' '.join(extras)} (see '{prog} --help')", prog=prog
            )
        return args.handler(args)
    except UsageError as error:
        if debug:
            traceback.print_exc()
        print(f"{error.prog or prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {describe(error)}", file=sys.stderr)
        return EXIT_FAILURE
