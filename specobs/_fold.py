"""Drop and error counts folded into the aggregation as differences of running totals.

The recorder and its ring count drops by reason and errors by kind as running totals, on the
hot path and from any thread. The resolver hands the aggregation only what moved since it last
looked: :meth:`Folder.take` answers those differences, and remembers the totals it answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import specobs.catalog as catalog

if TYPE_CHECKING:
    from specobs._recorder import Recorder

__all__ = ["Folder", "drops_now"]

#: What :meth:`Folder.take` returns when nothing moved (never written to).
_NOTHING: dict[str, int] = {}


def drops_now(rec: Recorder, counts: tuple[int, ...]) -> dict[str, int]:
    """Every drop reason the recorder and its ring count, at its running total (``counts``:
    the ring's ``counters()``)."""
    return {
        "event_pool_exhausted": rec.dropped_pool,
        "graph_capture": rec.dropped_capture,
        "misuse": counts[0],
        "queue_full": counts[1],
        "unsettled": counts[2],
        catalog.DROP_REASON_EXCEPTION: counts[5],
        **rec.drops,
    }


def _totals(rec: Recorder, counts: tuple[int, ...]) -> dict[str, int]:
    """Drops by reason and errors by kind (keyed ``err:<kind>``), at their running totals."""
    return {**drops_now(rec, counts), **{"err:" + kind: n for kind, n in list(rec.errors.items())}}


class Folder:
    """The totals last folded, and the differences since."""

    def __init__(self) -> None:
        #: Running totals as last folded: drop reasons by name, error kinds as ``err:<kind>``.
        self.folded: dict[str, int] = {}
        #: The ring's counters and the recorder's ``changes`` when last folded: the common
        #: chunk, with nothing new, compares this one tuple and builds nothing.
        self.seen: tuple[object, ...] = ()

    def rebase(self, rec: Recorder, counts: tuple[int, ...]) -> None:
        """Fold from the totals as they are now (a forked child: what the recorder counted
        before the fork is the parent's)."""
        self.folded = _totals(rec, counts)

    def take(self, rec: Recorder, counts: tuple[int, ...]) -> tuple[dict[str, int],
                                                                     dict[str, int]]:
        """What the recorder counted since the last call: drops by reason, errors by kind.
        ``counts``: the ring's ``counters()``, read once per chunk."""
        seen = (counts, rec.changes)
        if seen == self.seen:
            return _NOTHING, _NOTHING
        self.seen = seen
        folded = self.folded
        dropped: dict[str, int] = {}
        for key, value in drops_now(rec, counts).items():
            prev = folded.get(key, 0)
            if value != prev:
                dropped[key] = value - prev
                folded[key] = value
        errors: dict[str, int] = {}
        for kind, value in list(rec.errors.items()):
            key = "err:" + kind
            prev = folded.get(key, 0)
            if value != prev:
                errors[kind] = value - prev
                folded[key] = value
        return dropped, errors
