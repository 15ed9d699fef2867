"""The torch integration through the service (a uvicorn on 127.0.0.1 over a local store):
each rank uploads its shard, the upload that completes the ranks commits, and every rank
returns the snapshot; restores read each rank's shard through the client. DDP stopped
mid-window resumes bit for bit; FSDP2 restores on the same world size bit for bit, on
three ranks from two and on one process as the full gradients; a token that may not
write fails every rank's call, and nothing is committed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the torch extra (torch) is not installed")

import torch  # noqa: E402 - after the skip

from gradvault.client import Client  # noqa: E402
from gradvault.core import InvalidArgumentError  # noqa: E402
from gradvault.integrations import torch as gv_torch  # noqa: E402
from tests.client.conftest import READ_TOKEN, WRITE_TOKEN, SharedService, serve  # noqa: E402
from tests.integrations import torch_loops, torch_ranks  # noqa: E402
from tests.integrations.test_torch_ddp import assert_same_outcome, results  # noqa: E402
from tests.integrations.test_torch_faults import TIMEOUT  # noqa: E402
from tests.integrations.test_torch_fsdp import assert_resumed_exactly, assert_sliced  # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedService]:
    """A service of this module's own, over a local folder; it writes for WRITE_TOKEN."""
    yield from serve(str(tmp_path_factory.mktemp("torch-service") / "store"), {})


def test_ddp_stopped_mid_window_resumes_bit_identical(
    tmp_path: Path, service: SharedService
) -> None:
    target = {"store": service.base_url, "token": WRITE_TOKEN}
    reference = tmp_path / "reference"
    torch_ranks.run(reference, 2, "ddp", **target)

    stopped = tmp_path / "stopped"
    launch = torch_ranks.start(stopped, 2, "ddp", pause_at=[1, 1], **target)
    pids = launch.pids()
    launch.wait_for("ready", 2)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    assert launch.join() == [0, 0], launch.output()
    states = [torch.load(stopped / f"state.{rank}.pt") for rank in range(2)]
    snapshot_id = states[0]["snapshot_id"]
    assert states[1]["snapshot_id"] == snapshot_id

    with Client(service.base_url, READ_TOKEN) as client:
        (listed,) = client.list(run="ddp")
        assert (listed.id, listed.world_size, listed.step) == (snapshot_id, 2, 1)
        for rank, state in enumerate(states):  # each rank's shard is its own .grad
            shard = client.fetch(snapshot_id, rank=rank)
            assert {entry.name for entry in shard} == set(state["grads"])
            for entry in shard:
                assert entry.array.tobytes() == state["grads"][entry.name].numpy().tobytes()
            assert shard.metadata["torch"]["sharded"] == [False] * len(state["grads"])

    torch_ranks.run(stopped, 2, "ddp", resume=True, **target)
    for expected, found in zip(results(reference), results(stopped), strict=True):
        assert_same_outcome(expected, found)


def test_fsdp_on_the_same_world_size_and_resharded(tmp_path: Path, service: SharedService) -> None:
    target = {"store": service.base_url, "token": WRITE_TOKEN}
    two = tmp_path / "two"
    torch_ranks.run(two, 2, "fsdp", **target)
    assert_resumed_exactly(two, 2)
    snapshot_id = (two / "snapshot_id").read_text()
    full = torch.load(two / "full.pt")

    with Client(service.base_url, READ_TOKEN) as client:  # the layout reached the service
        layouts = [client.info(snapshot_id, rank=rank)["metadata"]["torch"] for rank in (0, 1)]
    assert [layout["sharded"] for layout in layouts] == [[True] * 4] * 2
    assert [dict(zip(l["name"], l["offset"], strict=True)) for l in layouts] == [  # noqa: E741
        {"hidden.weight": 0, "hidden.bias": 0, "out.weight": 0, "out.bias": 0},
        {"hidden.weight": 5, "hidden.bias": 5, "out.weight": 2, "out.bias": 2},
    ]

    # three ranks from two: some rows of a shard, some of both
    three = tmp_path / "three"
    torch_ranks.run(three, 3, "fsdp", train=False, other=snapshot_id, **target)
    assert_sliced(three, 3, full)

    model = torch_loops.Net()  # one process: the full gradients, from both shards
    gv_torch.restore(model, service.base_url, snapshot_id, token=READ_TOKEN)
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, full[name]), name


def test_a_token_that_may_not_write_fails_every_rank(
    tmp_path: Path, service: SharedService
) -> None:
    run = "refused"
    launch = torch_ranks.start(
        tmp_path / "run",
        2,
        "service_refused",
        store=service.base_url,
        token=WRITE_TOKEN,
        read_token=READ_TOKEN,
        run=run,
        timeout=TIMEOUT,
    )
    assert launch.join() == [0, 0], launch.output()
    read_only = [(launch.folder / f"read_only.{rank}").read_text() for rank in (0, 1)]
    assert read_only[0].startswith(
        "DistributedSnapshotError: the snapshot's commit failed on 1 of 2 ranks (rank 1: "
        "AuthError: POST "
    ), read_only[0]
    assert "HTTP 403: this route needs a token with write scope; yours is read" in read_only[0]
    assert read_only[1].startswith("AuthError: POST "), read_only[1]
    assert "HTTP 403" in read_only[1]
    for rank in (0, 1):  # every rank's upload is refused: each raises its own error
        unknown = (launch.folder / f"unknown.{rank}").read_text()
        assert unknown.startswith("AuthError: POST "), unknown
        assert "HTTP 401" in unknown
    with Client(service.base_url, READ_TOKEN) as client:
        assert list(client.list(run=run)) == []


def test_store_options_are_refused_with_a_service_url(service: SharedService) -> None:
    model = torch_loops.Net()
    model(torch.randn(2, 6)).sum().backward()
    message = "store_options are for a store this process opens"
    options = {"store_options": {"endpoint": "http://127.0.0.1:9"}, "token": WRITE_TOKEN}
    with pytest.raises(InvalidArgumentError, match=message):
        gv_torch.snapshot(model, service.base_url, run="r", step=0, **options)
    with pytest.raises(InvalidArgumentError, match=message):
        gv_torch.restore(model, service.base_url, "0" * 26, **options)
