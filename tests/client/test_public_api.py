"""The names gradvault.client exports."""

from __future__ import annotations

import gradvault.client


def test_exported_names_are_pinned() -> None:
    assert sorted(gradvault.client.__all__) == [
        "AsyncClient",
        "AsyncSnapshotter",
        "Client",
        "ProgressCallback",
        "SnapshotSummary",
        "Snapshotter",
        "SnapshotterSummary",
        "SnapshotterWarning",
        "Target",  # a service or a store by URL or path, shared with the CLI and the HF callback
    ]
    for name in gradvault.client.__all__:
        assert getattr(gradvault.client, name) is not None, name
