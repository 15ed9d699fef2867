"""Lightning runs stopped inside an accumulation window resume bit for bit.

The runs are subprocesses of ``tests/integrations/lightning_run.py``: stopped by a real
SIGTERM during a micro-batch (in each precision, one after the other in one process; and
under DDP with two ranks), or killed by SIGKILL after an ``every=`` snapshot, then resumed
in a fresh process with ``fit(ckpt_path="last")``. Final parameters, optimizer and
scheduler state and the logged losses are compared with an uninterrupted run in the same
precision (and number of ranks). A control shows that Lightning's own
``OnExceptionCheckpoint`` resume from the same SIGTERM differs.

The module's tests share one set of runs (``runs``): the stopping phases run side by side,
then the resuming ones, each process with a timeout.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed")

import torch  # noqa: E402

from tests.integrations.lightning_run import MAX_STEPS, PRECISIONS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PHASE_TIMEOUT_SECONDS = 240
#: micro-batch 14 (counted from 0 over the run) is epoch 1's fifth: the second of its window
SIGTERM_AT = 14
ALL_PRECISIONS = ",".join(PRECISIONS)


@dataclass
class Phase:
    """A runner process; ``sigterms`` is how many READY lines to answer with a SIGTERM."""

    process: subprocess.Popen[str]
    sigterms: int = 0

    def finish(self) -> tuple[int, str]:
        """Answer each READY with a SIGTERM, wait; the exit status and the output's end."""
        lines = []
        try:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                lines.append(line)
                if line.strip() == "READY" and self.sigterms:
                    self.process.send_signal(signal.SIGTERM)
                    self.sigterms -= 1
            return self.process.wait(PHASE_TIMEOUT_SECONDS), "".join(lines)[-4000:]
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def start(mode: str, out: Path, *extra: str, sigterms: int = 0) -> Phase:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.lightning_run", mode, "--out", str(out)]
        + list(extra),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Phase(process, sigterms)


def finish_all(phases: dict[str, Phase]) -> dict[str, tuple[int, str]]:
    """Each phase's exit status and output; the deadline is each process's timeout."""
    return {name: phase.finish() for name, phase in phases.items()}


@dataclass
class Runs:
    root: Path
    stopped: dict[str, tuple[int, str]]
    resumed: dict[str, tuple[int, str]]

    def result(self, name: str, precision: str = "") -> dict[str, Any]:
        """``name``'s result.pt, made by the phase that resumed it (or by ``baseline``)."""
        phase = self.resumed.get(name) or self.stopped[name]
        code, output = phase
        path = self.root / name / precision / "result.pt"
        assert path.exists(), f"{name} exited with {code}:\n{output}"
        return torch.load(path, weights_only=False)

    def saved_state(self, name: str, precision: str = "") -> dict[str, Any]:
        """The callback's state in the checkpoint the stopped phase of ``name`` left."""
        path = self.root / name / precision / "gradvault" / "gradvault-last.ckpt"
        code, output = self.stopped[name]
        assert path.exists(), f"{name} exited with {code}:\n{output}"
        checkpoint = torch.load(path, weights_only=True)
        return checkpoint["callbacks"]["GradvaultCallback"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every run of the module: the stops side by side, then the resumes side by side."""
    root = tmp_path_factory.mktemp("lightning-runs")
    stops = {
        "baseline": start("baseline", root / "baseline", "--precision", ALL_PRECISIONS),
        "sigterm": start(
            "sigterm",
            root / "sigterm",
            "--precision",
            ALL_PRECISIONS,
            "--stop",
            str(SIGTERM_AT),
            sigterms=len(PRECISIONS),
        ),
        # every=4 over windows of 3: micro-batch 8 (global_step 2, the window's second) is
        # due; the process kills itself at the start of the next one, in epoch 0
        "every": start("every", root / "every", "--every", "4", "--stop", "7"),
        "stock": start("stock-sigterm", root / "stock", "--stop", str(SIGTERM_AT), sigterms=1),
        # micro-batch 9 is epoch 0's last, alone in the epoch's shortened window
        "epoch-end": start("sigterm", root / "epoch-end", "--stop", "9", sigterms=1),
        "ddp-baseline": start("baseline", root / "ddp-baseline", "--processes", "2"),
        "ddp": start(
            "sigterm", root / "ddp", "--processes", "2", "--stop", str(SIGTERM_AT), sigterms=1
        ),
    }
    stopped = finish_all(stops)
    resumes = {
        "sigterm": start("resume", root / "sigterm", "--precision", ALL_PRECISIONS),
        "every": start("resume", root / "every"),
        "stock": start("stock-resume", root / "stock"),
        "epoch-end": start("resume", root / "epoch-end"),
        "ddp": start("resume", root / "ddp", "--processes", "2"),
    }
    return Runs(root, stopped, finish_all(resumes))


def assert_bit_identical(expected: dict[str, Any], found: dict[str, Any]) -> None:
    assert found["global_step"] == expected["global_step"] == MAX_STEPS
    assert expected["params"].keys() == found["params"].keys()
    for name, value in expected["params"].items():
        assert torch.equal(value, found["params"][name]), name
    expected_state, found_state = expected["optimizer"]["state"], found["optimizer"]["state"]
    assert expected_state.keys() == found_state.keys()
    for index, slots in expected_state.items():
        for slot, value in slots.items():
            assert torch.equal(value, found_state[index][slot]), (index, slot)
    assert expected["optimizer"]["param_groups"] == found["optimizer"]["param_groups"]
    assert expected["scheduler"] == found["scheduler"]
    assert len(expected["logged"]) == MAX_STEPS
    assert expected["logged"] == found["logged"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sigterm_mid_window_resumes_bit_identical(runs: Runs, precision: str) -> None:
    # Lightning stops a run on SIGTERM with SIGTERMException (a SystemExit, status 0)
    assert runs.stopped["sigterm"][0] == 0, runs.stopped["sigterm"][1]
    state = runs.saved_state("sigterm", precision)
    # stopped after the second micro-batch of a window of three, inside epoch 1
    assert (state["epoch"], state["batches_done"], state["micro_step"]) == (1, 5, 2)
    assert state["snapshot_id"] is not None
    assert (state["scale"] is not None) == (precision == "16-mixed")
    assert runs.resumed["sigterm"][0] == 0, runs.resumed["sigterm"][1]
    assert_bit_identical(runs.result("baseline", precision), runs.result("sigterm", precision))


def test_every_snapshot_then_kill_resumes_bit_identical(runs: Runs) -> None:
    assert runs.stopped["every"][0] == -signal.SIGKILL, runs.stopped["every"][1]
    state = runs.saved_state("every")
    assert (state["epoch"], state["global_step"], state["micro_step"]) == (0, 2, 2)
    assert runs.resumed["every"][0] == 0, runs.resumed["every"][1]
    assert_bit_identical(runs.result("baseline", "32-true"), runs.result("every"))


def test_sigterm_in_an_epochs_last_micro_batch_resumes_bit_identical(runs: Runs) -> None:
    """The window ends there: a checkpoint without a snapshot; the resumed run makes the next
    epoch's iterator from the generators the stopped run made it from."""
    assert runs.stopped["epoch-end"][0] == 0, runs.stopped["epoch-end"][1]
    state = runs.saved_state("epoch-end")
    assert (state["epoch"], state["batches_done"], state["micro_step"]) == (0, 10, 0)
    assert state["snapshot_id"] is None
    assert runs.resumed["epoch-end"][0] == 0, runs.resumed["epoch-end"][1]
    assert_bit_identical(runs.result("baseline", "32-true"), runs.result("epoch-end"))


def test_ddp_sigterm_mid_window_resumes_bit_identical(runs: Runs) -> None:
    """Two ranks (gloo): the SIGTERM reaches rank 0; both snapshot their own unreduced sums
    as the shards of one snapshot and stop; both resume from them."""
    assert runs.stopped["ddp"][0] == 0, runs.stopped["ddp"][1]
    state = runs.saved_state("ddp")
    assert (state["epoch"], state["batches_done"], state["micro_step"]) == (1, 5, 2)
    assert state["world_size"] == 2 and len(state["rng_by_rank"]) == 2
    assert state["snapshot_id"] is not None
    assert runs.resumed["ddp"][0] == 0, runs.resumed["ddp"][1]
    assert_bit_identical(runs.result("ddp-baseline"), runs.result("ddp"))


def test_lightning_own_resume_from_the_same_place_differs(runs: Runs) -> None:
    """The control: OnExceptionCheckpoint saves at the same SIGTERM; Lightning's resume
    restarts the epoch's data from its first batch and loses the window's gradients (and
    deletes its checkpoint once the resumed fit ends)."""
    assert runs.stopped["stock"][0] == 0, runs.stopped["stock"][1]
    assert runs.resumed["stock"][0] == 0, runs.resumed["stock"][1]
    expected, found = runs.result("baseline", "32-true"), runs.result("stock")
    assert found["global_step"] == expected["global_step"]
    differing = [
        name
        for name, value in expected["params"].items()
        if not torch.equal(value, found["params"][name])
    ]
    assert differing == list(expected["params"])
    assert expected["logged"] != found["logged"]
