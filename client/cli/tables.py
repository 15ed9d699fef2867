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


def listing(infos: Sequence[SnapshotInfo], flags: Sequence[str]) -> str:
    """The ``ls`` table: one row per snapshot, its NaN/Inf flag from ``flags``."""
    rows = [
        [
            info.id,
            info.run,
            str(info.step),
            when(info.created_at),
            size(info.nbytes),
            str(info.num_params),
            flag,
        ]
        for info, flag in zip(infos, flags, strict=True)
    ]
    headers = ["ID", "RUN", "STEP", "TIME (UTC)", "SIZE", "PARAMS", "NaN/Inf"]
    return table(headers, rows, right=(2, 4, 5))


def _number(value: Any) -> str:
    if isinstance(value, str):
        return "inf" if value == "Infinity" else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def snapshot_detail(detail: Mapping[str, Any]) -> str:
    """The ``show`` text: the manifest's fields, then a table of the gradients' stats."""
    nan, inf = nonfinite_counts(detail)
    tags = detail.get("tags") or {}
    fields = [
        ("snapshot", detail["id"]),
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
