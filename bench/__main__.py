"""``python -m bench``: every benchmark in one run, then one table of every figure.

The table (figure, gradvault, peer, ratio, target, met/missed) is printed, and written as
``bench/results/latest.json`` and ``bench/results/latest.md``; with ``--readme`` it also
replaces the table in README.md (between its ``bench-table`` markers).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import http_io, mlp_step, record_stall, service_list, store_io, ui_first_paint
from bench._timing import Row, markdown_table, text_table

MODULES = [mlp_step, record_stall, store_io, http_io, service_list, ui_first_paint]
RESULTS = Path(__file__).parent / "results"
README = Path(__file__).parent.parent / "README.md"
_MARKERS = re.compile(r"(<!-- bench-table -->\n).*?(<!-- /bench-table -->)", re.S)


def machine() -> str:
    """The machine in a few words: CPU model, cores, Python."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"


def report(rows: list[Row], started: datetime, seconds: float) -> str:
    """The Markdown report: date, machine, the table, and every missed target listed."""
    missed = [row for row in rows if row.met is False]
    lines = [
        f"Measured {started:%Y-%m-%d %H:%M} UTC on {machine()} ({seconds / 60:.1f} min); "
        "medians of interleaved runs, the ratio is the median of per-pair ratios "
        "(spread: lowest-highest).",
        "",
        markdown_table(rows),
        "",
    ]
    if missed:
        lines.append("Missed targets:")
        lines += [f"- {row.figure} vs {row.peer_name}: {row.ratio_text()}" for row in missed]
    else:
        lines.append("Every target with a verdict was met.")
    notes = [row for row in rows if row.note]
    if notes:
        lines += ["", "Notes:"] + [f"- {row.figure}: {row.note}" for row in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    started = datetime.now(UTC)
    clock = time.perf_counter()
    print(f"# gradvault benchmarks, {started:%Y-%m-%d %H:%M} UTC, {machine()}", flush=True)
    rows: list[Row] = []
    for module in MODULES:
        rows += module.run()
    seconds = time.perf_counter() - clock
    print("\n# All figures\n" + text_table(rows))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(
        json.dumps(
            {
                "date": started.isoformat(),
                "machine": machine(),
                "seconds": seconds,
                "blas": mlp_step.blas_config(),
                "rows": [row.as_json() for row in rows],
            },
            indent=2,
        )
    )
    markdown = report(rows, started, seconds)
    (RESULTS / "latest.md").write_text(markdown)
    if "--readme" in argv:
        text = README.read_text()
        if not _MARKERS.search(text):
            raise SystemExit("README.md has no <!-- bench-table --> markers")
        README.write_text(_MARKERS.sub(lambda m: m.group(1) + markdown + m.group(2), text))
    print(f"\nwritten: {RESULTS / 'latest.json'}, {RESULTS / 'latest.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
