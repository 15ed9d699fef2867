"""One training run of the Trainer resume tests; ``python -m tests.integrations.hf_run``.

A tiny GPT-2 (built here, nothing downloaded) with dropout, gradient accumulation 8,
five optimizer steps over 48 random sequences (three windows per epoch, so the steps
cross two epoch boundaries). Each mode is one way to run it; the result (final
parameters, optimizer and scheduler state, logged losses) is saved to ``OUT/result.pt``.

``--collator mask`` collates with transformers' masked-LM collator (it masks 15% of the
tokens with torch's global generator) instead of the default one; ``--count`` sets the
number of sequences (46: 23 micro-batches an epoch, so an epoch's last window has 7).

``--precision``: ``fp32`` (the default), ``fp16`` (float16 autocast and a GradScaler, set
up on the CPU as accelerate does on a GPU), ``bf16`` (``TrainingArguments(bf16=True)``:
bfloat16 autocast, float32 parameters and gradients) or ``bf16-params`` (the model itself
in bfloat16, ``model.to(torch.bfloat16)``: bfloat16 parameters and ``.grad``).

Modes: ``baseline`` (stock Trainer, uninterrupted), ``every`` (snapshots every
``--every`` micro-batches, then the process kills itself with SIGKILL once the snapshot after the
chosen micro-batch is committed, or with ``--kill-after-save`` once ``checkpoint-STEP`` is
saved), ``sigterm`` (prints READY at the start of the chosen
micro-batch and waits there for the SIGTERM the test sends), ``stop`` (as ``every``,
but stops training instead of killing the process), ``resume``
(``train(resume_from_checkpoint=True)``), ``readme`` (runs the README's Hugging Face example
as it stands, in ``OUT``; with ``--sigterm`` waiting for a SIGTERM as ``sigterm`` does),
``stock-stop``/``stock-resume`` (the stock
Trainer stopped mid-window with a checkpoint, as a just-in-time checkpoint does, and
resumed from it).

Under DDP each rank runs ``main`` through ``ddp_rank`` (``tests/integrations/torch_ranks.py``
forks the ranks into a gloo group), writing ``OUT/result.<rank>.pt``; ``--ready-file``
names a file each rank creates when it waits for its SIGTERM (``{rank}`` in it replaced).

``every`` also saves every parameter's ``.grad`` as it was when the snapshot was taken
(``OUT/grads_at_snapshot.pt``), and ``resume`` the ``.grad`` the first micro-batch it runs
starts from (``OUT/grads_restored.pt``): the gradients the resume put back.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.utils.data import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from gradvault.integrations.transformers import GradvaultCallback, GradvaultTrainer

README = Path(__file__).resolve().parents[2] / "README.md"
README_SECTION = "## Resume a Hugging Face Trainer run mid-accumulation"
ACCUMULATION = 8
MAX_STEPS = 5
PRECISIONS = ("fp32", "fp16", "bf16", "bf16-params")
COLLATORS = ("default", "mask")
VOCABULARY = 64
SIGNAL_WAIT_SECONDS = 120


class Sequences(Dataset):
    """``count`` fixed random token sequences, each its own label (or no label, for a
    collator that makes its own)."""

    def __init__(
        self, count: int = 48, length: int = 16, seed: int = 1234, labels: bool = True
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, VOCABULARY, (count, length), generator=generator)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not self.labels:
            return {"input_ids": self.tokens[index]}
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def masking_collator() -> DataCollatorForLanguageModeling:
    """transformers' masked-LM collator over a word-level tokenizer of the tiny vocabulary,
    built here: it masks 15% of the tokens with torch's global generator."""
    vocabulary = {f"t{index}": index for index in range(VOCABULARY)}
    tokenizer = Tokenizer(WordLevel(vocabulary, unk_token="t0"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", mask_token="t1")
    return DataCollatorForLanguageModeling(fast, mlm_probability=0.15)


def tiny_gpt2(precision: str = "fp32") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    return model.to(torch.bfloat16) if precision == "bf16-params" else model


def training_args(output_dir: Path, precision: str = "fp32") -> TrainingArguments:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=MAX_STEPS,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        fp16=precision == "fp16",
        bf16=precision == "bf16",  # accelerate runs bfloat16 autocast on the CPU itself
    )


def make_trainer(
    trainer_class: type[Trainer],
    output_dir: Path,
    precision: str,
    callbacks: list[Any],
    collator: str = "default",
    count: int = 48,
) -> Trainer:
    if collator not in COLLATORS:
        raise ValueError(f"collator must be one of {', '.join(COLLATORS)}; got {collator!r}")
    masking = collator == "mask"
    trainer = trainer_class(
        model=tiny_gpt2(precision),
        args=training_args(output_dir, precision),
        train_dataset=Sequences(count, labels=not masking),
        data_collator=masking_collator() if masking else None,
        callbacks=callbacks,
    )
    if precision == "fp16":
        # accelerate turns fp16 off on a CPU; its GPU set-up, on the CPU: float16
        # autocast around the forward pass and a GradScaler (torch supports both there)
        trainer.accelerator.native_amp = True
        trainer.accelerator.scaler = torch.amp.GradScaler(
            "cpu", init_scale=2.0**10, growth_interval=1
        )
    return trainer


class MicroBatchCounter(TrainerCallback):
    """Calls ``action(control)`` at the end of micro-batch ``micro`` of step ``step`` (1-based)."""

    def __init__(self, step: int, micro: int, action: Any) -> None:
        self.step, self.micro, self.action = step, micro, action
        self.done = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.done = 0

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.done += 1
        if state.global_step == self.step - 1 and self.done == self.micro:
            self.action(control)


def stop_training(control: Any) -> None:
    control.should_training_stop = True


class SigtermWait:
    """At the start of micro-batch ``micro`` of step ``step`` (1-based; forward passes counted
    per step, so a shortened window counts as it is), says READY and waits for the SIGTERM
    the test sends. ``trainer_of()`` gives the trainer once it is built; ``ready_file``
    (``{rank}`` in it replaced by the process's index) is created beside the READY."""

    def __init__(
        self,
        model: torch.nn.Module,
        step: int,
        micro: int,
        trainer_of: Any,
        ready_file: str | None = None,
    ) -> None:
        self.step, self.micro, self.trainer_of = step, micro, trainer_of
        self.ready_file = ready_file
        self.seen_step, self.calls = -1, 0
        model.register_forward_pre_hook(self.pre_forward)

    def pre_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        trainer = self.trainer_of()
        if trainer.state.global_step != self.seen_step:
            self.seen_step, self.calls = trainer.state.global_step, 0
        self.calls += 1
        if self.seen_step != self.step - 1 or self.calls != self.micro:
            return
        (callback,) = [
            callback
            for callback in trainer.callback_handler.callbacks
            if isinstance(callback, GradvaultCallback)
        ]
        print("READY", flush=True)
        if self.ready_file is not None:  # several processes: one file each
            Path(str(self.ready_file).format(rank=trainer.args.process_index)).touch()
        deadline = time.monotonic() + SIGNAL_WAIT_SECONDS
        while not callback.signal_received:
            if time.monotonic() > deadline:
                raise SystemExit("no SIGTERM came")
            time.sleep(0.01)


class KillAfterSave(TrainerCallback):
    """Kills the process with SIGKILL once ``checkpoint-<step>`` is saved."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def readme_example(path: Path = README, heading: str = README_SECTION) -> str:
    """The code of the first ``python`` block under ``heading`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def gradients_of(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter's ``.grad`` (a copy), by name; None where it has none."""
    return {
        name: None if param.grad is None else param.grad.detach().clone()
        for name, param in model.named_parameters()
    }


def save_gradients_at_first_forward(model: torch.nn.Module, path: Path) -> None:
    """Save the ``.grad`` the first forward pass starts from to ``path``."""
    saved = [False]

    def pre_forward(module: torch.nn.Module, inputs: Any) -> None:
        if not saved[0]:
            saved[0] = True
            torch.save(gradients_of(module), path)

    model.register_forward_pre_hook(pre_forward)


def save_result(trainer: Trainer, out: Path, callback: GradvaultCallback | None) -> None:
    logged = [
        {key: entry[key] for key in ("step", "loss", "grad_norm", "learning_rate")}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]
    torch.save(
        {
            "params": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict(),
            "logged": logged,
            "global_step": trainer.state.global_step,
            "stopped_by_signal": None if callback is None else callback.stopped_by_signal,
            "snapshot_ids": None if callback is None else callback.snapshot_ids,
            "scaler": None
            if trainer.accelerator.scaler is None
            else trainer.accelerator.scaler.state_dict(),
        },
        out / result_name(trainer.args.process_index, trainer.args.world_size),
    )


def result_name(process_index: int, world_size: int) -> str:
    """``result.pt``, or one per process when several train together."""
    return "result.pt" if world_size == 1 else f"result.{process_index}.pt"


def ddp_rank(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """One rank of a run under DDP (``tests/integrations/torch_ranks.py`` starts the ranks,
    in a process group already made): ``main(options["argv"])``."""
    main(list(options["argv"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--store", default="")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--micro", type=int, default=5)
    parser.add_argument("--every", type=int, default=7)
    parser.add_argument("--resume-from", default="", help="resume: this folder, not the newest")
    parser.add_argument("--stop", action="store_true", help="resume: stop at --step/--micro")
    parser.add_argument("--collator", choices=COLLATORS, default="default")
    parser.add_argument("--count", type=int, default=48, help="sequences in the dataset")
    parser.add_argument(
        "--sigterm", action="store_true", help="readme: wait for a SIGTERM in --step/--micro"
    )
    parser.add_argument(
        "--ready-file", default=None, help="sigterm: a file to create beside the READY"
    )
    parser.add_argument(
        "--kill-after-save", action="store_true", help="every: die once checkpoint-STEP is saved"
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    out, precision = options.out, options.precision
    out.mkdir(parents=True, exist_ok=True)
    callback: GradvaultCallback | None = None

    def build(trainer_class: type[Trainer], callbacks: list[Any]) -> Trainer:
        return make_trainer(
            trainer_class, out / "run", precision, callbacks, options.collator, options.count
        )

    if options.mode == "baseline":
        trainer = build(Trainer, [])
        trainer.train()
    elif options.mode == "every":
        callback = GradvaultCallback(options.store, every=options.every, on_sigterm=False)

        def crash(control: Any) -> None:
            callback.wait()  # the snapshot after this micro-batch is committed: die
            torch.save(gradients_of(trainer.model), out / "grads_at_snapshot.pt")
            os.kill(os.getpid(), signal.SIGKILL)

        killer: TrainerCallback = (
            KillAfterSave(options.step)
            if options.kill_after_save
            else MicroBatchCounter(options.step, options.micro, crash)
        )
        trainer = build(GradvaultTrainer, [callback, killer])
        trainer.train()
        raise SystemExit("the run should have been killed")
    elif options.mode == "stop":
        callback = GradvaultCallback(options.store, every=options.every, on_sigterm=False)
        counter = MicroBatchCounter(options.step, options.micro, stop_training)
        trainer = build(GradvaultTrainer, [callback, counter])
        trainer.train()
    elif options.mode == "sigterm":
        callback = GradvaultCallback(options.store)
        trainer = build(GradvaultTrainer, [callback])
        SigtermWait(trainer.model, options.step, options.micro, lambda: trainer, options.ready_file)
        trainer.train()
    elif options.mode == "resume":
        callback = GradvaultCallback(options.store, every=options.every)
        extra = [MicroBatchCounter(options.step, options.micro, stop_training)]
        trainer = build(GradvaultTrainer, [callback, *(extra if options.stop else [])])
        save_gradients_at_first_forward(trainer.model, out / "grads_restored.pt")
        trainer.train(resume_from_checkpoint=options.resume_from or True)
    elif options.mode == "readme":
        os.chdir(out)  # the example's store is a relative path
        names: dict[str, Any] = {
            "model": tiny_gpt2(precision),
            "args": training_args(out / "run", precision),
            "train_dataset": Sequences(),
        }
        if options.sigterm:
            SigtermWait(names["model"], options.step, options.micro, lambda: names["trainer"])
        exec(compile(readme_example(), str(README), "exec"), names)  # noqa: S102 - the example
        trainer = names["trainer"]
        (callback,) = [
            found
            for found in trainer.callback_handler.callbacks
            if isinstance(found, GradvaultCallback)
        ]
    elif options.mode == "stock-stop":

        def stop_with_checkpoint(control: Any) -> None:
            control.should_save = True
            control.should_training_stop = True

        counter = MicroBatchCounter(options.step, options.micro, stop_with_checkpoint)
        trainer = build(Trainer, [counter])
        trainer.train()
    elif options.mode == "stock-resume":
        trainer = build(Trainer, [])
        trainer.train(resume_from_checkpoint=True)
    else:
        parser.error(f"unknown mode {options.mode!r}")
    save_result(trainer, out, callback)


if __name__ == "__main__":
    sys.exit(main())
