"""Retention rules: which snapshots a retention pass keeps, checked once, apart from any I/O.

``keep_last`` counts by snapshot id, which is creation order: an id is minted when its
write starts, so "the N newest" are the N most recently captured, the order ``list()``
shows. A snapshot that was minted early but committed late is therefore older than one
that committed before it; the pass that runs after its own commit still keeps it
(``protected``), and a later pass deletes it if no rule keeps it.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import FormatVersionError, InvalidArgumentError, SnapshotNotFoundError
from ._manifest import SnapshotInfo

if TYPE_CHECKING:
    from ._manifest_cache import ManifestCache
    from ._snapshot_store import SnapshotStore

_log = logging.getLogger("gradvault.store")
#: How many times a retention pass decides again when the newest snapshot vanishes under it.
RETENTION_ROUNDS = 3


def _count(name: str, value: Any, least: int) -> int | None:
    """``value`` as an int >= ``least`` (None stays None); InvalidArgumentError (a
    ValueError) naming ``name`` otherwise."""
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
    raise InvalidArgumentError(
        f"{name} must be an int >= {least} or None; got {value!r} ({type(value).__name__})"
    )


class RetentionRules:
    """What a retention pass keeps: the ``keep_last`` newest and every ``keep_every``-th step.

    Always kept besides: the newest snapshot, and the ids a caller protects. Construction
    refuses anything but an int >= 0 for ``keep_last`` and an int >= 1 for ``keep_every``
    (bools included), so a recorder fails when it is made, not after each commit.
    """

    #: How many times a pass decides again when the newest snapshot vanishes under it (a
    #: store's :class:`RetentionPass`, and the client's ``apply_retention`` over HTTP).
    rounds = RETENTION_ROUNDS

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


class RetentionPass:
    """One ``apply_retention`` over a store: decide from a fresh listing, then delete.

    The pass decides from a fresh listing (every manifest checked now, no cache; the
    newest one read and validated again), and before each deletion checks that the
    newest snapshot it keeps is still there; if someone else deleted it meanwhile, it
    decides again (RETENTION_ROUNDS times at most) rather than leave the store without it.
    """

    def __init__(
        self,
        store: SnapshotStore,
        manifests: ManifestCache,
        rules: RetentionRules,
        protected: set[str],
    ) -> None:
        self._store = store
        #: the store's manifest cache: the pass lists, forgets and reloads through it
        self._manifests = manifests
        self._rules = rules
        self._protected = protected

    async def run(self, run: str | None) -> list[str]:
        """Delete what no rule keeps among the snapshots of ``run`` (or all); the ids."""
        store = self._store
        deleted: list[str] = []
        for _ in range(RETENTION_ROUNDS):
            infos = await self._readable_newest_first(run)
            for snapshot_id in self._rules.doomed(infos, self._protected):
                if not await store.backend.is_committed(infos[0].id):
                    break  # the newest we keep is gone: decide again from a new listing
                try:
                    await store.delete(snapshot_id)
                except SnapshotNotFoundError:
                    pass  # deleted by someone else meanwhile
                deleted.append(snapshot_id)
            else:
                return deleted
        _log.warning(
            "store %s: retention stopped: in each of %d rounds the newest snapshot it "
            "kept was deleted by someone else before it was done; it deleted %s",
            store.location,
            RETENTION_ROUNDS,
            deleted,
        )
        return deleted

    async def _readable_newest_first(self, run: str | None) -> list[SnapshotInfo]:
        """A fresh listing whose first snapshot's manifest was just read and validated.

        The snapshots this store wrote are listed from what it wrote, not from what a
        reader would parse; retention must not keep one that readers refuse as "the
        newest" and delete the newest good one for it. Snapshots found unreadable here
        are left out (and left alone).
        """
        store = self._store
        infos = await self._manifests.listing(
            run, None, None, fresh=True, concurrency=store.max_concurrency
        )
        while infos:
            newest = infos[0].id
            self._manifests.forget(newest)
            try:
                await self._manifests.top(newest)
            except SnapshotNotFoundError:
                pass  # deleted since the listing
            except FormatVersionError as error:
                _log.warning(
                    "store %s: retention leaves snapshot %s alone, readers refuse it: %s",
                    store.location,
                    newest,
                    error,
                )
            else:
                return infos
            infos = infos[1:]
        return infos
