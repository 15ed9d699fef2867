"""open_store: a SnapshotStore for a folder path, a ``file://`` URL or ``s3://bucket/prefix``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ._backend import ThreadRunner
from ._local import LocalBackend
from ._snapshot_store import SnapshotStore
from ._zarr_format import DEFAULT_CHUNK_BYTES, DEFAULT_PACK_THRESHOLD


def _local_root(url_or_path: str | os.PathLike[str]) -> Path:
    text = os.fspath(url_or_path)
    if text.startswith("file:"):
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidArgumentError(f"a file URL names a local path (file:///...); got {text!r}")
        text = url2pathname(unquote(parsed.path))
    if not text:
        raise InvalidArgumentError("the store path is empty")
    return Path(text).expanduser().absolute()


def _check_count(name: str, value: object, least: int) -> None:
    """InvalidArgumentError unless ``value`` is an int >= ``least`` (a bool is not a count)."""
    if type(value) is not int or value < least:
        raise InvalidArgumentError(
            f"{name} must be an int >= {least}; got {value!r} ({type(value).__name__})"
        )


def open_store(
    url_or_path: str | os.PathLike[str],
    *,
    pack_threshold: int = DEFAULT_PACK_THRESHOLD,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_concurrency: int = 16,
    **options: Any,
) -> SnapshotStore:
    """A SnapshotStore at a local folder (path or ``file://`` URL) or ``s3://bucket/prefix``.

    Nothing is read or created until the first operation. Gradients under
    ``pack_threshold`` bytes share the packed array; larger ones get their own array in
    chunks of about ``chunk_bytes``; at most ``max_concurrency`` files or requests are
    in flight. S3 options (each falls back to the usual environment variable):
    ``endpoint`` (AWS_ENDPOINT_URL), ``region`` (AWS_REGION, AWS_DEFAULT_REGION),
    ``access_key_id``, ``secret_access_key``, ``session_token``, ``allow_http``
    (AWS_ALLOW_HTTP; defaults to true for an ``http://`` endpoint), and obstore's
    ``client_options`` and ``retry_config`` dicts.
    """
    _check_count("pack_threshold", pack_threshold, 0)
    _check_count("chunk_bytes", chunk_bytes, 1)
    _check_count("max_concurrency", max_concurrency, 1)
    if not isinstance(url_or_path, str | os.PathLike):
        raise InvalidArgumentTypeError(
            f"store must be a folder path or a URL (str or os.PathLike); got "
            f"{type(url_or_path).__name__} {url_or_path!r}"
        )
    text = os.fspath(url_or_path)
    threads = ThreadRunner(max_concurrency)
    scheme = urlparse(text).scheme
    if scheme not in ("", "file") and "://" not in text:
        raise InvalidArgumentError(
            f"store {text!r} looks like a URL missing its '//': an S3 store is "
            "s3://<bucket>/<prefix>; a folder whose name has a ':' is written ./<name>"
        )
    if scheme == "s3":
        # obstore (the s3 extra) is imported only for an S3 store
        from ._s3 import S3Backend

        backend: Any = S3Backend.from_url(text, options, threads, max_concurrency)
    elif scheme in ("", "file"):
        if options:
            raise InvalidArgumentTypeError(f"a local store takes no options; got {sorted(options)}")
        backend = LocalBackend(_local_root(text), threads)
    else:
        raise InvalidArgumentError(f"store URLs are folder paths, file:// or s3://; got {text!r}")
    return SnapshotStore(
        backend,
        threads,
        pack_threshold=pack_threshold,
        chunk_bytes=chunk_bytes,
        max_concurrency=max_concurrency,
    )
