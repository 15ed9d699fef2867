"""What the Trainer integration refuses, says, and lists: setups it cannot resume exactly,
resume folders that do not fit, failing targets, and snapshots seen through the service."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

import torch  # noqa: E402 - after the skips
from transformers import Trainer  # noqa: E402

from gradvault.client import Client  # noqa: E402
from gradvault.core import (  # noqa: E402
    DtypeMismatchError,
    InvalidArgumentError,
    InvalidFieldError,
    Recorder,
    SnapshotNotFoundError,
)
from gradvault.integrations.transformers import (  # noqa: E402
    GradvaultCallback,
    GradvaultTrainer,
    ResumeStateError,
    UnsupportedSetupError,
    latest_checkpoint,
)
from gradvault.service import Settings, create_app  # noqa: E402
from tests.integrations import hf_run  # noqa: E402
from tests.integrations.runs import assert_bit_identical, in_process, result  # noqa: E402
from tests.service.conftest import UvicornThread  # noqa: E402


def trainer_for(
    tmp_path: Path, callbacks: list[Any], trainer_class: type[Trainer] = GradvaultTrainer
) -> Trainer:
    return hf_run.make_trainer(trainer_class, tmp_path / "run", "fp32", callbacks)


# ---------------------------------------------------------------------- the callback's arguments
@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"every": 0}, ValueError, "every must be an int >= 1"),
        ({"every": 2.0}, TypeError, "every must be an int >= 1"),
        ({"every": True}, TypeError, "every must be an int >= 1"),
        ({"on_sigterm": 1}, TypeError, "on_sigterm must be True or False"),
        ({"run": ""}, InvalidFieldError, "run"),
        ({"keep_last": -1}, ValueError, "keep_last"),
    ],
)
def test_callback_refuses_bad_arguments(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        GradvaultCallback(str(tmp_path / "store"), **options)


def test_keep_last_is_for_a_store_only() -> None:
    with pytest.raises(ValueError, match="keep_last is a store's retention"):
        GradvaultCallback("http://127.0.0.1:8000", keep_last=2)


@pytest.mark.parametrize(("target", "error"), [(3, TypeError), ("", ValueError)])
def test_callback_refuses_a_target_that_is_no_location(target: Any, error: type) -> None:
    with pytest.raises(error, match="target"):
        GradvaultCallback(target)


def test_callback_reads_its_target_as_the_client_and_the_command_line_do(
    tmp_path: Path,
) -> None:
    """gradvault.client.Target decides: a URL scheme in any case, refused when made."""
    assert GradvaultCallback("HTTP://127.0.0.1:8000").target.is_service
    with pytest.raises(InvalidArgumentError, match="got 'ftp://host/x'"):
        GradvaultCallback("ftp://host/x")  # not at the first snapshot
    with pytest.raises(InvalidArgumentError, match="a token is for a service URL"):
        GradvaultCallback(str(tmp_path / "store"), token="t0k")  # not silently dropped


# ---------------------------------------------------------------------- setups refused
def test_callback_on_a_stock_trainer_is_refused(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, [GradvaultCallback(str(tmp_path / "store"))], Trainer)
    with pytest.raises(UnsupportedSetupError, match="GradvaultTrainer"):
        trainer.train()


def test_trainer_without_the_callback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        UnsupportedSetupError, match="exactly one GradvaultCallback among its callbacks; found 0"
    ):
        trainer_for(tmp_path, []).train()


@pytest.mark.parametrize(
    ("attribute", "words"),
    [("is_fsdp_enabled", "FSDP"), ("is_deepspeed_enabled", "DeepSpeed")],
)
def test_sharded_training_is_refused(tmp_path: Path, attribute: str, words: str) -> None:
    trainer = trainer_for(tmp_path, [GradvaultCallback(str(tmp_path / "store"))])
    setattr(trainer, attribute, True)  # what accelerate sets for such a run
    with pytest.raises(UnsupportedSetupError, match=words):
        trainer.train()
    # refused before anything was written
    assert not (tmp_path / "store").exists()
    assert not list((tmp_path / "run").glob("*checkpoint*"))


def test_jit_checkpoint_and_sigterm_snapshots_are_not_both_taken(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, [GradvaultCallback(str(tmp_path / "store"))])
    trainer.args.enable_jit_checkpoint = True
    with pytest.raises(UnsupportedSetupError, match="enable_jit_checkpoint"):
        trainer.train()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bfloat16_parameters_on_cuda_are_refused(tmp_path: Path) -> None:
    """CuPy has no bfloat16: the core shares bfloat16 gradients on the cpu only."""
    trainer = GradvaultTrainer(
        model=hf_run.tiny_gpt2("bf16-params"),
        args=dataclasses.replace(hf_run.training_args(tmp_path / "run"), use_cpu=False),
        train_dataset=hf_run.Sequences(),
        callbacks=[GradvaultCallback(str(tmp_path / "store"))],
    )
    with pytest.raises(
        UnsupportedSetupError, match=r"'transformer\.wte\.weight' is bfloat16 on cuda:0"
    ):
        trainer.train()
    assert not (tmp_path / "store").exists()


# ---------------------------------------------------------------------- resume folders
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after micro-batch 7 of step 1, snapshotted there (every 7)."""
    out = tmp_path_factory.mktemp("saved")
    in_process(
        "stop", "--out", str(out), "--store", str(out / "store"), "--step", "1", "--micro", "7"
    )
    return out


@pytest.fixture
def saved(saved_run: Path, tmp_path: Path) -> Path:
    """A copy of ``saved_run`` (its store and its run folder) for one test to spoil."""
    shutil.copytree(saved_run, tmp_path, dirs_exist_ok=True)
    return tmp_path


def resume(saved: Path, callbacks: list[Any] | None = None, **arguments: Any) -> Trainer:
    callback = GradvaultCallback(str(saved / "store"))
    trainer = trainer_for(saved, [callback, *(callbacks or [])])
    for name, value in arguments.items():
        setattr(trainer.args, name, value)
    trainer.train(resume_from_checkpoint=str(saved / "run" / "gradvault-checkpoint-0"))
    return trainer


def state_file(saved: Path) -> Path:
    return saved / "run" / "gradvault-checkpoint-0" / "gradvault_resume.json"


def test_saved_run_is_what_the_tests_expect(saved: Path) -> None:
    state = json.loads(state_file(saved).read_text())
    assert (state["global_step"], state["micro_step"]) == (0, 7)
    assert latest_checkpoint(saved / "run") == saved / "run" / "gradvault-checkpoint-0"


def test_folder_whose_snapshot_never_committed_is_refused(saved: Path) -> None:
    state_file(saved).unlink()
    with pytest.raises(ResumeStateError, match="never committed"):
        resume(saved)
    assert latest_checkpoint(saved / "run") is None


def test_unreadable_state_file_is_refused(saved: Path) -> None:
    state_file(saved).write_text("{not json")
    with pytest.raises(ResumeStateError, match="cannot be read as JSON"):
        resume(saved)


def test_state_file_with_a_wrong_micro_step_is_refused(saved: Path) -> None:
    state = json.loads(state_file(saved).read_text())
    state["micro_step"] = 8
    state_file(saved).write_text(json.dumps(state))
    with pytest.raises(ResumeStateError, match="micro_step 8 is not inside a window of 8"):
        resume(saved)


def test_other_accumulation_is_refused(saved: Path) -> None:
    before = state_file(saved).read_bytes()
    with pytest.raises(ResumeStateError, match="gradient_accumulation_steps=8; this run has 4"):
        resume(saved, gradient_accumulation_steps=4)
    assert state_file(saved).read_bytes() == before  # nothing lost


def test_ignore_data_skip_is_refused(saved: Path) -> None:
    with pytest.raises(UnsupportedSetupError, match="ignore_data_skip"):
        resume(saved, ignore_data_skip=True)


def test_snapshot_missing_from_the_store_is_named(saved: Path) -> None:
    snapshot_id = json.loads(state_file(saved).read_text())["snapshot_id"]
    with Recorder(str(saved / "store")) as recorder:
        recorder.sync.delete(snapshot_id)
    with pytest.raises(SnapshotNotFoundError, match=snapshot_id):
        resume(saved)


def test_float32_snapshot_into_a_bfloat16_model_is_refused(saved: Path) -> None:
    """The gradients must be the parameters' dtype: checked when they would be put back."""
    trainer = hf_run.make_trainer(
        GradvaultTrainer, saved / "run", "bf16-params", [GradvaultCallback(str(saved / "store"))]
    )
    with pytest.raises(
        DtypeMismatchError, match=r"has dtype float32; the module's parameter .* has torch.bfloat16"
    ):
        trainer.train(resume_from_checkpoint=str(saved / "run" / "gradvault-checkpoint-0"))
    assert all(param.grad is None for param in trainer.model.parameters())  # none was set


def test_other_data_is_refused(saved: Path) -> None:
    callback = GradvaultCallback(str(saved / "store"))
    trainer = GradvaultTrainer(
        model=hf_run.tiny_gpt2(),
        args=hf_run.training_args(saved / "run"),
        train_dataset=hf_run.Sequences(seed=99),
        callbacks=[callback],
    )
    with pytest.raises(ResumeStateError, match="another window for step 1"):
        trainer.train(resume_from_checkpoint=str(saved / "run" / "gradvault-checkpoint-0"))


def test_latest_checkpoint_orders_both_kinds(tmp_path: Path) -> None:
    for name in ("checkpoint-2", "gradvault-checkpoint-2", "gradvault-checkpoint-3"):
        (tmp_path / name).mkdir()
    (tmp_path / "gradvault-checkpoint-2" / "gradvault_resume.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == tmp_path / "gradvault-checkpoint-2"  # 3 is incomplete
    (tmp_path / "checkpoint-3").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-3"
    assert latest_checkpoint(tmp_path / "absent") is None


def test_latest_checkpoint_needs_every_ranks_state_file(tmp_path: Path) -> None:
    """With several processes a folder is complete once each has written its state file."""
    folder = tmp_path / "gradvault-checkpoint-4"
    folder.mkdir()
    (tmp_path / "checkpoint-4").mkdir()
    (folder / "gradvault_resume_rank1.json").write_text(json.dumps({"world_size": 2}))
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-4"  # rank 0 never wrote
    (folder / "gradvault_resume_rank0.json").write_text(json.dumps({"world_size": 2}))
    assert latest_checkpoint(tmp_path) == folder


def test_a_service_target_with_several_processes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = trainer_for(tmp_path, [GradvaultCallback("http://127.0.0.1:9")])
    monkeypatch.setattr(type(trainer.args), "world_size", property(lambda args: 2))
    with pytest.raises(UnsupportedSetupError, match="2 processes commit one snapshot together"):
        trainer.train()


# ---------------------------------------------------------------------- failures and the service
def test_failing_target_is_reported_and_training_goes_on(tmp_path: Path) -> None:
    not_a_store = tmp_path / "file"
    not_a_store.write_text("a file, not a store")
    callback = GradvaultCallback(str(not_a_store), every=7)
    trainer = trainer_for(tmp_path, [callback])
    trainer.train()
    assert trainer.state.global_step == hf_run.MAX_STEPS
    assert callback.failures >= 1 and callback.snapshot_ids == []
    assert latest_checkpoint(tmp_path / "run") is None  # no folder is complete


def test_snapshots_are_listed_and_resumed_through_the_service(
    tmp_path: Path,
    baseline: dict[str, Any],  # noqa: F811 - the module fixture
) -> None:
    server = UvicornThread(
        create_app(Settings(store=str(tmp_path / "store"), index_refresh_seconds=0))
    )
    server.start()
    try:
        url = server.base_url
        in_process("stop", "--out", str(tmp_path), "--store", url, "--step", "3", "--micro", "5")
        stopped = result(tmp_path)
        with Client(url) as client:
            listed = list(client.list(run="run"))
            assert [summary.id for summary in reversed(listed)] == stopped["snapshot_ids"]
            assert [summary.step for summary in listed] == [2, 1, 0]
            newest = client.info(listed[0].id)
        assert newest["tags"] == {
            "framework": "transformers",
            "global_step": "2",
            "micro_step": "5",
            "window_size": "8",
            "folder": "gradvault-checkpoint-2",
        }
        names = {gradient["name"] for gradient in newest["gradients"]}
        assert names == set(dict(hf_run.tiny_gpt2().named_parameters()))
        # the gradvault command lists them like any other snapshot
        shown = subprocess.run(
            [sys.executable, "-m", "gradvault", "ls", "--url", url, "--run", "run", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        assert [entry["id"] for entry in json.loads(shown.stdout)] == [s.id for s in listed]

        in_process("resume", "--out", str(tmp_path), "--store", url)
        assert_bit_identical(baseline, result(tmp_path))
    finally:
        server.stop()


def test_resume_into_another_output_folder_copies_the_step_checkpoint(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    """Resumed from a folder elsewhere, a snapshot in the same window writes a folder of its
    own from the one resumed from; resuming from that one is exact too."""
    first, second, store = tmp_path / "first", tmp_path / "second", str(tmp_path / "store")
    stop = ["--step", "1", "--micro", "3", "--every", "3"]
    in_process("stop", "--out", str(first), "--store", store, *stop)
    source = first / "run" / "gradvault-checkpoint-0"
    assert json.loads((source / "gradvault_resume.json").read_text())["micro_step"] == 3

    resumed = ["--resume-from", str(source), "--every", "1", "--stop", "--step", "1"]
    in_process("resume", "--out", str(second), "--store", store, *resumed, "--micro", "5")
    copied = second / "run" / "gradvault-checkpoint-0"
    assert json.loads((copied / "gradvault_resume.json").read_text())["micro_step"] == 5
    for name in ("model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"):
        assert (copied / name).read_bytes() == (source / name).read_bytes(), name

    in_process("resume", "--out", str(second), "--store", store)
    assert_bit_identical(baseline, result(second))


def test_exported_names_are_pinned() -> None:
    import gradvault.integrations.transformers as integration

    assert sorted(integration.__all__) == [
        "FOLDER_PREFIX",
        "GradvaultCallback",
        "GradvaultTrainer",
        "GradvaultTrainerMixin",
        "IntegrationError",
        "ResumeStateError",
        "STATE_FILE",
        "UnsupportedSetupError",
        "latest_checkpoint",
    ]
    for name in integration.__all__:
        assert hasattr(integration, name), name


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("losses", 3, "losses is int; expected list"),
        ("snapshot_id", None, "snapshot_id is NoneType; expected str"),
        ("scaler", [], "scaler is list; expected dict or NoneType"),
        ("rng_at_micro_step", {"python": 1}, "random generator states are malformed"),
        ("collated_ahead", 3, "collated_ahead is int; expected list or NoneType"),
        ("collated_ahead", [{"cpu": "00"}], "random generator states are malformed"),
    ],
)
def test_state_file_fields_of_the_wrong_kind_are_refused(
    saved: Path, field: str, value: Any, words: str
) -> None:
    state = json.loads(state_file(saved).read_text())
    state[field] = value
    state_file(saved).write_text(json.dumps(state))
    with pytest.raises(ResumeStateError, match=words):
        resume(saved)


def test_malformed_saved_loss_is_refused(saved: Path) -> None:
    state = json.loads(state_file(saved).read_text())
    state["losses"][0]["dtype"] = "floaty"
    state_file(saved).write_text(json.dumps(state))
    with pytest.raises(ResumeStateError, match="a saved tensor is malformed"):
        resume(saved)


@pytest.mark.parametrize(
    ("logging_state", "words"),
    [
        ({"format": 1, "globalstep_last_logged": 0}, "has format 1; this release reads 2"),
        ({"format": 2, "globalstep_last_logged": 0}, "lacks collated_ahead, rng_at_save, tr_loss"),
        ("[]", "has format 'list'; this release reads 2"),
    ],
)
def test_checkpoint_logging_state_that_does_not_fit_is_refused(
    tmp_path: Path, logging_state: Any, words: str
) -> None:
    """A checkpoint-N's gradvault_logging.json of another release, or incomplete, is named
    before training starts."""
    folder = tmp_path / "run" / "checkpoint-2"
    folder.mkdir(parents=True)
    text = logging_state if isinstance(logging_state, str) else json.dumps(logging_state)
    (folder / "gradvault_logging.json").write_text(text)
    trainer = trainer_for(tmp_path, [GradvaultCallback(str(tmp_path / "store"))])
    with pytest.raises(ResumeStateError, match=words):
        trainer.train(resume_from_checkpoint=str(folder))
