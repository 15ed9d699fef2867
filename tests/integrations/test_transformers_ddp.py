"""The Trainer under DDP (two gloo ranks on 127.0.0.1): a SIGTERM to every rank in the
middle of a window, one snapshot with every rank's shard, a resume in fresh processes, and
the end of training bit for bit that of a run of two ranks never stopped; and a SIGTERM in
a window's last micro-batch, which ends in the Trainer's own checkpoint.

The ranks are forked by ``tests/integrations/torch_ranks.py`` from a launcher that has
imported ``hf_run`` (transformers) once; each runs ``hf_run.main`` in a process group made
before the Trainer, which accelerate then uses (``use_cpu=True``: gloo). Every launch is
bounded in time, and a rank still running at its deadline is killed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

import torch  # noqa: E402 - after the skips

from gradvault.core import Recorder  # noqa: E402
from gradvault.integrations.transformers import latest_checkpoint  # noqa: E402
from tests.integrations import torch_ranks  # noqa: E402
from tests.integrations.runs import assert_bit_identical  # noqa: E402

WORLD_SIZE = 2
RUN = "tests.integrations.hf_run"


def start(folder: Path, *argv: str) -> torch_ranks.Launch:
    return torch_ranks.start(
        folder, WORLD_SIZE, "ddp_rank", module=RUN, argv=[argv[0], "--out", str(folder), *argv[1:]]
    )


def results(folder: Path) -> list[dict[str, Any]]:
    return [
        torch.load(folder / f"result.{rank}.pt", weights_only=False) for rank in range(WORLD_SIZE)
    ]


class Reference:
    """The stock Trainer on two ranks, never stopped: started once, while the first test's
    ranks start too; its results once it has ended."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.launch = start(folder, "baseline")
        self._results: list[dict[str, Any]] | None = None

    def results(self) -> list[dict[str, Any]]:
        if self._results is None:
            assert self.launch.join() == [0, 0], self.launch.output()
            self._results = results(self.folder)
        return self._results


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference(tmp_path_factory.mktemp("reference"))


def stop_with_sigterm(folder: Path, store: str, step: int, micro: int) -> None:
    """Two ranks stopped by a SIGTERM to each, as a scheduler sends it, during micro-batch
    ``micro`` of step ``step`` (every rank waits there for it)."""
    launch = start(
        folder,
        "sigterm",
        "--store",
        store,
        "--step",
        str(step),
        "--micro",
        str(micro),
        "--ready-file",
        str(folder / "ready.{rank}"),
    )
    pids = launch.pids()
    launch.wait_for("ready", WORLD_SIZE)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    assert launch.join() == [0, 0], launch.output()


def resume(folder: Path, store: str) -> None:
    launch = start(folder, "resume", "--store", store)
    assert launch.join() == [0, 0], launch.output()


def test_sigterm_to_every_rank_mid_window_then_resume_is_bit_identical(
    tmp_path: Path, reference: Reference
) -> None:
    store, stopped = str(tmp_path / "store"), tmp_path / "stopped"
    stop_with_sigterm(stopped, store, step=3, micro=5)

    # both ranks stopped after the same micro-batch, with one snapshot of both shards
    run_dir = stopped / "run"
    (folder,) = run_dir.glob("gradvault-checkpoint-*")
    assert folder.name == "gradvault-checkpoint-2" and latest_checkpoint(run_dir) == folder
    states = [
        json.loads((folder / f"gradvault_resume_rank{rank}.json").read_text())
        for rank in range(WORLD_SIZE)
    ]
    assert [(s["global_step"], s["micro_step"], s["process_index"]) for s in states] == [
        (2, 5, 0),
        (2, 5, 1),
    ]
    snapshot_id = states[0]["snapshot_id"]
    assert states[1]["snapshot_id"] == snapshot_id
    # the Trainer's checkpoint of step 2: rank 0 wrote the model and optimizer, each rank
    # its own generators
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= {
        path.name for path in folder.iterdir()
    }
    stops = [torch.load(stopped / f"result.{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert [(r["global_step"], r["stopped_by_signal"]) for r in stops] == [(2, True), (2, True)]
    with Recorder(store) as recorder:
        (listed,) = recorder.sync.list()
        assert (listed.id, listed.world_size, listed.step) == (snapshot_id, WORLD_SIZE, 2)
        shards = [recorder.sync.fetch(snapshot_id, rank=rank) for rank in range(WORLD_SIZE)]
    # mid-window (accelerate's no_sync), each rank's sums are its own: not one reduced
    first, second = ({entry.name: bytes(entry.data) for entry in shard} for shard in shards)
    assert first.keys() == second.keys() and first != second

    resume(stopped, store)
    for expected, found in zip(reference.results(), results(stopped), strict=True):
        assert_bit_identical(expected, found)


def test_sigterm_in_a_windows_last_micro_batch_then_resume_is_bit_identical(
    tmp_path: Path, reference: Reference
) -> None:
    """The window's step finishes and the Trainer saves checkpoint-3 (in the middle of an
    epoch): each rank writes its own running loss and generators beside it."""
    store, stopped = str(tmp_path / "store"), tmp_path / "stopped"
    stop_with_sigterm(stopped, store, step=3, micro=8)
    run_dir = stopped / "run"
    assert latest_checkpoint(run_dir) == run_dir / "checkpoint-3"
    assert not list(run_dir.glob("gradvault-checkpoint-*"))
    names = {path.name for path in (run_dir / "checkpoint-3").iterdir()}
    assert {"gradvault_logging_rank0.json", "gradvault_logging_rank1.json"} <= names
    assert not Path(store).exists()  # a window's end: nothing to snapshot

    resume(stopped, store)
    for expected, found in zip(reference.results(), results(stopped), strict=True):
        assert_bit_identical(expected, found)
