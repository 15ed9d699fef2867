"""Resuming with a collator that draws random numbers, and from every kind of resume point.

transformers' masked-LM collator masks 15% of the tokens with torch's global generator,
and accelerate's data loader collates a batch ahead of the one it yields: a window's first
batch is collated during the window before's prefetch. 46 sequences in batches of 2 give
23 micro-batches an epoch, windows of 8, 8 and 7 (the Trainer shortens an epoch's last
window), so step 2 is a window in the middle of an epoch, step 3 the short window that ends
it (the resumed run crosses into the next epoch), step 4 the first window of an epoch. Each
stopped run and its resume must end bit for bit where a run that never stopped ends.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

from tests.integrations.runs import assert_bit_identical, in_process, result  # noqa: E402
from tests.integrations.test_transformers_resume import (  # noqa: E402
    phase,
    resume_state,
    sigterm_during,
)

MASKED = ("--collator", "mask", "--count", "46")


@pytest.fixture(scope="module")
def masked_baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run with the masking collator (stock Trainer)."""
    out = tmp_path_factory.mktemp("masked-baseline")
    in_process("baseline", "--out", str(out), *MASKED)
    expected = result(out)
    assert [entry["step"] for entry in expected["logged"]] == [2, 4]
    return expected


def resume_masked(out: Path, store: str) -> dict[str, Any]:
    in_process("resume", "--out", str(out), "--store", store, *MASKED)
    return result(out)


@pytest.mark.parametrize(
    ("step", "micro", "window_size", "first_in_epoch", "collated_ahead"),
    [
        pytest.param(2, 5, 8, False, 1, id="mid-epoch"),
        pytest.param(4, 3, 8, True, 0, id="first-window-of-an-epoch"),
        pytest.param(3, 5, 7, False, 1, id="last-window-of-an-epoch"),
    ],
)
def test_masking_collator_sigterm_mid_window_resumes_bit_identical(
    tmp_path: Path,
    masked_baseline: dict[str, Any],
    step: int,
    micro: int,
    window_size: int,
    first_in_epoch: bool,
    collated_ahead: int,
) -> None:
    store = str(tmp_path / "store")
    sigterm_during(tmp_path, store, step=step, micro=micro, extra=MASKED)
    assert result(tmp_path)["stopped_by_signal"] is True
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"]) == (step - 1, micro)
    assert state["window_size"] == window_size
    assert state["first_in_epoch"] is first_in_epoch
    # the states before the collates of the window's batches collated ahead of its prefetch
    assert len(state["collated_ahead"]) == collated_ahead

    assert_bit_identical(masked_baseline, resume_masked(tmp_path, store))


def test_masking_collator_sigterm_in_the_last_micro_batch_resumes_bit_identical(
    tmp_path: Path, masked_baseline: dict[str, Any]
) -> None:
    """The step finishes and a normal checkpoint-2 is saved; resuming from it is exact."""
    store = str(tmp_path / "store")
    sigterm_during(tmp_path, store, step=2, micro=8, extra=MASKED)
    stopped = result(tmp_path)
    assert (stopped["stopped_by_signal"], stopped["global_step"]) == (True, 2)
    run_dir = tmp_path / "run"
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-2"]
    logging_state = json.loads((run_dir / "checkpoint-2" / "gradvault_logging.json").read_text())
    assert len(logging_state["collated_ahead"]) == 1  # step 3's first batch

    assert_bit_identical(masked_baseline, resume_masked(tmp_path, store))


def test_every_multiple_of_the_accumulation_saves_checkpoints_and_warns(
    tmp_path: Path, masked_baseline: dict[str, Any]
) -> None:
    """every=16 with accumulation 8: each 16th micro-batch ends a window, so each place to
    resume from is a checkpoint-N (steps 2 and 4), and a warning says no snapshot is taken
    inside a window. Killed once checkpoint-2 is saved, the run resumes from it exactly."""
    store = str(tmp_path / "store")
    killed = phase(
        "every", tmp_path, store, "--every", "16", "--step", "2", "--kill-after-save", *MASKED
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert (
        "GradvaultCallback(every=16) with gradient_accumulation_steps=8: every 16-th "
        "micro-batch ends a window"
    ) in killed.stderr
    run_dir = tmp_path / "run"
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-2"]

    assert_bit_identical(masked_baseline, resume_masked(tmp_path, store))
