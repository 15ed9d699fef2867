"""Where snapshots go: a store (through a Recorder) or the service (through the Client)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gradvault.core import GradientsParamsRecord, Recorder
from gradvault.core.store import RetentionRules

SERVICE_SCHEMES = ("http://", "https://")


class SnapshotTarget:
    """A store path or URL, or a service URL (``http://`` or ``https://``), opened on first use.

    ``push`` commits a record and returns its snapshot id; ``fetch`` reads one back with
    every checksum verified. ``close`` releases the recorder's thread or the HTTP client.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        token: str | None = None,
        keep_last: int | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(location, str | os.PathLike):
            raise TypeError(
                "the snapshot target is a store path or URL, or a service URL; got "
                f"{type(location).__name__}"
            )
        self.location = os.fspath(location)
        if not self.location:
            raise ValueError("the snapshot target is empty; give a store path or a service URL")
        self.is_service = self.location.startswith(SERVICE_SCHEMES)
        if keep_last is not None:
            if self.is_service:
                raise ValueError(
                    "keep_last is a store's retention; the service at "
                    f"{self.location} applies its own"
                )
            RetentionRules(keep_last, None)  # a bad value raises here, not in the background
        self._token = token if token is not None else os.environ.get("GRADVAULT_TOKEN")
        self._keep_last = keep_last
        self._store_options = dict(store_options or {})
        self._recorder: Recorder | None = None
        self._client: Any = None

    def __repr__(self) -> str:
        return f"SnapshotTarget({self.location!r})"

    def _open(self) -> Any:
        if self.is_service:
            if self._client is None:
                from gradvault.client import Client  # noqa: PLC0415 - the client extra

                self._client = Client(self.location, self._token)
            return self._client
        if self._recorder is None:
            self._recorder = Recorder(
                self.location, keep_last=self._keep_last, **self._store_options
            )
        return self._recorder

    def push(
        self, record: GradientsParamsRecord, *, run: str, step: int, tags: Mapping[str, str]
    ) -> str:
        """Commit ``record`` as a new snapshot; its id."""
        opened = self._open()
        if self.is_service:
            return opened.push(record, run=run, step=step, tags=tags).id
        return opened.start_snapshot(record, run=run, step=step, tags=tags).result().id

    def fetch(self, snapshot_id: str) -> GradientsParamsRecord:
        """The snapshot ``snapshot_id`` as a record (checksums verified)."""
        opened = self._open()
        if self.is_service:
            return opened.fetch(snapshot_id)
        return opened.sync.fetch(snapshot_id)

    def close(self) -> None:
        """Release the recorder or the client; the next use opens them again."""
        recorder, client = self._recorder, self._client
        self._recorder = self._client = None
        if recorder is not None:
            recorder.close()
        if client is not None:
            client.close()
