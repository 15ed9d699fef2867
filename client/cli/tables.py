"""Plain-text tables and figures as ``ls`` and ``show`` print them.

Columns are separated by two spaces and padded to their widest cell, so the output reads
in a terminal and splits with ``awk``/``cut`` in a script; no colours, no box characters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gradvault.core.store import SnapshotInfo

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """``rows`` under ``headers``; the columns whose indexes are in ``right`` align right."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def size(nbytes: int) -> str:
    """``18704`` as ``"18.3 KiB"`` (bytes below 1 KiB as ``"512 B"``)."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = nbytes / 1024
    for unit in _UNITS[1:-1]:
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {_UNITS[-1]}"


def when(created_at: str) -> str:
    """``2026-12-02T21:06:14.123Z`` as ``2026-12-02 21:06:14`` (UTC)."""
    return created_at.replace("T", " ")[:19]


def nonfinite_counts(detail: Mapping[str, Any]) -> tuple[int, int]:
    """NaN and Inf counts summed over a snapshot's gradients."""
    nan = sum(g["stats"]["nan_count"] for g in detail["gradients"])
    inf = sum(g["stats"]["inf_count"] for g in detail["gradients"])
    return nan, inf


def nonfinite_flag(nan: int, inf: int) -> str:
    """``"none"``, or what was found: ``"3 NaN, 1 Inf"``."""
    found = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n]
    return ", ".join(found) or "none"


#: the most ranks whose sizes a RANKS cell lists one by one; past it, the smallest and largest
MAX_RANK_SIZES_LISTED = 4


def ranks(info: SnapshotInfo) -> str:
    """A RANKS cell: ``"-"`` for a snapshot written whole, else the world size and the ranks'
    sizes in rank order (``"2: 1.5 KiB, 1.6 KiB"``), or their range past a few ranks
    (``"64: 255.0 MiB..273.0 MiB"``)."""
    if info.world_size is None:
        return "-"
    sizes = [shard.nbytes for shard in info.shards]
    if len(sizes) <= MAX_RANK_SIZES_LISTED:
        return f"{info.world_size}: " + ", ".join(size(n) for n in sizes)
    return f"{info.world_size}: {size(min(sizes))}..{size(max(sizes))}"


def listing(infos: Sequence[SnapshotInfo], flags: Sequence[str]) -> str:
    """The ``ls`` table: one row per snapshot, its NaN/Inf flag from ``flags``.

    A RANKS column (world size and per-rank sizes) comes after PARAMS when a listed
    snapshot is sharded; without one, the table is the same as ever.
    """
    sharded = any(info.world_size is not None for info in infos)
    rows = [
        [
            info.id,
            info.run,
            str(info.step),
            when(info.created_at),
            size(info.nbytes),
            str(info.num_params),
            *([ranks(info)] if sharded else []),
            flag,
        ]
        for info, flag in zip(infos, flags, strict=True)
    ]
    headers = ["ID", "RUN", "STEP", "TIME (UTC)", "SIZE", "PARAMS"]
    headers += ["RANKS", "NaN/Inf"] if sharded else ["NaN/Inf"]
    return table(headers, rows, right=(2, 4, 5))


def _number(value: Any) -> str:
    if isinstance(value, str):
        return "inf" if value == "Infinity" else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def snapshot_detail(
    detail: Mapping[str, Any], shard_details: Sequence[Mapping[str, Any]] = ()
) -> str:
    """The ``show`` text: the manifest's fields, then a table of the gradients' stats.

    Of a sharded snapshot, a table of its ranks instead (their NaN/Inf counts from
    ``shard_details``, each rank's detail in rank order); of one rank's shard, the fields
    say which rank.
    """
    sharded = "shards" in detail
    if sharded:
        counts = [nonfinite_counts(shard) for shard in shard_details]
        nan, inf = sum(c[0] for c in counts), sum(c[1] for c in counts)
    else:
        nan, inf = nonfinite_counts(detail)
    tags = detail.get("tags") or {}
    fields = [
        ("snapshot", detail["id"]),
        *([("rank", f"{detail['rank']} of {detail['world_size']}")] if "rank" in detail else []),
        *([("ranks", str(detail["world_size"]))] if sharded else []),
        ("run", detail["run"]),
        ("step", str(detail["step"])),
        ("created", detail["created_at"]),
        ("size", f"{size(detail['nbytes'])} ({detail['nbytes']} bytes)"),
        ("gradients", str(detail["num_params"])),
        ("device", str(detail.get("device"))),
        ("backend", str(detail.get("backend") or "-")),
        ("compression", str(detail.get("compression") or "none")),
        ("tags", ", ".join(f"{k}={v}" for k, v in sorted(tags.items())) or "-"),
        ("NaN/Inf", nonfinite_flag(nan, inf)),
    ]
    if detail.get("metadata"):
        fields.append(("metadata", json.dumps(detail["metadata"], sort_keys=True)))
    width = max(len(name) for name, _ in fields)
    head = "\n".join(f"{name.ljust(width)}  {value}" for name, value in fields)
    if sharded:
        return head + "\n\n" + rank_table(detail["shards"], counts)
    rows = [
        [
            g["name"],
            g["param_id"],
            g["dtype"],
            "x".join(str(d) for d in g["shape"]) or "scalar",
            size(g["nbytes"]),
            _number(g["stats"]["l2_norm"]),
            _number(g["stats"]["max_abs"]),
            str(g["stats"]["nan_count"]),
            str(g["stats"]["inf_count"]),
        ]
        for g in detail["gradients"]
    ]
    headers = ["NAME", "PARAM ID", "DTYPE", "SHAPE", "SIZE", "L2 NORM", "MAX |G|", "NaN", "Inf"]
    return head + "\n\n" + table(headers, rows, right=(4, 5, 6, 7, 8))


def rank_table(shards: Sequence[Mapping[str, Any]], counts: Sequence[tuple[int, int]]) -> str:
    """A sharded snapshot's ranks: device, backend, size, gradients and NaN/Inf of each."""
    rows = [
        [
            str(shard["rank"]),
            str(shard["device"]),
            str(shard.get("backend") or "-"),
            size(shard["nbytes"]),
            str(shard["num_params"]),
            nonfinite_flag(*count),
        ]
        for shard, count in zip(shards, counts, strict=True)
    ]
    headers = ["RANK", "DEVICE", "BACKEND", "SIZE", "PARAMS", "NaN/Inf"]
    return table(headers, rows, right=(0, 3, 4))
