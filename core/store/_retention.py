"""Retention rules: which snapshots a retention pass keeps, checked once, apart from any I/O.

``keep_last`` counts by snapshot id, which is creation order: an id is minted when its
write starts, so "the N newest" are the N most recently captured, the order ``list()``
shows. A snapshot that was minted early but committed late is therefore older than one
that committed before it; the pass that runs after its own commit still keeps it
(``protected``), and a later pass deletes it if no rule keeps it.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence

from ._manifest import SnapshotInfo


def _count(name: str, value: object, least: int) -> int | None:
    """``value`` as an int >= ``least`` (None stays None); ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    # bool is an int to Python, but keep_last=True is a mistake, not a count of one
    if not isinstance(value, bool):
        try:
            count = operator.index(value)  # ints and NumPy integers, not floats or text
        except TypeError:
            pass
        else:
            if count >= least:
                return count
    raise ValueError(
        f"{name} must be an int >= {least} or None; got {value!r} ({type(value).__name__})"
    )


class RetentionRules:
    """What a retention pass keeps: the ``keep_last`` newest and every ``keep_every``-th step.

    Always kept besides: the newest snapshot, and the ids a caller protects. Construction
    refuses anything but an int >= 0 for ``keep_last`` and an int >= 1 for ``keep_every``
    (bools included), so a recorder fails when it is made, not after each commit.
    """

    def __init__(self, keep_last: object = None, keep_every: object = None) -> None:
        self.keep_last = _count("keep_last", keep_last, 0)
        self.keep_every = _count("keep_every", keep_every, 1)

    @property
    def keeps_everything(self) -> bool:
        """True when no rule is set: a pass deletes nothing."""
        return self.keep_last is None and self.keep_every is None

    def doomed(self, newest_first: Sequence[SnapshotInfo], protected: Collection[str]) -> list[str]:
        """The ids of ``newest_first`` (sorted newest first) that nothing keeps, newest first."""
        if self.keeps_everything:
            return []
        doomed = []
        for position, info in enumerate(newest_first):
            kept = (
                position == 0
                or info.id in protected
                or (self.keep_last is not None and position < self.keep_last)
                or (self.keep_every is not None and info.step % self.keep_every == 0)
            )
            if not kept:
                doomed.append(info.id)
        return doomed
