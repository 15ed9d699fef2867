"""Timing helpers: best-of-N wall time of a callable, and the report table."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """The fastest of ``repeat`` runs of ``fn`` in seconds, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass(frozen=True)
class Row:
    """One comparison: gradvault's time against a peer's, and the ratio with its target."""

    name: str
    ours: float
    peer_name: str
    peer: float
    target: str = ""

    @property
    def ratio(self) -> float:
        """ours / peer: below 1 means gradvault is faster."""
        return self.ours / self.peer if self.peer else float("inf")


def print_rows(title: str, rows: list[Row]) -> None:
    print(f"\n## {title}")
    print(f"{'measurement':44s} {'gradvault':>11s} {'peer':>28s} {'ours/peer':>10s}  target")
    for r in rows:
        print(
            f"{r.name:44s} {r.ours * 1e3:9.3f}ms {r.peer_name:>18s} {r.peer * 1e3:7.3f}ms "
            f"{r.ratio:10.4f}  {r.target}"
        )
