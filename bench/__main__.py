"""``python -m bench``: every benchmark in one run, then one table of every figure.

The table (figure, gradvault, peer, ratio, target, met/missed) is printed, and written as
``bench/results/latest.json`` and ``bench/results/latest.md``; README.md (tracked) is left
as it is unless asked:

    python -m bench                  run, write bench/results/latest.{json,md}
    python -m bench --readme         the same, then README.md's table replaced by it
    python -m bench --readme-only    README.md's table replaced by bench/results/latest.md,
                                     nothing run (``make bench-readme``)

README.md's table sits between its ``bench-table`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from bench import (
    commit_cost,
    http_io,
    mlp_step,
    record_stall,
    service_list,
    store_io,
    ui_first_paint,
)
from bench._timing import Row, markdown_table, text_table

MODULES = [mlp_step, commit_cost, record_stall, store_io, http_io, service_list, ui_first_paint]
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


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="every benchmark in one run, one table"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--readme", action="store_true", help="also put the new table into README.md"
    )
    where.add_argument(
        "--readme-only",
        action="store_true",
        help="run nothing: put bench/results/latest.md into README.md",
    )
    return parser.parse_args(argv)


def main(
    argv: Sequence[str],
    *,
    modules: Sequence[ModuleType] = MODULES,
    results: Path = RESULTS,
    readme: Path = README,
) -> None:
    """Run ``modules`` and write the table to ``results``; README.md only when asked."""
    arguments = parse_arguments(argv)
    if arguments.readme_only:
        latest = results / "latest.md"
        if not latest.is_file():
            raise SystemExit(f"no {latest} to put into {readme.name}: run `make bench` first")
        update_readme(readme, latest.read_text())
        print(f"{readme}: benchmark table replaced by {latest}")
        return
    started = datetime.now(UTC)
    clock = time.perf_counter()
    print(f"# gradvault benchmarks, {started:%Y-%m-%d %H:%M} UTC, {machine()}", flush=True)
    rows: list[Row] = []
    for module in modules:
        rows += module.run()
    seconds = time.perf_counter() - clock
    print("\n# All figures\n" + text_table(rows))
    results.mkdir(exist_ok=True)
    (results / "latest.json").write_text(
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
    (results / "latest.md").write_text(markdown)
    print(f"\nwritten: {results / 'latest.json'}, {results / 'latest.md'}")
    if arguments.readme:
        update_readme(readme, markdown)
        print(f"{readme}: benchmark table replaced")


def update_readme(readme: Path, markdown: str) -> None:
    """Replace the table between ``readme``'s ``bench-table`` markers by ``markdown``."""
    text = readme.read_text()
    if not _MARKERS.search(text):
        raise SystemExit(
            f"{readme} has no <!-- bench-table --> ... <!-- /bench-table --> markers "
            "around its benchmark table"
        )
    readme.write_text(_MARKERS.sub(lambda m: m.group(1) + markdown + m.group(2), text, count=1))


if __name__ == "__main__":
    main(sys.argv[1:])
