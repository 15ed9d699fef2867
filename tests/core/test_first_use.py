"""What a new user tries first: each mistake is refused at once, with an error that says why.

Every test here names a trap: an input that used to be taken silently, or refused with an
error outside gradvault's error tree, or only much later.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import (
    DeviceError,
    GradientsAccumulator,
    GradientsParams,
    GradvaultError,
    InvalidArgumentError,
    ParamId,
    ParamIdMismatchError,
    Recorder,
    StoreNotFoundError,
)

ROOT = Path(__file__).resolve().parents[2]


def _model_and_grads() -> tuple[gv.Module, GradientsParams]:
    model = gv.MLP(3, [4], 2)
    loss = model(gv.randn(2, 3)).sum()
    return model, GradientsParams.from_grads(loss.backward(), model)


def test_accumulating_gradients_of_another_model_raises_naming_the_ids() -> None:
    model, _ = _model_and_grads()
    other, foreign = _model_and_grads()  # another model's ParamIds: its record was not loaded
    accumulator = GradientsAccumulator()
    with pytest.raises(ParamIdMismatchError) as raised:
        accumulator.accumulate(model, foreign)
    message = str(raised.value)
    for param_id in foreign:
        assert str(param_id) in message
    assert "load_record" in message
    assert len(accumulator) == 0  # nothing half-added


def test_accumulating_a_subset_of_the_model_gradients_is_fine() -> None:
    model, grads = _model_and_grads()
    first = next(iter(grads))
    subset = GradientsParams()
    subset.register(first, grads.get(first), name=grads.name(first))
    accumulator = GradientsAccumulator()
    accumulator.accumulate(model, subset)
    assert list(accumulator.current()) == [first]


def test_a_numpy_integer_step_is_taken(tmp_path: Path) -> None:
    _, grads = _model_and_grads()
    with Recorder(tmp_path / "store") as recorder:
        info = recorder.sync.snapshot(grads, run="r", step=np.int64(3))
        assert info.step == 3 and type(info.step) is int
    for refused in (True, np.bool_(True), 3.0, np.float64(3)):
        with pytest.raises(gv.InvalidFieldError, match="step"):
            gv.record_rules.check_snapshot_fields("r", refused, None)


def test_an_unknown_compression_is_refused_when_the_recorder_is_built(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="gzip") as raised:
        Recorder(tmp_path / "store", compression="gzip")
    assert isinstance(raised.value, ValueError)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("text", ["s3:/typo/prefix", "s3:typo", "http:/host/x"])
def test_a_misspelt_store_url_is_refused_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match="://"):
        Recorder(text)
    with pytest.raises(InvalidArgumentError, match="://"):
        gv.open_store(text)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_with_a_colon_in_its_name_is_written_as_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _, grads = _model_and_grads()
    with Recorder("./s3:local") as recorder:
        recorder.sync.snapshot(grads, run="r", step=0)
    assert (tmp_path / "s3:local" / "snapshots").is_dir()


def test_reading_a_store_folder_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    with Recorder(missing) as recorder:
        for read in (
            recorder.sync.list,
            lambda: recorder.sync.info("01J0000000000000000000000A"),
            lambda: recorder.sync.gc(0),
            lambda: recorder.sync.apply_retention(keep_last=1),
        ):
            with pytest.raises(StoreNotFoundError, match=re.escape(str(missing))):
                read()
    assert not missing.exists()  # reads create nothing
    _, grads = _model_and_grads()
    with Recorder(missing) as recorder:  # a snapshot creates the folder
        info = recorder.sync.snapshot(grads, run="r", step=0)
        assert [found.id for found in recorder.sync.list()] == [info.id]


def test_argument_errors_are_in_the_error_tree() -> None:
    assert issubclass(InvalidArgumentError, GradvaultError)
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(gv.InvalidArgumentTypeError, GradvaultError)
    assert issubclass(gv.InvalidArgumentTypeError, TypeError)
    for bad in (
        lambda: Recorder("store", on_busy="later"),
        lambda: GradientsParams.from_record(gv.GradientsParamsRecord([]), match="path"),
        lambda: gv.randn(2, 3).permute(0, 0),
        lambda: gv.cat([]),
        lambda: gv.randn(2).item(),
        lambda: gv.Dropout(2.0),
        lambda: gv.randn(3).clamp(),
    ):
        with pytest.raises(InvalidArgumentError):
            bad()
    for bad in (
        lambda: GradientsParams().register(ParamId(), np.zeros(2)),  # type: ignore[arg-type]
        lambda: gv.tensor([1.0]).to(dtype="no-such-dtype"),
        lambda: setattr(gv.tensor([1.0]), "grad", np.zeros(1)),
    ):
        with pytest.raises(gv.InvalidArgumentTypeError):
            bad()


def test_cupy_without_a_driver_raises_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class CUDARuntimeError(RuntimeError):
        pass

    def no_driver() -> int:
        raise CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_driver))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(DeviceError, match="cudaErrorInsufficientDriver"):
        gv.zeros(2, device="cuda")
    with pytest.raises(DeviceError, match="no usable CUDA device"):
        gv.tensor([1.0]).to("cuda:0")
    assert gv.backend.cuda_available() is False


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: gpu-check runs the gpu tests")
def test_gpu_check_without_a_gpu_says_so_and_installs_nothing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH without nvidia-smi, as on a machine without a driver
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "env", "cat", "grep", "uname"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {
        "PATH": str(bin_dir),
        "PY": sys.executable,
        "PIP_NO_INDEX": "1",  # were it to try, pip fails at once rather than download
        "HOME": os.environ.get("HOME", str(tmp_path)),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no NVIDIA GPU" in done.stdout
    assert "pip" not in done.stdout + done.stderr


def _benchmark_rows() -> list[tuple[str, float, float | None, str]]:
    """(figure / peer, ratio, target, met cell) of the rows of README's benchmark tables."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Benchmarks", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip().strip("|").split("|")]
    assert header[:6] == [
        "figure",
        "gradvault (median)",
        "peer (median)",
        "ratio (spread)",
        "target",
        "met",
    ], header
    rows = []
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "figure":  # the header of a further table (the GPU figures)
            assert cells[:6] == header[:6], cells
            continue
        name = f"{cells[0]} / {cells[2]}"
        latency = re.match(r"< ([0-9.]+) ms$", cells[4])
        if latency:  # a latency target: gradvault's own figure, in ms
            assert cells[1].endswith(" ms"), name
            rows.append((name, float(cells[1].split()[0]), float(latency[1]), cells[5]))
            continue
        target = re.match(r"<= ([0-9.]+)", cells[4])
        ratio = float(cells[3].split()[0])
        rows.append((name, ratio, float(target[1]) if target else None, cells[5]))
    return rows


def test_the_readme_benchmark_table_marks_every_missed_target() -> None:
    rows = _benchmark_rows()
    assert len(rows) >= 10
    for name, ratio, target, met in rows:
        if target is None:
            assert met == "", name
        elif ratio > target:
            assert met == "MISSED", f"{name}: {ratio} misses <= {target} but says {met!r}"
        else:
            assert met == "met", f"{name}: {ratio} meets <= {target} but says {met!r}"


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"keep_last": -1}, "keep_last"),
        ({"keep_last": True}, "keep_last"),
        ({"keep_last": 2.0}, "keep_last"),
        ({"keep_every": 0}, "keep_every"),
        ({"keep_every": "10"}, "keep_every"),
        ({"max_pending_bytes": -1}, "max_pending_bytes"),
        ({"pack_threshold": -1}, "pack_threshold"),
        ({"pack_threshold": True}, "pack_threshold"),
        ({"chunk_bytes": 0}, "chunk_bytes"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": 2.5}, "max_concurrency"),
    ],
)
def test_every_bad_recorder_value_is_an_argument_error(
    tmp_path: Path, arguments: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=named) as raised:
        Recorder(tmp_path / "store", **arguments)  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    assert repr(next(iter(arguments.values()))) in str(raised.value)  # what was found
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("store", "options", "error", "named"),
    [
        ("", {}, InvalidArgumentError, "empty"),
        ("file://host/x", {}, InvalidArgumentError, "file:///"),
        ("ftp://host/x", {}, InvalidArgumentError, "s3://"),
        ("s3://Bad_Bucket/x", {}, InvalidArgumentError, "Bad_Bucket"),
        ("s3://bucket/../x", {}, InvalidArgumentError, "'..'"),
        (
            "s3://bucket/x",
            {"endpoit": "http://127.0.0.1:1"},
            gv.InvalidArgumentTypeError,
            "endpoit",
        ),
        ("LOCAL", {"endpoint": "http://127.0.0.1:1"}, gv.InvalidArgumentTypeError, "endpoint"),
        (42, {}, gv.InvalidArgumentTypeError, "int 42"),
    ],
)
def test_every_bad_store_is_an_argument_error(
    tmp_path: Path, store: object, options: dict[str, object], error: type, named: str
) -> None:
    location = str(tmp_path / "store") if store == "LOCAL" else store
    for make in (Recorder, gv.open_store):
        with pytest.raises(error, match=re.escape(named)):
            make(location, **options)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()
