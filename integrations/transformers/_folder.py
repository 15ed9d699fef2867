"""The resume folder: ``gradvault-checkpoint-N`` beside the Trainer's ``checkpoint-N`` folders.

It holds a normal Trainer checkpoint of the state after optimizer step N (model,
optimizer, scheduler, scaler, RNG, trainer state) and ``gradvault_resume.json``, which
names the gradvault snapshot of the gradients accumulated over the first micro-batches
of the window that step N + 1 runs, and everything else that resuming inside that
window needs (:class:`WindowState`). The JSON file is written last, atomically: a folder
without it is incomplete and never resumed from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gradvault.core.errors import ResumeStateError

from .._rng import RngStates

FOLDER_PREFIX = "gradvault-checkpoint"
STATE_FILE = "gradvault_resume.json"
STATE_FORMAT = 2
LOGGING_FILE = "gradvault_logging.json"
_FOLDER = re.compile(rf"^{FOLDER_PREFIX}-(\d+)$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_RANK_FILE = re.compile(r"^gradvault_resume_rank(\d+)\.json$")


def folder_for(output_dir: str | os.PathLike[str], global_step: int) -> Path:
    """The resume folder for a window that starts after ``global_step`` optimizer steps."""
    return Path(output_dir) / f"{FOLDER_PREFIX}-{global_step}"


def state_file_name(process_index: int, world_size: int) -> str:
    """``gradvault_resume.json``, or one per process when several train together."""
    if world_size <= 1:
        return STATE_FILE
    return f"gradvault_resume_rank{process_index}.json"


def logging_file_name(process_index: int, world_size: int) -> str:
    """``gradvault_logging.json``, or one per process when several train together."""
    if world_size <= 1:
        return LOGGING_FILE
    return f"gradvault_logging_rank{process_index}.json"


def is_resume_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is named like a gradvault resume folder."""
    return bool(_FOLDER.match(Path(path).name))


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The newest place to resume from in ``output_dir``, or None.

    A complete ``gradvault-checkpoint-N`` (mid-window of step N + 1) is newer than
    ``checkpoint-N`` and older than ``checkpoint-(N + 1)``.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    best: tuple[int, int, Path] | None = None
    for child in root.iterdir():
        if not child.is_dir():
            continue
        if match := _CHECKPOINT.match(child.name):
            key = (int(match[1]), 0, child)
        elif (match := _FOLDER.match(child.name)) and is_complete(child):
            key = (int(match[1]), 1, child)
        else:
            continue
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]


def is_complete(folder: Path) -> bool:
    """Whether every process that saved into resume folder ``folder`` completed it: its
    ``gradvault_resume.json``, or each rank's ``gradvault_resume_rank{i}.json`` for the
    world size they name."""
    if (folder / STATE_FILE).is_file():
        return True
    ranks = {int(match[1]) for path in folder.iterdir() if (match := _RANK_FILE.match(path.name))}
    if not ranks:
        return False
    try:
        first = folder / f"gradvault_resume_rank{min(ranks)}.json"
        data = json.loads(first.read_text(encoding="utf-8"))
        world_size = data["world_size"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return False
    return type(world_size) is int and ranks >= set(range(world_size))


def prune_older(output_dir: str | os.PathLike[str], global_step: int) -> list[Path]:
    """Delete the resume folders of windows before ``global_step``'s; the deleted paths."""
    deleted = []
    for child in Path(output_dir).iterdir():
        match = _FOLDER.match(child.name)
        if match and int(match[1]) < global_step and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            deleted.append(child)
    return deleted


@dataclass
class WindowState:
    """What resuming at micro-batch ``micro_step`` of the window after step ``global_step`` needs.

    Losses and the running loss are kept as their dtype and exact bytes (hex); floats
    that must come back bit for bit as ``float.hex`` text.
    """

    snapshot_id: str
    target: str
    run: str
    global_step: int
    micro_step: int
    window_size: int
    gradient_accumulation_steps: int
    per_device_train_batch_size: int
    world_size: int
    process_index: int
    first_in_epoch: bool
    batches_digest: str
    losses: list[dict[str, str]]
    tr_loss_at_window_start: dict[str, str]
    globalstep_last_logged: int
    rng_at_window_start: dict[str, Any]
    rng_at_micro_step: dict[str, Any]
    #: the generators' states before the collate of each of the window's first batches that
    #: were collated before its prefetch (during the window before's); None when the
    #: dataloader collated outside this process
    collated_ahead: list[dict[str, Any]] | None
    scaler: dict[str, Any] | None
    format: int = STATE_FORMAT

    def write(self, folder: Path) -> Path:
        """Write the state file into ``folder`` atomically (fsynced, then renamed)."""
        path = folder / state_file_name(self.process_index, self.world_size)
        _write_json(path, asdict(self))
        return path

    @classmethod
    def read(cls, folder: Path, process_index: int, world_size: int) -> WindowState:
        """The state file of ``folder``; ResumeStateError saying what is missing or wrong."""
        path = folder / state_file_name(process_index, world_size)
        if not path.is_file():
            raise ResumeStateError(
                f"{folder} has no {path.name}: its snapshot never committed (the run stopped "
                "while taking it); resume from an older checkpoint folder"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ResumeStateError(f"{path} cannot be read as JSON: {error}") from None
        if not isinstance(data, dict):
            raise ResumeStateError(f"{path} holds {type(data).__name__}; expected an object")
        if data.get("format") != STATE_FORMAT:
            raise ResumeStateError(
                f"{path} has format {data.get('format')!r}; this release reads {STATE_FORMAT}"
            )
        names = {field.name for field in fields(cls)}
        missing = sorted(names - data.keys())
        if missing:
            raise ResumeStateError(f"{path} lacks {', '.join(missing)}")
        state = cls(**{name: data[name] for name in names})
        state._check(path)
        return state

    def _check(self, path: Path) -> None:
        expected_types: dict[str, tuple[type, ...]] = {
            "snapshot_id": (str,),
            "target": (str,),
            "run": (str,),
            "batches_digest": (str,),
            "first_in_epoch": (bool,),
            "losses": (list,),
            "tr_loss_at_window_start": (dict,),
            "rng_at_window_start": (dict,),
            "rng_at_micro_step": (dict,),
            "collated_ahead": (list, type(None)),
            "scaler": (dict, type(None)),
        }
        for name, types in expected_types.items():
            value = getattr(self, name)
            if not isinstance(value, types):
                raise ResumeStateError(
                    f"{path}: {name} is {type(value).__name__}; expected "
                    f"{' or '.join(kind.__name__ for kind in types)}"
                )
        if not all(isinstance(loss, dict) for loss in self.losses):
            raise ResumeStateError(f"{path}: losses must be objects (dtype, shape, bytes)")
        for name in (
            "global_step",
            "micro_step",
            "window_size",
            "gradient_accumulation_steps",
            "globalstep_last_logged",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ResumeStateError(f"{path}: {name} is {value!r}; expected an int >= 0")
        if not 1 <= self.micro_step < self.window_size:
            raise ResumeStateError(
                f"{path}: micro_step {self.micro_step} is not inside a window of "
                f"{self.window_size} micro-batches (1 .. {self.window_size - 1})"
            )
        if len(self.losses) != self.micro_step:
            raise ResumeStateError(
                f"{path}: {len(self.losses)} saved losses for {self.micro_step} micro-batches"
            )
        RngStates.from_json(self.rng_at_window_start, str(path))
        RngStates.from_json(self.rng_at_micro_step, str(path))
        if self.collated_ahead is not None:
            if len(self.collated_ahead) > self.window_size:
                raise ResumeStateError(
                    f"{path}: {len(self.collated_ahead)} batches collated ahead of a window of "
                    f"{self.window_size}"
                )
            for states in self.collated_ahead:
                RngStates.from_json(states, str(path))

    def collated_ahead_states(self, where: str) -> list[RngStates]:
        """``collated_ahead`` as generator states (none when it is None)."""
        return [RngStates.from_json(states, where) for states in self.collated_ahead or []]


def write_logging_state(
    folder: Path, state: dict[str, Any], process_index: int, world_size: int
) -> None:
    """Write ``gradvault_logging.json`` (one per process when several train) into a
    checkpoint folder: the loss not yet logged, the generators' states at the save and
    before the collates of the batches collated ahead."""
    path = folder / logging_file_name(process_index, world_size)
    _write_json(path, {"format": STATE_FORMAT, **state})


def read_logging_state(folder: Path, process_index: int, world_size: int) -> dict[str, Any] | None:
    """The checkpoint's ``gradvault_logging.json`` of this process (states as
    :class:`RngStates`), or None when it has none."""
    path = folder / logging_file_name(process_index, world_size)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResumeStateError(f"{path} cannot be read: {type(error).__name__}: {error}") from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ResumeStateError(
            f"{path} has format {found!r}; this release reads {STATE_FORMAT} (resume from "
            "the checkpoint with the release that saved it, or delete the file for a stock "
            "resume)"
        )
    missing = sorted(
        {"tr_loss", "globalstep_last_logged", "rng_at_save", "collated_ahead"} - data.keys()
    )
    if missing:
        raise ResumeStateError(f"{path} lacks {', '.join(missing)}")
    last_logged, ahead = data["globalstep_last_logged"], data["collated_ahead"]
    if type(last_logged) is not int or last_logged < 0:
        raise ResumeStateError(
            f"{path}: globalstep_last_logged is {last_logged!r}; expected an int >= 0"
        )
    if not isinstance(data["tr_loss"], dict):
        found = type(data["tr_loss"]).__name__
        raise ResumeStateError(f"{path}: tr_loss is {found}; expected dict")
    if not isinstance(ahead, list | None):
        raise ResumeStateError(f"{path}: collated_ahead is {type(ahead).__name__}; expected list")
    return {
        "tr_loss": data["tr_loss"],
        "globalstep_last_logged": last_logged,
        "rng_at_save": RngStates.from_json(data["rng_at_save"], str(path)),
        "collated_ahead": [RngStates.from_json(states, str(path)) for states in ahead or []],
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(data, handle, allow_nan=False)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
