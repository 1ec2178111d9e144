"""Validation of what callers pass to accept() and begin(batch_size): specobs._acceptance.

Pure functions over records (specobs._acceptance.Record): they read them and return what
they found, and never write a field.
"""

from __future__ import annotations

import math

import pytest

from specobs import _acceptance as A


def Rec(acc=None, draft_length=None, emitted=None, batch=None) -> A.Record:
    """A record as the resolver makes one from what the ring kept (lists copied)."""
    return A.Record(list(acc) if type(acc) in (list, tuple) else acc, draft_length, emitted,
                    batch)


class Reports(list):
    def __call__(self, kind: str, message: str) -> None:
        self.append((kind, message))


class Index:
    """A numpy- or torch-like integer scalar: usable as a count through __index__."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_one_draft_length_for_all_is_read_by_columns_exactly():
    recs = [Rec([0, 3, 2], 3), Rec([1], 3), Rec([3, 3], 3, batch=4)]
    report = Reports()
    acc, batches, _ = A.batch_acceptance(recs, 8, report)
    assert report == []
    assert acc is not None
    assert acc.length_counts == [1, 1, 1, 3, 0, 0, 0, 0, 0]  # 0..max_draft_length
    assert (acc.accepted, acc.drafted, acc.emitted) == (12, 18, 18)
    assert acc.sequences_by_draft_length == {3: 6}
    assert batches == [3, 1, 4]  # a given batch size wins over the sequence count


def test_mixed_draft_lengths_and_per_sequence_lengths_are_exact():
    recs = [
        Rec([1, 2], 2),
        Rec([0, 4], 5),
        Rec([2, 1, 0], [2, 1, 3]),  # one draft length per sequence
        Rec([Index(2)], Index(4)),  # integer scalars of numpy/torch
    ]
    report = Reports()
    acc, batches, _ = A.batch_acceptance(recs, 8, report)
    assert report == []
    assert acc is not None
    assert (acc.accepted, acc.drafted) == (3 + 4 + 3 + 2, 4 + 10 + 6 + 4)
    assert acc.emitted == acc.accepted + 8
    assert acc.sequences_by_draft_length == {2: 3, 5: 2, 1: 1, 3: 1, 4: 1}
    assert batches == [2, 2, 3, 1]


@pytest.mark.parametrize("bad", [
    [1, 9],  # above the draft length
    [1, -1],
    [1, 2.5],
    [1, math.nan],
    [1, "2"],
    [1, None],
    {1: 2},
    {1, 2},
    iter([1, 2]),
    None.__class__,
])
def test_a_bad_value_costs_only_its_own_cycle(bad):
    recs = [Rec([1, 2], 4), Rec(bad, 4), Rec([3], 4)]
    report = Reports()
    found = A.batch_acceptance(recs, 8, report)
    acc = found.acceptance
    assert [kind for kind, _ in report] == ["bad_acceptance"]
    assert acc is not None
    assert (acc.accepted, acc.drafted) == (6, 12)  # the two good cycles, exactly
    # Not shown on the resolved cycle either; the good ones are; the records are unchanged.
    assert [A.resolved_acceptance(found, i, r, 8) is None for i, r in enumerate(recs)] == [
        False, True, False]
    assert recs[1] == Rec(bad, 4)


def test_a_draft_length_over_the_maximum_is_rejected_and_named():
    report = Reports()
    acc, _, _ = A.batch_acceptance([Rec([1], 9)], 8, report)
    assert acc is None
    assert report and "max_draft_length=8" in report[0][1]


def test_emitted_overrides_the_default_and_a_bad_one_falls_back():
    report = Reports()
    acc, _, _ = A.batch_acceptance([Rec([1, 1], 2, emitted=7)], 8, report)
    assert acc is not None and acc.emitted == 7 and report == []
    acc, _, _ = A.batch_acceptance([Rec([1, 1], 2, emitted="x")], 8, report)
    assert acc is not None and acc.emitted == 4  # accepted + one per sequence
    assert [k for k, _ in report] == ["bad_acceptance"]


def test_a_bad_batch_size_is_dropped_and_the_cycle_kept():
    recs = [Rec([1], 2, batch="eight"), Rec([2], 2, batch=3), Rec(None, batch=-1)]
    report = Reports()
    acc, batches, _ = A.batch_acceptance(recs, 8, report)
    assert acc is not None and acc.accepted == 3
    assert batches == [3]
    assert [k for k, _ in report] == ["bad_batch_size", "bad_batch_size"]
    assert recs[0].batch_size == "eight"  # the record as given: the verdict is returned


def test_the_resolved_view_of_each_cycle_sums_to_the_chunk():
    recs = [Rec([1, 2], 2), Rec([0, 4, 1], [5, 4, 1]), Rec([3], 3)]
    found = A.batch_acceptance(recs, 8, Reports())
    acc = found.acceptance
    views = [A.resolved_acceptance(found, i, r, 8) for i, r in enumerate(recs)]
    assert all(v is not None for v in views)
    assert acc is not None
    assert sum(v.accepted for v in views) == acc.accepted
    assert sum(v.drafted for v in views) == acc.drafted
    assert views[1].shape == [5, 4, 1] and views[0].shape == (2, 2)


@pytest.mark.parametrize(("value", "count"), [(3, 3), (3.0, 3), (Index(5), 5)])
def test_as_count_accepts_integral_values(value, count):
    assert A.as_count(value) == count


@pytest.mark.parametrize("value", [True, 1.5, math.nan, math.inf, "3", None, [1]])
def test_as_count_rejects_the_rest(value):
    with pytest.raises((ValueError, TypeError)):
        A.as_count(value)


@pytest.mark.parametrize("records", [
    [([1, 2], 2), ([0, 1], 2)],  # read by columns
    [([1, 2], 2), ([0, 4, 1], [5, 4, 1])],  # per cycle
    [([1, 2], 2), ((Index(1),), Index(2))],  # numpy / torch scalars normalised
])
def test_validation_returns_what_it_found_and_changes_no_record(records):
    """One owner of the record: the functions return their verdicts (the chunk's acceptance,
    the batch sizes, what each cycle shows) and leave every record as it was given."""
    recs = [Rec(a, k) for a, k in records]
    before = [tuple(r) for r in recs]
    found = A.batch_acceptance(recs, 8, Reports())
    assert [tuple(r) for r in recs] == before
    shown = [A.resolved_acceptance(found, i, r, 8) for i, r in enumerate(recs)]
    assert found.acceptance is not None
    assert sum(v.accepted for v in shown if v) == found.acceptance.accepted
    assert len(found.batches) == len(recs)


def test_tokens_emitted_without_drafts_count_alone_in_a_chunk_as_beside_others() -> None:
    """``accept([], emitted=1)`` (a cycle that drafted nothing and emitted one token): its token
    counts whether its chunk holds other acceptance or not -- chunks are the resolver's, and a
    total must not depend on where they fell (found by tests/test_pump.py's random streams)."""
    from specobs._acceptance import Record, batch_acceptance

    empty = Record([], [], 1)
    other = Record([1, 2], 4)
    alone = batch_acceptance([empty], 6, lambda *a: None).acceptance
    beside = batch_acceptance([empty, other], 6, lambda *a: None).acceptance
    other_alone = batch_acceptance([other], 6, lambda *a: None).acceptance
    assert alone is not None and alone.emitted == 1 and alone.drafted == 0
    assert beside is not None and other_alone is not None
    assert beside.emitted == other_alone.emitted + 1
