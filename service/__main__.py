"""``python -m gradvault.service --store URL --host HOST --port PORT``."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError
from pydantic_settings import SettingsError

from gradvault.core import StoreUnavailableError

from .errors import OpenBindingError
from .server import serve
from .settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gradvault.service",
        description="Serve a gradvault store over HTTP (settings also from GRADVAULT_* vars).",
    )
    parser.add_argument("--store", help="folder path, file:// or s3:// URL (GRADVAULT_STORE)")
    parser.add_argument("--host", help="address to bind (GRADVAULT_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to bind (GRADVAULT_PORT, default 8000)")
    parser.add_argument("--log-level", default="info", help="uvicorn's log level")
    args = parser.parse_args(argv)
    given = {key: getattr(args, key) for key in ("store", "host", "port")}
    try:
        settings = Settings(**{key: value for key, value in given.items() if value is not None})
        serve(settings, log_level=args.log_level)
    except (OpenBindingError, ValidationError, SettingsError, StoreUnavailableError) as error:
        # the errors never hold a setting's value (Settings hides inputs in its errors)
        print(f"gradvault.service: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
