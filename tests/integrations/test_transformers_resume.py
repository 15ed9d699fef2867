"""Resuming a Hugging Face Trainer run inside an accumulation window, bit for bit.

Each interrupted run and each resume is its own process (``tests/integrations/hf_run.py``,
forked from a process that has imported it: ``tests/integrations/processes.py``):
a tiny GPT-2 with dropout, accumulation 8, stopped after micro-batch 5 of step 3 by the
callback's ``every=`` snapshot and a SIGKILL, or by a real SIGTERM, and resumed in a
fresh process. Final parameters, optimizer state and logged losses must equal, bit for
bit, those of a run that never stopped; the stock Trainer's resume must not. In float32,
float16 and bfloat16 autocast, and with the model itself in bfloat16.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

import torch  # noqa: E402 - after the skips

from gradvault.core import Recorder  # noqa: E402
from tests.integrations import hf_run, processes  # noqa: E402
from tests.integrations.runs import assert_bit_identical, in_process, result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PHASE_TIMEOUT_SECONDS = 300


def phase(mode: str, out: Path, store: str = "", *extra: str) -> subprocess.CompletedProcess[str]:
    """Run one training phase in its own process; its exit status is the caller's to check."""
    return processes.run(
        [mode, "--out", str(out)] + (["--store", store] if store else []) + list(extra),
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=PHASE_TIMEOUT_SECONDS,
    )


def ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


def sigterm_during(
    out: Path,
    store: str,
    *,
    micro: int,
    step: int = 3,
    mode: str = "sigterm",
    extra: tuple[str, ...] = (),
    cwd: Path = REPO,
) -> None:
    """Run the ``mode`` phase and send it a real SIGTERM in micro-batch ``micro`` of ``step``."""
    with processes.started(
        [mode, "--out", str(out)]
        + (["--store", store] if store else [])
        + ["--step", str(step), "--micro", str(micro), *extra],
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    ) as process:
        for line in process.stdout:  # READY: the micro-batch has begun, and waits for us
            if line.strip() == "READY":
                os.kill(process.pid, signal.SIGTERM)
                break
        assert process.wait(PHASE_TIMEOUT_SECONDS) == 0


def resume_state(run_dir: Path) -> dict[str, Any]:
    (folder,) = run_dir.glob("gradvault-checkpoint-*")
    return json.loads((folder / "gradvault_resume.json").read_text())


def assert_gradients_round_trip(
    out: Path, store: str, snapshot_id: str, dtype: torch.dtype
) -> None:
    """Snapshot ``snapshot_id`` holds each ``.grad`` as the killed run had it (its dtype, its
    bytes), and the resume put exactly those back before its first micro-batch."""
    at_snapshot = torch.load(out / "grads_at_snapshot.pt")
    restored = torch.load(out / "grads_restored.pt")
    assert at_snapshot.keys() == restored.keys() == set(dict(hf_run.tiny_gpt2().named_parameters()))
    with Recorder(store) as recorder:
        record = recorder.sync.fetch(snapshot_id)
    saved = {entry.name: entry for entry in record}
    assert saved.keys() == at_snapshot.keys()
    for name, grad in at_snapshot.items():
        assert grad is not None and grad.dtype == dtype, (name, grad)
        assert saved[name].dtype == str(dtype).removeprefix("torch."), name
        assert saved[name].shape == tuple(grad.shape), name
        assert bytes(saved[name].data) == grad.view(torch.uint8).numpy().tobytes(), name
        assert restored[name].dtype == dtype, name
        assert torch.equal(restored[name].view(torch.uint8), grad.view(torch.uint8)), name


def differs_from(expected: dict[str, Any], found: dict[str, Any]) -> bool:
    """Whether any final parameter of ``found`` is not that of ``expected``."""
    return any(
        not torch.equal(value, found["params"][name]) for name, value in expected["params"].items()
    )


def test_every_snapshot_then_kill_resumes_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    store = str(tmp_path / "store")
    killed = phase("every", tmp_path, store, "--step", "3", "--micro", "5")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"], state["window_size"]) == (2, 5, 8)
    assert not state["first_in_epoch"]  # step 3 is the last window of the first epoch
    assert len(state["losses"]) == 5
    assert not (tmp_path / "run" / "gradvault-checkpoint-1").exists()  # pruned

    ok(phase("resume", tmp_path, store))
    assert_gradients_round_trip(tmp_path, store, state["snapshot_id"], torch.float32)
    resumed = result(tmp_path)
    assert_bit_identical(baseline, resumed)
    assert resumed["snapshot_ids"]  # it went on snapshotting (every 7 micro-batches)


def test_bfloat16_model_resumes_bit_identical(tmp_path: Path, baseline: dict[str, Any]) -> None:
    """The model itself in bfloat16: its ``.grad`` is bfloat16, snapshotted and put back as
    such, stopped after micro-batch 5 of step 3 and resumed in a fresh process."""
    ok(phase("baseline", tmp_path / "baseline", "", "--precision", "bf16-params"))
    expected = result(tmp_path / "baseline")
    assert {value.dtype for value in expected["params"].values()} == {torch.bfloat16}

    store = str(tmp_path / "store")
    stop = ["--precision", "bf16-params", "--step", "3", "--micro", "5"]
    killed = phase("every", tmp_path, store, *stop)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"], state["window_size"]) == (2, 5, 8)
    assert len(state["losses"]) == 5

    ok(phase("resume", tmp_path, store, "--precision", "bf16-params"))
    assert_gradients_round_trip(tmp_path, store, state["snapshot_id"], torch.bfloat16)
    resumed = result(tmp_path)
    assert_bit_identical(expected, resumed)
    slots = {
        value.dtype for slots in resumed["optimizer"]["state"].values() for value in slots.values()
    }
    assert torch.bfloat16 in slots  # AdamW's moments, in the parameters' dtype


def test_sigterm_mid_window_snapshots_stops_and_resumes_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    store = str(tmp_path / "store")
    sigterm_during(tmp_path, store, micro=5)
    stopped = result(tmp_path)
    assert stopped["stopped_by_signal"] is True
    assert stopped["global_step"] == 2  # stopped inside step 3's window
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"]) == (2, 5)
    assert not list((tmp_path / "run").glob("checkpoint-*"))

    ok(phase("resume", tmp_path, store))
    assert_bit_identical(baseline, result(tmp_path))


def test_sigterm_in_the_last_micro_batch_finishes_the_step_and_saves_checkpoint(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    store = str(tmp_path / "store")
    sigterm_during(tmp_path, store, micro=8)
    stopped = result(tmp_path)
    assert stopped["stopped_by_signal"] is True
    assert stopped["global_step"] == 3
    assert stopped["snapshot_ids"] == []
    run_dir = tmp_path / "run"
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-3"]
    assert (run_dir / "checkpoint-3" / "gradvault_logging.json").is_file()

    ok(phase("resume", tmp_path, store))
    assert_bit_identical(baseline, result(tmp_path))


def test_fp16_autocast_and_grad_scaler_resume_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    """float16 autocast and a GradScaler on the CPU, stopped in the first window of an epoch."""
    ok(phase("baseline", tmp_path / "baseline", "", "--precision", "fp16"))
    expected = result(tmp_path / "baseline")
    assert expected["scaler"]["scale"] > 2.0**10  # the scale moved during the run
    assert differs_from(baseline, expected), "fp16 autocast changed nothing: it did not run"

    store = str(tmp_path / "store")
    stop = ["--precision", "fp16", "--step", "4", "--micro", "4"]
    killed = phase("every", tmp_path, store, *stop)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"]) == (3, 4)
    assert state["first_in_epoch"]  # step 4 opens the second epoch
    assert state["scaler"]["scale"] == 2.0**13

    ok(phase("resume", tmp_path, store, "--precision", "fp16"))
    assert_bit_identical(expected, result(tmp_path))


def test_bf16_autocast_resume_bit_identical(tmp_path: Path, baseline: dict[str, Any]) -> None:
    """``TrainingArguments(bf16=True)``: bfloat16 autocast (accelerate runs it on the CPU),
    float32 parameters and gradients; stopped in the first window of an epoch."""
    ok(phase("baseline", tmp_path / "baseline", "", "--precision", "bf16"))
    expected = result(tmp_path / "baseline")
    assert {value.dtype for value in expected["params"].values()} == {torch.float32}
    assert expected["scaler"] is None  # bfloat16 needs no loss scaling
    assert differs_from(baseline, expected), "bf16 autocast changed nothing: it did not run"

    store = str(tmp_path / "store")
    killed = phase("every", tmp_path, store, "--precision", "bf16", "--step", "4", "--micro", "4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    state = resume_state(tmp_path / "run")
    assert (state["global_step"], state["micro_step"]) == (3, 4)
    assert state["first_in_epoch"]

    ok(phase("resume", tmp_path, store, "--precision", "bf16"))
    assert_gradients_round_trip(tmp_path, store, state["snapshot_id"], torch.float32)
    assert_bit_identical(expected, result(tmp_path))


def test_stock_trainer_resume_is_not_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    """The control: a checkpoint taken in the same place and resumed the stock way drifts."""
    in_process("stock-stop", "--out", str(tmp_path), "--step", "3", "--micro", "5")
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["checkpoint-2"]
    in_process("stock-resume", "--out", str(tmp_path))
    resumed = result(tmp_path)
    assert resumed["global_step"] == hf_run.MAX_STEPS
    differing = [
        name
        for name, value in baseline["params"].items()
        if not torch.equal(value, resumed["params"][name])
    ]
    assert differing


def test_readme_example_starts_fresh_then_resumes_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    """The README's Hugging Face example as it stands (docs/INTEGRATIONS.md shows the same
    code), run twice in one folder: a first run, with nothing to resume from, stopped by a
    SIGTERM in micro-batch 3 of step 4, then the same code again, which resumes there."""
    example = hf_run.readme_example()
    assert example == hf_run.readme_example(REPO / "docs" / "INTEGRATIONS.md", "### Two lines")
    sigterm_during(tmp_path, "", step=4, micro=3, mode="readme", extra=("--sigterm",))
    stopped = result(tmp_path)
    assert (stopped["stopped_by_signal"], stopped["global_step"]) == (True, 3)
    assert resume_state(tmp_path / "run")["micro_step"] == 3

    ok(phase("readme", tmp_path))
    resumed = result(tmp_path)
    assert resumed["stopped_by_signal"] is False
    assert_bit_identical(baseline, resumed)
