"""Where snapshots go: a store (through a Recorder) or the service (through the Client).

Which of the two a target is, and what is wrong with it, is :class:`gradvault.client.Target`'s
to say; this class adds what the callback needs of it: opened on first use, a store's
``keep_last``, a push that returns the new id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gradvault.client import Target
from gradvault.core import GradientsParamsRecord, Recorder
from gradvault.core.records.record_rules import check_snapshot_fields
from gradvault.core.store import RetentionRules


def check_schedule(every: int | None, on_sigterm: bool, run: str | None) -> None:
    """A callback's ``every``, ``on_sigterm`` and ``run``, checked before training starts."""
    if every is not None:
        if type(every) is not int:
            raise TypeError(f"every must be an int >= 1 or None; got {every!r}")
        if every < 1:
            raise ValueError(f"every must be an int >= 1 or None; got {every}")
    if type(on_sigterm) is not bool:
        raise TypeError(f"on_sigterm must be True or False; got {on_sigterm!r}")
    if run is not None:
        check_snapshot_fields(run, 0, None)


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
        self.where = Target(location, token)
        self.location = self.where.location
        self.is_service = self.where.is_service
        if keep_last is not None:
            if self.is_service:
                raise ValueError(
                    "keep_last is a store's retention; the service at "
                    f"{self.location} applies its own"
                )
            RetentionRules(keep_last, None)  # a bad value raises here, not in the background
        self._keep_last = keep_last
        self._store_options = dict(store_options or {})
        self._recorder: Recorder | None = None
        self._client: Any = None

    def __repr__(self) -> str:
        return f"SnapshotTarget({self.location!r})"

    @property
    def store_options(self) -> dict[str, Any]:
        """The options a store is opened with."""
        return dict(self._store_options)

    @property
    def recorder_options(self) -> dict[str, Any]:
        """The options a store's Recorder is opened with: ``keep_last`` and the store's."""
        return {"keep_last": self._keep_last, **self._store_options}

    def _open(self) -> Any:
        if self.is_service:
            if self._client is None:
                self._client = self.where.client()
            return self._client
        if self._recorder is None:
            self._recorder = self.where.recorder(**self.recorder_options)
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
