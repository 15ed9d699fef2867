"""The torch integration on an S3 store (SeaweedFS on 127.0.0.1): FSDP2 ranks write their
shards as objects and commit one snapshot; it restores on the same world size bit for bit
and on one process as the full gradients. A rank killed mid-snapshot leaves nothing
listed, and gc removes its objects."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

import torch  # noqa: E402 - after the skip

from gradvault.core import Recorder, SnapshotNotFoundError  # noqa: E402
from gradvault.integrations import torch as gv_torch  # noqa: E402
from tests.conftest import S3_BUCKET, S3_CREDENTIALS  # noqa: E402
from tests.integrations import torch_loops, torch_ranks  # noqa: E402
from tests.integrations.test_torch_faults import TIMEOUT, outcome  # noqa: E402
from tests.integrations.test_torch_fsdp import assert_resumed_exactly  # noqa: E402


def test_fsdp_ranks_on_s3(tmp_path: Path, s3_endpoint: str) -> None:
    store = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/store"
    options = {"endpoint": s3_endpoint, "allow_http": True, **S3_CREDENTIALS}
    folder = tmp_path / "two"
    torch_ranks.run(folder, 2, "fsdp", store=store, store_options=options)
    assert_resumed_exactly(folder, 2)
    snapshot_id = (folder / "snapshot_id").read_text()
    with Recorder(store, **options) as recorder:
        (listed,) = recorder.sync.list()
        assert (listed.id, listed.world_size) == (snapshot_id, 2)
    model = torch_loops.Net()
    gv_torch.restore(model, store, snapshot_id, store_options=options)
    full = torch.load(folder / "full.pt")
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, full[name]), name


def test_a_rank_killed_mid_snapshot_on_s3(tmp_path: Path, s3_endpoint: str) -> None:
    store = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/store"
    options = {"endpoint": s3_endpoint, "allow_http": True, **S3_CREDENTIALS}
    launch = torch_ranks.start(
        tmp_path / "run",
        2,
        "kill_mid_snapshot",
        store=store,
        store_options=options,
        timeout=TIMEOUT,
    )
    assert launch.join() == [0, -signal.SIGKILL], launch.output()
    assert outcome(launch.folder, 0).startswith("DistributedSnapshotError: rank 0 of 2")
    with Recorder(store, **options) as recorder:
        assert recorder.sync.list() == []
        (collected,) = recorder.sync.gc(grace_seconds=0)  # the one snapshot's shards
        assert recorder.sync.list() == []
        with pytest.raises(SnapshotNotFoundError):
            recorder.sync.info(collected)
