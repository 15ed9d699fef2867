"""Timing helpers and the one report table: figure, gradvault, peer, ratio, target, met/missed.

The machine the benchmarks run on is shared, so one timing says little: gradvault and
its peer are run interleaved (ours, peer, ours, peer, ...), and a row reports the median
of each side, the median of the per-pair ratios and their spread (lowest-highest).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one run of ``fn`` in seconds (after a garbage collection)."""
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def round_orders(count: int) -> list[list[int]]:
    """The orders in which :func:`interleaved` runs ``count`` sides, one per round: a
    Williams design, in which each side runs in each place of a round, and right after
    each other side, equally often over the design's rounds (``count`` of them, twice
    that for an odd count). Two sides: A B, then B A.

    For an odd count the reversed orders follow in an order of their own, so that from
    one round to the next, designs repeated included, no side (of three or more) runs
    last in one round and first in the next, and no two sides meet there twice in a
    design. Taken in the plain order, with three sides, two of them ran twice in a row
    (the last of one round, the first of the next) once every six rounds each, and the
    third never."""
    first = [0]
    low, high = 1, count - 1
    while len(first) < count:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(side + shift) % count for side in first] for shift in range(count)]
    if count % 2:
        reversed_orders = [order[::-1] for order in orders]
        orders += reversed_orders[:1] + reversed_orders[:0:-1]
    return orders


def interleaved(
    sides: dict[str, Callable[[], float]],
    repeat: int,
    warmup: int = 0,
    after_round: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Run each side's measurement ``repeat`` times, all sides each round; the samples per
    side.

    A side is a callable returning the seconds of one measured run (it may prepare and
    clean up outside the timed part). The rounds take their orders from
    :func:`round_orders` in turn, so that no side runs first, or right after the same
    other one, more often than the rest (a disk still writing back the previous side's
    bytes, a cache the previous side warmed): over a whole design, every side follows
    every other equally often. (Starting each round one side later would keep the sides in
    one cycle: with seven sides, each would run right after the same one in six rounds of
    seven.) ``after_round``, if given, runs after each round (the warm-up ones too),
    between the last side of one round and the first of the next.
    """
    for _ in range(warmup):
        for measure in sides.values():
            measure()
        if after_round is not None:
            after_round()
    names = list(sides)
    orders = round_orders(len(names))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat):
        for index in orders[round_ % len(orders)]:
            samples[names[index]].append(sides[names[index]]())
        if after_round is not None:
            after_round()
    return samples


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """The fastest of ``repeat`` runs of ``fn`` in seconds, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    return min(timed(fn) for _ in range(repeat))


@dataclass
class Row:
    """One figure: gradvault's samples against a peer's, the target and whether it is met.

    ``limit`` is the most the ratio ours/peer may be (for a figure compared with a peer);
    ``absolute`` the most gradvault's median may be, in seconds (for a figure with no
    peer, such as a latency). ``unit`` is how times print ("ms" or "s"); figures that
    are rates (steps/s, MB/s) put the rate in ``ours``/``peer`` and set ``higher_better``.
    """

    figure: str
    ours: list[float]
    peer_name: str
    peer: list[float] = field(default_factory=list)
    target: str = ""
    limit: float | None = None
    absolute: float | None = None
    higher_better: bool = False
    unit: str = "ms"
    note: str = ""

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def peer_median(self) -> float | None:
        return statistics.median(self.peer) if self.peer else None

    def _ratios(self) -> list[float]:
        if not self.peer:
            return []
        if len(self.ours) == len(self.peer):
            pairs = zip(self.ours, self.peer, strict=True)
        else:
            pairs = iter([(self.ours_median, self.peer_median or 0.0)])
        if self.higher_better:  # a rate: peer/ours, so that below 1 still means "ours faster"
            return [p / o if o else float("inf") for o, p in pairs]
        return [o / p if p else float("inf") for o, p in pairs]

    @property
    def ratio(self) -> float | None:
        """Median of the per-pair ratios; below 1 means gradvault is faster."""
        ratios = self._ratios()
        return statistics.median(ratios) if ratios else None

    @property
    def spread(self) -> tuple[float, float] | None:
        ratios = self._ratios()
        return (min(ratios), max(ratios)) if ratios else None

    @property
    def met(self) -> bool | None:
        """Whether the target holds (None: the figure has no target)."""
        if self.limit is not None and self.ratio is not None:
            return self.ratio <= self.limit
        if self.absolute is not None:
            return self.ours_median <= self.absolute
        return None

    def _show(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.higher_better:
            return f"{value:.1f} {self.unit}"
        return f"{value * 1e3:.2f} ms" if self.unit == "ms" else f"{value:.3f} s"

    def _ratio_shown(self) -> str:
        """The ratio to three decimals, or to as many more as it takes for the number
        shown to fall on the same side of the limit as the ratio itself (1.0004 against
        <= 1.0 shows as 1.0004, not 1.000 beside "MISSED")."""
        ratio = self.ratio
        assert ratio is not None
        for decimals in range(3, 10):
            shown = f"{ratio:.{decimals}f}"
            if self.limit is None or (float(shown) <= self.limit) == (ratio <= self.limit):
                return shown
        return repr(ratio)

    def cells(self) -> list[str]:
        spread = self.spread
        ratio = "-" if self.ratio is None else self._ratio_shown()
        if spread is not None and len(self.ours) > 1:
            ratio += f" ({spread[0]:.2f}-{spread[1]:.2f})"
        verdict = {True: "met", False: "MISSED", None: ""}[self.met]
        return [
            self.figure,
            self._show(self.ours_median),
            f"{self.peer_name} {self._show(self.peer_median)}".strip(),
            ratio,
            self.target,
            verdict,
        ]

    def ratio_text(self) -> str:
        """The ratio against the target, for the list of missed targets."""
        if self.limit is not None and self.ratio is not None:
            return f"ratio {self._ratio_shown()}, target {self.target}"
        return f"{self._show(self.ours_median)}, target {self.target}"

    def as_json(self) -> dict:
        data = asdict(self)
        data.update(
            ours_median=self.ours_median,
            peer_median=self.peer_median,
            ratio=self.ratio,
            spread=self.spread,
            met=self.met,
        )
        return data


HEADER = ["figure", "gradvault (median)", "peer (median)", "ratio (spread)", "target", "met"]


def markdown_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row.cells()) + " |")
    return "\n".join(lines)


def text_table(rows: list[Row]) -> str:
    """The rows as one plain-text table for a terminal."""
    table = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in table
    )


def print_rows(title: str, rows: list[Row]) -> None:
    """Progress while ``make bench`` runs: a section's rows as they are measured."""
    print(f"\n## {title}", flush=True)
    if rows:
        print(text_table(rows), flush=True)
