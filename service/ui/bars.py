"""Bar charts drawn on the server (SVG in the page): per-layer norms and norm ratios.

They need no script, so a snapshot and a diff read the same with JavaScript off. Norms
span many decades, so bar lengths are logarithmic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: a ratio bar is full length at this many decades (1000x bigger or smaller)
RATIO_DECADES = 3.0


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: its label, the value shown, its length (0..1 of the chart) and whether bad."""

    label: str
    value: float | None
    length: float
    bad: bool


@dataclass(frozen=True, slots=True)
class NormChart:
    """Bars on a log scale from 10**low (length 0) to 10**high (length 1)."""

    bars: list[Bar]
    low: int
    high: int


def norm_chart(labels: list[str], norms: list[float], bad: list[bool]) -> NormChart:
    """A log-scale bar per label; a norm that is zero, NaN or infinite gets no bar."""
    drawable = [norm for norm in norms if 0 < norm < math.inf]
    if drawable:
        low = math.floor(math.log10(min(drawable)))
        high = max(math.ceil(math.log10(max(drawable))), low + 1)
    else:
        low, high = 0, 1
    bars = []
    for label, norm, is_bad in zip(labels, norms, bad, strict=True):
        if 0 < norm < math.inf:
            length = (math.log10(norm) - low) / (high - low)
            bars.append(Bar(label, norm, max(length, 0.005), is_bad))
        else:
            # no bar: zero (fine) or an overflowed norm (bad)
            shown = norm if math.isfinite(norm) else None
            bars.append(Bar(label, shown, 0.0, is_bad or not math.isfinite(norm)))
    return NormChart(bars, low, high)


def ratio_length(ratio: float | None) -> float:
    """How far a ratio's bar reaches from the middle, -1..1 (log10, RATIO_DECADES = 1)."""
    if ratio is None or not 0 < ratio < math.inf:
        return 0.0
    return max(-1.0, min(1.0, math.log10(ratio) / RATIO_DECADES))
