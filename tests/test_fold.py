"""Drop and error counts folded as differences of running totals (specobs/_fold.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from specobs import catalog
from specobs._fold import Folder, drops_now


def recorder(**kw: Any) -> Any:
    """The recorder's counts the folder reads; ``changes`` moves with any Python-side count."""
    rec = SimpleNamespace(dropped_pool=0, dropped_capture=0, drops={}, errors={}, changes=0)
    vars(rec).update(kw)
    return rec


#: The ring's counters(): misuse, queue_full, unsettled, two native-read counts, exception.
ZERO = (0, 0, 0, 0, 0, 0)


def test_every_drop_reason_is_read_at_its_running_total():
    rec = recorder(dropped_pool=2, dropped_capture=3, drops={"clock_backwards": 4})
    assert drops_now(rec, (5, 6, 7, 99, 98, 8)) == {
        "event_pool_exhausted": 2, "graph_capture": 3, "misuse": 5, "queue_full": 6,
        "unsettled": 7, catalog.DROP_REASON_EXCEPTION: 8, "clock_backwards": 4,
    }


def test_a_fold_hands_on_only_what_moved_since_the_last():
    rec = recorder(errors={"bad_acceptance": 2})
    f = Folder()
    assert f.take(rec, (0, 3, 0, 0, 0, 0)) == ({"queue_full": 3}, {"bad_acceptance": 2})
    rec.errors["bad_acceptance"] = 5
    rec.errors["sink_error"] = 1
    rec.drops["clock_backwards"] = 1
    rec.changes += 3
    assert f.take(rec, (1, 3, 0, 0, 0, 0)) == (
        {"misuse": 1, "clock_backwards": 1}, {"bad_acceptance": 3, "sink_error": 1})


def test_nothing_new_builds_nothing():
    rec = recorder()
    f = Folder()
    f.take(rec, (0, 1, 0, 0, 0, 0))
    dropped, errors = f.take(rec, (0, 1, 0, 0, 0, 0))
    assert dropped == errors == {}
    assert f.seen == ((0, 1, 0, 0, 0, 0), 0)


def test_a_python_count_is_seen_by_the_recorders_changes():
    rec = recorder()
    f = Folder()
    f.take(rec, ZERO)
    rec.dropped_pool = 4  # counted on the worker: changes moves with it
    assert f.take(rec, ZERO) == ({}, {})  # changes did not move: nothing looked at
    rec.changes += 1
    assert f.take(rec, ZERO) == ({"event_pool_exhausted": 4}, {})


def test_after_rebase_only_counts_made_since_are_folded():
    rec = recorder(dropped_capture=7, errors={"bad_batch_size": 2})
    f = Folder()
    f.rebase(rec, (1, 2, 0, 0, 0, 0))  # a forked child: these were the parent's
    rec.errors["bad_batch_size"] = 3
    rec.changes += 1
    assert f.take(rec, (1, 4, 0, 0, 0, 0)) == ({"queue_full": 2}, {"bad_batch_size": 1})
