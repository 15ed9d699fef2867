"""The snapshot commands: ``ls``, ``show``, ``pull``, ``push``, ``rm`` and ``gc``.

Each works on a service (``--url``, ``--token``) or, with ``--store``, on a store directly
(:mod:`gradvault.client.cli.targets`). Results go to stdout; errors are raised and printed by
:func:`gradvault.client.cli.main`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gradvault.core.store import SnapshotInfo

from .errors import UsageError
from .main import EXIT_OK, count, seconds, service_token, service_url
from .progress import TransferProgress
from .targets import CommandTarget, ServiceTarget, StoreTarget


@contextmanager
def open_target(args: argparse.Namespace, *, must_exist: bool = True) -> Iterator[CommandTarget]:
    """The service or the store the command line names, closed after the block."""
    target: CommandTarget
    if args.store is not None:
        if args.token is not None:
            raise UsageError(
                "--store works on the store itself; --token is for a service (--url)",
                prog=f"gradvault {args.command}",
            )
        target = StoreTarget(args.store, must_exist=must_exist)
    else:
        target = ServiceTarget(
            service_url(args.url), service_token(args.token), retries=args.retries
        )
    try:
        yield target
    finally:
        target.close()


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def _summary_json(info: SnapshotInfo) -> dict[str, Any]:
    """A summary as the JSON outputs print it: ``shards`` only for a sharded snapshot."""
    document = asdict(info)
    if info.world_size is None:
        del document["shards"]
    return document


def _shard_details(target: CommandTarget, detail: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's detail of a sharded snapshot, in rank order (none for one written whole)."""
    return [target.detail(detail["id"], rank) for rank in range(len(detail.get("shards", ())))]


def _nonfinite(target: CommandTarget, info: SnapshotInfo) -> tuple[int, int]:
    """NaN and Inf counts of a snapshot, over every rank of a sharded one."""
    from . import tables

    if info.world_size is None:
        return tables.nonfinite_counts(target.detail(info.id))
    counts = [tables.nonfinite_counts(target.detail(info.id, r)) for r in range(info.world_size)]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _check_rank(detail: dict[str, Any], rank: int | None, command: str) -> None:
    """UsageError unless ``rank`` fits the snapshot: needed by a sharded one (an existing
    rank), refused by one written whole."""
    world_size, snapshot_id = detail.get("world_size"), detail["id"]
    if world_size is None and rank is not None:
        raise UsageError(
            f"snapshot {snapshot_id} was written whole; --rank is for sharded snapshots",
            prog=f"gradvault {command}",
        )
    if world_size is not None and (rank is None or rank >= world_size):
        given = "" if rank is None else f"; got --rank {rank}"
        raise UsageError(
            f"snapshot {snapshot_id} is sharded over {world_size} ranks: give --rank "
            f"(0..{world_size - 1}) to {command} one rank's shard{given}",
            prog=f"gradvault {command}",
        )


# ---------------------------------------------------------------------- commands
def ls(args: argparse.Namespace) -> int:
    """List snapshots, newest first, with each one's NaN/Inf counts."""
    from . import tables

    with open_target(args) as target:
        infos = target.list(args.run, args.step_min, args.step_max, args.limit or None)
        counts = [_nonfinite(target, info) for info in infos]
    if args.json:
        _print_json(
            [
                {**_summary_json(info), "nan_count": nan, "inf_count": inf}
                for info, (nan, inf) in zip(infos, counts, strict=True)
            ]
        )
    elif not infos:
        print(f"no snapshots at {target.where}" + (f" for run {args.run!r}" if args.run else ""))
    else:
        print(tables.listing(infos, [tables.nonfinite_flag(*c) for c in counts]))
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    """Print one snapshot's manifest and per-gradient stats."""
    from . import tables

    with open_target(args) as target:
        if args.rank is None:
            detail = target.detail(args.id)
            shard_details = [] if args.json else _shard_details(target, detail)
        else:
            _check_rank(target.detail(args.id), args.rank, "show")
            detail, shard_details = target.detail(args.id, args.rank), []
    if args.json:
        _print_json(detail)
    else:
        print(tables.snapshot_detail(detail, shard_details))
    return EXIT_OK


def pull(args: argparse.Namespace) -> int:
    """Download a snapshot to a .safetensors or .npz file (checksums verified)."""
    from . import files, tables

    path = Path(args.output)
    files.check_suffix(path, "pull")
    if not path.parent.is_dir():
        raise FileNotFoundError(2, "no such folder", str(path.parent))
    with open_target(args) as target:
        _check_rank(target.detail(args.id), args.rank, "pull")
        with TransferProgress(f"pull {args.id}") as progress:
            target.pull(args.id, path, progress, args.rank)
        detail = target.detail(args.id, args.rank)
    shard = "" if args.rank is None else f", rank {args.rank} of {detail['world_size']}"
    print(
        f"wrote {path}: snapshot {detail['id']} (run {detail['run']}, step {detail['step']}"
        f"{shard}), {detail['num_params']} gradients, {tables.size(path.stat().st_size)}"
    )
    return EXIT_OK


def _tags(pairs: list[str]) -> dict[str, str]:
    tags = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UsageError(f"--tag takes KEY=VALUE; got {pair!r}", prog="gradvault push")
        tags[key] = value
    return tags


def push(args: argparse.Namespace) -> int:
    """Upload the gradients of a .safetensors or .npz file as a new snapshot."""
    from . import files, tables

    path = Path(args.file)
    files.check_suffix(path, "push")
    tags = _tags(args.tag)
    record = files.read_record(path)
    with (
        open_target(args, must_exist=False) as target,
        TransferProgress(f"push {path.name}") as progress,
    ):
        info = target.push(record, run=args.run, step=args.step, tags=tags, progress=progress)
    if args.json:
        _print_json(_summary_json(info))
    else:
        print(
            f"pushed {info.id}: run {info.run}, step {info.step}, {info.num_params} gradients, "
            f"{tables.size(info.nbytes)} to {target.where}"
        )
    return EXIT_OK


def rm(args: argparse.Namespace) -> int:
    """Delete snapshots by id (stops at the first that cannot be deleted)."""
    with open_target(args) as target:
        for snapshot_id in args.ids:
            target.delete(snapshot_id)
            print(f"deleted {snapshot_id}")
    return EXIT_OK


def _sweep_spool(spool_dir: str | None) -> str:
    """Sweep this machine's upload spool folder (as a starting service does); what was done."""
    try:
        from gradvault.service.spool import spool_folder, sweep_spool
    except ImportError:
        return "spool folder not swept: the service extra is not installed here"
    spool_dir = spool_dir or os.environ.get("GRADVAULT_SPOOL_DIR") or None
    swept = sweep_spool(spool_dir)
    total = sum(found.size for found in swept)
    names = ", ".join(os.path.basename(found.path) for found in swept)
    return (
        f"removed {len(swept)} orphaned upload(s) ({total} bytes) from the spool folder "
        f"{spool_folder(spool_dir)}" + (f": {names}" if names else "")
    )


def gc(args: argparse.Namespace) -> int:
    """Collect leftovers of interrupted writes (--store) and apply retention rules."""
    retention = args.keep_last is not None or args.keep_every is not None
    if args.run is not None and not retention:
        raise UsageError(
            "--run chooses the snapshots retention applies to; give --keep-last and/or "
            "--keep-every with it",
            prog="gradvault gc",
        )
    if args.store is None and not retention:
        raise UsageError(
            "over the service, gc applies retention only: give --keep-last and/or "
            "--keep-every, or --store to collect leftovers of interrupted writes",
            prog="gradvault gc",
        )
    with open_target(args) as target:
        if args.store is not None:
            leftovers = target.collect_garbage(args.grace_seconds)
            print(
                f"removed {len(leftovers)} leftover(s) of interrupted writes older than "
                f"{args.grace_seconds:g} s" + (": " + ", ".join(leftovers) if leftovers else "")
            )
            print(_sweep_spool(args.spool_dir))
        if retention:
            deleted = target.apply_retention(args.keep_last, args.keep_every, args.run)
            rules = ", ".join(
                f"{name} {value}"
                for name, value in (("keep last", args.keep_last), ("keep every", args.keep_every))
                if value is not None
            )
            print(
                f"retention ({rules}) deleted {len(deleted)} snapshot(s)"
                + (": " + ", ".join(deleted) if deleted else "")
            )
    return EXIT_OK


# ---------------------------------------------------------------------- parsers
def add_parsers(
    add: Callable[..., argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    """Add ``ls``, ``show``, ``pull``, ``push``, ``rm`` and ``gc`` through ``add(name, help,
    handler, parents=...)``."""
    sub = add("ls", "list snapshots, newest first", ls, parents=parents)
    sub.add_argument("--run", help="only this run's snapshots")
    sub.add_argument("--step-min", type=count(0), help="only steps >= this")
    sub.add_argument("--step-max", type=count(0), help="only steps <= this")
    sub.add_argument(
        "--limit", type=count(0), default=50, help="at most this many (default 50; 0: all)"
    )
    sub.add_argument("--json", action="store_true", help="print JSON, for scripts")

    sub = add("show", "print a snapshot's manifest and per-gradient stats", show, parents=parents)
    sub.add_argument("id", metavar="ID", help="the snapshot id")
    sub.add_argument(
        "--rank", type=count(0), help="of a sharded snapshot: this rank's shard, its gradients"
    )
    sub.add_argument("--json", action="store_true", help="print the manifest as JSON")

    sub = add("pull", "download a snapshot to a .safetensors or .npz file", pull, parents=parents)
    sub.add_argument("id", metavar="ID", help="the snapshot id")
    sub.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="FILE.safetensors or FILE.npz"
    )
    sub.add_argument(
        "--rank", type=count(0), help="of a sharded snapshot (needed): this rank's shard"
    )

    sub = add("push", "upload a .safetensors or .npz file as a new snapshot", push, parents=parents)
    sub.add_argument("file", metavar="FILE", help="FILE.safetensors or FILE.npz (ParamId keys)")
    sub.add_argument("--run", required=True, help="the run the snapshot belongs to")
    sub.add_argument("--step", type=count(0), required=True, help="the training step")
    sub.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag (repeatable)"
    )
    sub.add_argument("--json", action="store_true", help="print the new summary as JSON")

    sub = add("rm", "delete snapshots", rm, parents=parents)
    sub.add_argument("ids", nargs="+", metavar="ID", help="snapshot ids")

    sub = add(
        "gc",
        "collect leftovers of interrupted writes (--store) and apply retention",
        gc,
        parents=parents,
    )
    sub.add_argument(
        "--grace-seconds",
        type=seconds,
        default=3600.0,
        help="leave leftovers younger than this alone, they may still commit (default 3600)",
    )
    sub.add_argument(
        "--spool-dir",
        metavar="FOLDER",
        help="with --store, the upload spool folder to sweep of files no live service holds "
        "(default: GRADVAULT_SPOOL_DIR, else the system's temporary folder)",
    )
    sub.add_argument("--keep-last", type=count(0), help="keep the N newest snapshots")
    sub.add_argument(
        "--keep-every", type=count(1), help="keep every snapshot whose step is a multiple of K"
    )
    sub.add_argument("--run", help="apply retention to this run only (default: all snapshots)")
