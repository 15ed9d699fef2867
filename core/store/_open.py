"""open_store: a SnapshotStore for a folder path, a ``file://`` URL or ``s3://bucket/prefix``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from obstore.store import S3Store

from ..errors import InvalidArgumentError
from ._backend import ThreadRunner
from ._format import DEFAULT_CHUNK_BYTES, DEFAULT_PACK_THRESHOLD
from ._local import LocalBackend
from ._s3 import S3Backend
from ._snapshot_store import SnapshotStore

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_S3_OPTIONS = (
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "allow_http",
    "client_options",
    "retry_config",
)
_TRUE = {"1", "true", "yes", "on"}


def _local_root(url_or_path: str | os.PathLike[str]) -> Path:
    text = os.fspath(url_or_path)
    if text.startswith("file:"):
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"a file URL names a local path (file:///...); got {text!r}")
        text = url2pathname(unquote(parsed.path))
    if not text:
        raise ValueError("the store path is empty")
    return Path(text).expanduser().absolute()


def _s3_backend(url: str, options: dict[str, Any], threads: ThreadRunner, concurrency: int):
    parsed = urlparse(url)
    bucket = parsed.netloc
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"an S3 URL is s3://<bucket>/<prefix>; bucket {bucket!r} is not valid")
    parts = [part for part in parsed.path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"an S3 prefix may not contain '.' or '..' segments; got {url!r}")
    environ = os.environ
    endpoint = (
        options.get("endpoint")
        or environ.get("AWS_ENDPOINT_URL_S3")
        or environ.get("AWS_ENDPOINT_URL")
    )
    config: dict[str, Any] = {}
    settings = {
        "endpoint": endpoint,
        "region": options.get("region")
        or environ.get("AWS_REGION")
        or environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        "access_key_id": options.get("access_key_id") or environ.get("AWS_ACCESS_KEY_ID"),
        "secret_access_key": options.get("secret_access_key")
        or environ.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": options.get("session_token") or environ.get("AWS_SESSION_TOKEN"),
    }
    config.update({key: value for key, value in settings.items() if value})
    allow_http = options.get("allow_http")
    if allow_http is None:
        if "AWS_ALLOW_HTTP" in environ:
            allow_http = environ["AWS_ALLOW_HTTP"].strip().lower() in _TRUE
        else:  # an explicit http:// endpoint is a request for plain HTTP
            allow_http = bool(endpoint and endpoint.startswith("http://"))
    client_options = dict(options.get("client_options") or {})
    client_options.setdefault("allow_http", allow_http)
    store = S3Store(
        bucket,
        prefix="/".join(parts) or None,
        config=config,  # type: ignore[arg-type]
        client_options=client_options,  # type: ignore[arg-type]
        retry_config=options.get("retry_config"),
    )
    location = f"s3://{bucket}/{'/'.join(parts)}".rstrip("/")
    return S3Backend(store, location, threads, concurrency)


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
    if not isinstance(pack_threshold, int) or pack_threshold < 0:
        raise ValueError(f"pack_threshold must be an int >= 0; got {pack_threshold!r}")
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be an int >= 1; got {chunk_bytes!r}")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be an int >= 1; got {max_concurrency!r}")
    text = os.fspath(url_or_path)
    threads = ThreadRunner(max_concurrency)
    scheme = urlparse(text).scheme
    if scheme not in ("", "file") and "://" not in text:
        raise InvalidArgumentError(
            f"store {text!r} looks like a URL missing its '//': an S3 store is "
            "s3://<bucket>/<prefix>; a folder whose name has a ':' is written ./<name>"
        )
    if scheme == "s3":
        unknown = sorted(set(options) - set(_S3_OPTIONS))
        if unknown:
            raise TypeError(f"unknown S3 store options {unknown}; known: {list(_S3_OPTIONS)}")
        backend: Any = _s3_backend(text, options, threads, max_concurrency)
    elif scheme in ("", "file"):
        if options:
            raise TypeError(f"a local store takes no options {sorted(options)}")
        backend = LocalBackend(_local_root(text), threads)
    else:
        raise ValueError(f"store URLs are folder paths, file:// or s3://; got {text!r}")
    return SnapshotStore(
        backend,
        threads,
        pack_threshold=pack_threshold,
        chunk_bytes=chunk_bytes,
        max_concurrency=max_concurrency,
    )
