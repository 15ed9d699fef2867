"""``gradvault demo``: a preempted training job resumes bit for bit from the service.

It trains an MLP (:mod:`gradvault.client.cli.demo_trainer`) three times: once uninterrupted in
this process; once in a trainer process that pushes its accumulated gradients to the
service every few micro-batches (retention keeping the newest few) and is killed
(SIGKILL) in the middle of an accumulation window; and once in a fresh process that
loads the trainer's last checkpoint, restores the window's gradients from the service and
trains to the end. It then compares the resumed parameters with the uninterrupted ones,
byte for byte, and prints the figure; the exit status is 1 if they differ.

Without ``--url`` it serves a store itself (``--service-store``, else a temporary folder)
on 127.0.0.1; ``--keep-serving`` leaves that service running afterwards until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .demo_trainer import JOURNAL, RESUMED, Plan, Training, plan_json
from .errors import MissingExtraError, UsageError
from .main import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, count, main, service_token

PROG = "gradvault demo"


def _step(number: int, text: str) -> None:
    print(f"\n[{number}/5] {text}", flush=True)


def _digest(params: dict[str, np.ndarray]) -> str:
    hasher = hashlib.sha256()
    for name in sorted(params):
        hasher.update(params[name].tobytes())
    return hasher.hexdigest()[:16]


def compare(resumed: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, Any]:
    """How two sets of parameters differ: values and bytes compared, values that differ,
    the largest absolute difference, and whether every byte is the same."""
    if set(resumed) != set(reference):
        raise UsageError(
            f"the runs have different parameters: {sorted(resumed)} vs {sorted(reference)}"
        )
    values = nbytes = differing = 0
    largest = 0.0
    identical = True
    for name, expected in reference.items():
        found = resumed[name]
        values += expected.size
        nbytes += expected.nbytes
        if found.shape != expected.shape:
            raise RuntimeError(
                f"parameter {name} has shape {found.shape} after the resume, "
                f"{expected.shape} in the uninterrupted run"
            )
        if found.tobytes() == expected.tobytes():
            continue
        identical = False
        differing += int(np.count_nonzero(found != expected))
        largest = max(largest, float(np.max(np.abs(found - expected))))
    return {
        "tensors": len(reference),
        "values": values,
        "bytes": nbytes,
        "differing_values": differing,
        "max_abs_diff": largest,
        "identical": identical,
    }


def _trainer(role: str, plan: Plan, run: str, workdir: Path, url: str, token: str | None) -> int:
    """Run the trainer ``role`` as a new Python process; its return code."""
    environment = dict(os.environ)
    environment.pop("GRADVAULT_TOKEN", None)
    if token is not None:
        environment["GRADVAULT_TOKEN"] = token
    command = [
        sys.executable,
        "-m",
        "gradvault.client.cli.demo_trainer",
        role,
        "--plan",
        plan_json(plan),
        "--run",
        run,
        "--workdir",
        str(workdir),
        "--url",
        url,
    ]
    # Its own process group: a terminal's Ctrl-C then reaches only this process, which stops
    # the trainer (SIGKILL, as a preemption would) and says "interrupted" in one line,
    # instead of the trainer printing a traceback from wherever the signal found it.
    trainer = subprocess.Popen(command, env=environment, process_group=0)
    try:
        code = trainer.wait()
    except BaseException:
        trainer.kill()
        trainer.wait()
        raise
    if code in (EXIT_INTERRUPTED, -signal.SIGINT):  # interrupted on its own
        raise KeyboardInterrupt
    return code


@contextlib.contextmanager
def _service(args: argparse.Namespace) -> Iterator[tuple[str, str | None, Any, str]]:
    """The service the demo talks to: ``--url``, or one it starts; (url, token, the
    started service or None, a description of the store)."""
    if args.url is not None:
        yield args.url, service_token(args.token), None, f"the service at {args.url}"
        return
    try:
        from gradvault.service import Settings

        from .serve import BackgroundService
    except ImportError as error:
        raise MissingExtraError("gradvault demo without --url", "service", error) from error
    with contextlib.ExitStack() as stack:
        if args.service_store is not None:
            store = str(Path(args.service_store).absolute())
            described = store
        else:
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="gradvault-demo-"))
            described = f"{store} (temporary, removed at exit)"
        settings = Settings(store=store, host="127.0.0.1", port=args.port, tokens={})
        logging.getLogger("gradvault.service").setLevel(logging.ERROR)  # the open-service note
        service = stack.enter_context(BackgroundService(settings))
        yield service.url, None, service, described


def _read_journal(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / JOURNAL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def demo_command(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the resumed run is bit-identical to the uninterrupted one."""
    if args.url is not None and (args.keep_serving or args.service_store or args.port):
        raise UsageError(
            "--keep-serving, --service-store and --port are for the service the demo starts "
            "itself; with --url it uses that service",
            prog=PROG,
        )
    if args.token is not None and args.url is None:
        raise UsageError("--token goes with --url", prog=PROG)
    if args.micro_batches < 2 or args.steps < 2:
        raise UsageError("--steps and --micro-batches are at least 2 (a window to cut)", prog=PROG)
    plan = Plan(
        steps=args.steps,
        micro_batches=args.micro_batches,
        snapshot_every=args.snapshot_every,
        keep_last=args.keep_last,
    )
    run = "demo-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    with _service(args) as (url, token, service, store):
        identical = _demo(plan, run, url, token, store)
        _listing(url, token, run)
        if service is not None and args.keep_serving:
            _keep_serving(service)
        elif service is not None and args.service_store is not None:
            print(
                f"\nthe demo's service has stopped; serve the store again with:\n"
                f"  gradvault serve --store {args.service_store}"
            )
    return EXIT_OK if identical else EXIT_FAILURE


def _demo(plan: Plan, run: str, url: str, token: str | None, store: str) -> bool:
    step, micro = plan.preempt_at
    reference = Training(plan)
    parameters = sum(p.numel() for p in reference.model.parameters())
    print(
        f"gradvault demo: an MLP ({parameters:,} parameters) learns a synthetic 4-class task "
        f"with SGD (momentum 0.9): {plan.steps} optimizer steps of {plan.micro_batches} "
        f"accumulated micro-batches each."
    )
    print(f"service: {url}  store: {store}  run: {run}")

    _step(1, "the uninterrupted run, in this process (the reference)")
    losses: list[float] = []
    reference.run(after_step=lambda _, loss: losses.append(loss))
    expected = reference.parameters()
    print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}; parameters sha256 {_digest(expected)}")

    with tempfile.TemporaryDirectory(prefix="gradvault-demo-job-") as folder:
        workdir = Path(folder)
        _step(
            2,
            f"the trainer, a new process: pushes its accumulated gradients every "
            f"{plan.snapshot_every} micro-batches, retention keeps the newest "
            f"{plan.keep_last}; it checkpoints model and optimizer after each step",
        )
        code = _trainer("train", plan, run, workdir, url, token)
        if code != -signal.SIGKILL:
            raise RuntimeError(
                f"the trainer process was to be killed mid-window; it exited with {code}"
            )
        print(
            f"  the trainer was killed (SIGKILL) after micro-batch {micro + 1} of "
            f"{plan.micro_batches} of step {step}: that window's gradients are lost with "
            "it, except what the service holds"
        )

        _step(3, "resume in a fresh process, from the checkpoint and the service")
        code = _trainer("resume", plan, run, workdir, url, token)
        if code != 0:
            raise RuntimeError(f"the resumed process failed (exit status {code})")
        with np.load(workdir / RESUMED, allow_pickle=False) as arrays:
            resumed = {name: arrays[name] for name in arrays}
        journal = _read_journal(workdir)

    _step(4, "compare the resumed parameters with the uninterrupted run's")
    figures = compare(resumed, expected)
    print(
        f"  {figures['tensors']} tensors, {figures['values']:,} values, {figures['bytes']:,} "
        f"bytes compared: {figures['differing_values']} values differ, max |difference| "
        f"{figures['max_abs_diff']:.3g}; sha256 {_digest(resumed)} vs {_digest(expected)}"
    )
    lost = _lost_window_difference(plan, expected)
    print(
        f"  (resuming without the snapshot, losing micro-batches 1-{micro + 1} of step {step} "
        f"as a trainer that skips the data it already read does, ends {lost:.3g} away)"
    )
    if figures["identical"]:
        print("  bit-identical: yes, the resumed run's parameters equal the uninterrupted run's")
    else:
        print("  bit-identical: NO, the resumed run differs from the uninterrupted one")

    _step(5, "what retention removed")
    _retention_summary(plan, journal)
    return bool(figures["identical"])


def _lost_window_difference(plan: Plan, expected: dict[str, np.ndarray]) -> float:
    step, micro = plan.preempt_at
    control = Training(plan)
    control.run(skip=lambda s, m: s == step and m <= micro)
    return max(float(np.max(np.abs(v - expected[k]))) for k, v in control.parameters().items())


def _retention_summary(plan: Plan, journal: list[dict[str, Any]]) -> None:
    pushes = [event for event in journal if "pushed" in event]
    removed = [snapshot_id for event in pushes for snapshot_id in event["removed"]]
    where = {event["pushed"]: (event["step"], event["micro_batches"]) for event in pushes}
    print(
        f"  the trainer pushed {len(pushes)} snapshots; keeping the newest {plan.keep_last}, "
        f"retention deleted {len(removed)}:"
    )
    for snapshot_id in removed:
        step, micro = where[snapshot_id]
        print(f"    {snapshot_id}  step {step}, after micro-batch {micro}")
    resumed = [event for event in journal if "resumed_from" in event]
    if resumed:
        print(f"  the resume read {resumed[0]['resumed_from']}, the newest one kept")


def _listing(url: str, token: str | None, run: str) -> None:
    print(f"\n$ gradvault ls --url {url} --run {run}", flush=True)
    arguments = ["ls", "--url", url, "--run", run]
    if token is not None:
        arguments += ["--token", token]
    if main(arguments) != EXIT_OK:
        raise RuntimeError("listing the demo's snapshots failed (see above)")
    sys.stdout.flush()


def _keep_serving(service: Any) -> None:
    from gradvault.service.access_log import access_log

    from .serve import sigterm_as_interrupt

    print(
        f"\nthe service keeps running (Ctrl-C stops it):\n"
        f"  service:  {service.url}\n"
        f"  API docs: {service.url}/docs\n"
        f"  web page: {service.url}/ui\n"
        f"  list:     gradvault ls --url {service.url}\n"
        f"access log (one JSON object per request):",
        flush=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
    try:
        with sigterm_as_interrupt():
            service.wait()
    except KeyboardInterrupt:
        pass
    print("stopping the service", flush=True)


def add_parser(
    add: Callable[..., argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    """Add ``demo``."""
    sub = add(
        "demo",
        "resume a preempted training run from the service and check it bit for bit",
        demo_command,
        parents=parents,
    )
    sub.add_argument("--url", help="use the service at URL (default: start one on 127.0.0.1)")
    sub.add_argument("--token", help="bearer token for --url (default: $GRADVAULT_TOKEN)")
    sub.add_argument(
        "--service-store",
        metavar="DIR",
        help="the store of the service the demo starts (default: a temporary folder)",
    )
    sub.add_argument(
        "--port",
        type=count(0),
        default=0,
        help="the port of the service the demo starts (default: a free one)",
    )
    sub.add_argument(
        "--keep-serving",
        action="store_true",
        help="keep the service the demo started running afterwards, until Ctrl-C",
    )
    defaults = Plan()
    sub.add_argument("--steps", type=count(2), default=defaults.steps, help="optimizer steps")
    sub.add_argument(
        "--micro-batches",
        type=count(2),
        default=defaults.micro_batches,
        help="micro-batches accumulated per step",
    )
    sub.add_argument(
        "--snapshot-every",
        type=count(1),
        default=defaults.snapshot_every,
        help="push a snapshot every N micro-batches",
    )
    sub.add_argument(
        "--keep-last",
        type=count(1),
        default=defaults.keep_last,
        help="retention: keep the N newest snapshots of the run",
    )
