"""What the pure-Python ring hands the resolver: the named results and the running totals.

A drain returns one chunk (:class:`Drained`); ``drain_into`` adds the chunk to the ring's running
totals (:class:`RingTotals`) instead, so the totals are the sum of the chunks drained into them
(:func:`add_chunk`). The native ring (``specobs/_core/``) returns the same tuples, unnamed, in
the same field order: read them with ``Drained._make`` and ``RingTotals._make``. Cycles that need
Python come over as :class:`Detail` records.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from specobs._bucketing import Bucketed

__all__ = [
    "ByDraftLength", "Detail", "Drained", "RingTotals", "add_chunk", "add_counts", "add_ns_by_k",
    "add_stamps_by_k", "copy_totals", "zero_totals",
]

class Detail(NamedTuple):
    """A cycle the resolver finishes in Python, as a drain hands it over (both rings; the
    native one builds the same class, ``set_detail_type`` below)."""

    #: The cycle's index (``CycleHandle.index``).
    cycle_index: int
    #: Its host clock stamps (ns), one per phase boundary: phases + 1.
    stamps: list[int]
    #: ``batch_size`` as given when the ring did not take it (for the resolver's verdict), the
    #: one it took, or ``None``.
    batch: Any
    #: The sampled cycle's CUDA events, one per boundary (``None``: not sampled, or read by the
    #: ring already).
    events: Any
    #: What recording those events cost the worker (ns).
    cost_ns: int
    #: ``native``: the accepted lengths the ring stored (already in the chunk's totals); else
    #: the object the caller gave, or ``None``, for the resolver to validate.
    acceptance: Any
    #: ``native``: the draft length the ring stored; else as the caller gave it.
    draft_length: Any
    #: ``emitted`` as the caller gave it (``None``: accepted + 1 per sequence).
    emitted: Any
    #: A CUDA acceptance copy in flight (read by the resolver), or ``None``.
    copy: Any
    #: 1 when the ring stored the acceptance itself, 0 when the resolver validates it.
    native: int
    #: 1 when the cycle was picked for a trace.
    traced: int
    #: The cycle's draft length (the k in effect, ``begin(draft_length=)`` or else derived from
    #: ``accept``'s): ``>= 0``, the ring counted the cycle and its host phase times under it
    #: (its emitted tokens too when ``native``); -1, the cycle has none; -2, for the resolver:
    #: from ``cycle_k_obj`` when not ``None``, else from the acceptance it validates.
    cycle_k: int
    #: ``begin``'s ``draft_length`` as given, when the ring did not take it (not an int in
    #: 0..max_draft_length): for the resolver's verdict; else ``None``.
    cycle_k_obj: Any


#: What a drain counts by draft length, only the lengths seen, keys sorted: ({cycle k: cycles},
#: {cycle k: host ns per phase}, {cycle k: emitted tokens}, {sequence k: accepted tokens},
#: {cycle k: sequences}: the batch sizes of those cycles, where counted).
ByDraftLength = tuple[
    dict[int, int], dict[int, list[int]], dict[int, int], dict[int, int], dict[int, int]]



class RingTotals(NamedTuple):
    """The running totals :meth:`PyRing.drain_into` (and the native ring's walk) keep of the
    cycles they count without Python: what ``totals()`` returns, by name. A histogram is
    ``(counts per bucket, raw sum)`` (durations in the clock's ns); the per-phase ones list the
    phases, then the whole cycle. :class:`Drained` reuses these names for one chunk."""

    cycles: int
    #: Host-clock durations, per phase then the cycle.
    host: list[Bucketed]
    #: Sequences per accepted length 0..k_max.
    sequences_by_accepted: list[int]
    accepted: int
    drafted: int
    emitted: int
    #: Sequences per draft length (only the lengths seen).
    sequences_by_draft_length: dict[int, int]
    #: Batch sizes: (counts per bucket, sum).
    batch: Bucketed
    #: Cycles whose batch size was counted.
    batches: int
    #: The last counted cycle's end stamp (the ring's clock, ns), or None.
    last_end_ns: int | None
    #: GPU-clock durations of the sampled cycles the ring read itself, per phase then the cycle.
    gpu: list[Bucketed]
    #: Cycles by their draft length (the k in effect; see :attr:`Detail.cycle_k`), only the
    #: lengths seen: the ones the ring could tell (the resolver adds the others).
    cycles_by_draft_length: dict[int, int]
    #: Host-clock ns per phase of those cycles, by the cycle's draft length.
    host_ns_by_draft_length: dict[int, list[int]]
    #: Tokens those cycles emitted (their acceptance counted here), by the cycle's draft length.
    emitted_by_draft_length: dict[int, int]
    #: Accepted tokens by each sequence's own draft length (the drafts it verified).
    accepted_by_draft_length: dict[int, int]
    #: Sequences (the batch sizes the ring counted) of the cycles it placed, by their draft
    #: length; every length of ``cycles_by_draft_length``, 0 where none had a batch size.
    batch_by_draft_length: dict[int, int]
    #: Host-clock gaps between a thread's cycles (counts on the duration bounds, sum ns), and the
    #: gaps longer than ``idle_gap_ns`` counted instead.
    gap: Bucketed
    idle_gaps: int


class Drained(NamedTuple):
    """One chunk, as :meth:`PyRing.drain` returns it (:meth:`PyRing.drain_into` adds it to the
    running totals instead: :func:`add_chunk`). The native ring returns the same tuple,
    unnamed: read it with ``Drained._make``. A field named as one of :class:`RingTotals` holds
    the same count for this chunk's cycles; the others are the chunk's own."""

    cycles: int
    host: list[Bucketed]
    #: Sum of the drained cycles' host durations (ns).
    host_cycle_ns: int
    #: The last drained cycle's end stamp (the ring's clock, ns), or None.
    last_end_ns: int | None
    sequences_by_accepted: list[int]
    accepted: int
    drafted: int
    emitted: int
    sequences_by_draft_length: dict[int, int]
    batch: Bucketed
    batches: int
    #: The cycles the resolver finishes in Python.
    details: list[Detail]
    #: Acceptance copies the drain read itself, for the resolver to hand back to their pool.
    released: list[Any]
    #: The counts by draft length (:data:`ByDraftLength`).
    by_draft_length: ByDraftLength
    gap: Bucketed
    idle_gaps: int


def zero_totals(nph: int, duration_buckets: int, batch_buckets: int, k_max: int) -> RingTotals:
    """Totals of no cycle: histograms of ``duration_buckets`` (``batch_buckets``) counts."""
    return RingTotals(
        0, [([0] * duration_buckets, 0) for _ in range(nph + 1)], [0] * (k_max + 1), 0, 0, 0,
        {}, ([0] * batch_buckets, 0), 0, None,
        [([0] * duration_buckets, 0) for _ in range(nph + 1)],
        {}, {}, {}, {}, {}, ([0] * duration_buckets, 0), 0)


def _added(a: Bucketed, b: Bucketed) -> Bucketed:
    return [x + y for x, y in zip(a[0], b[0], strict=True)], a[1] + int(b[1])


def add_chunk(t: RingTotals, chunk: Drained, gpu: list[Bucketed] | None) -> RingTotals:
    """``t`` with ``chunk`` added, and the GPU times the drain read itself (``gpu``: one
    histogram per phase, then the cycle). The counts by draft length are added in place."""
    if gpu:
        t = t._replace(gpu=[_added(a, b) for a, b in zip(t.gpu, gpu, strict=True)])
    if not chunk.cycles:
        return t
    kcyc, khost, kem, kacc, kbat = chunk.by_draft_length
    add_counts(t.sequences_by_draft_length, chunk.sequences_by_draft_length)
    add_counts(t.cycles_by_draft_length, kcyc)
    add_ns_by_k(t.host_ns_by_draft_length, khost)
    add_counts(t.emitted_by_draft_length, kem)
    add_counts(t.accepted_by_draft_length, kacc)
    add_counts(t.batch_by_draft_length, kbat)
    return t._replace(
        cycles=t.cycles + chunk.cycles,
        host=[_added(a, b) for a, b in zip(t.host, chunk.host, strict=True)],
        sequences_by_accepted=[a + b for a, b in zip(
            t.sequences_by_accepted, chunk.sequences_by_accepted, strict=True)],
        accepted=t.accepted + chunk.accepted,
        drafted=t.drafted + chunk.drafted,
        emitted=t.emitted + chunk.emitted,
        batch=_added(t.batch, chunk.batch),
        batches=t.batches + chunk.batches,
        last_end_ns=chunk.last_end_ns,
        gap=_added(t.gap, chunk.gap),
        idle_gaps=t.idle_gaps + chunk.idle_gaps,
    )


def copy_totals(t: RingTotals) -> RingTotals:
    """A copy of ``t`` that shares no list or dict with it, the keys by draft length sorted."""

    def hists(h: list[Bucketed]) -> list[Bucketed]:
        return [(list(c), s) for c, s in h]

    def by_k(d: dict[int, int]) -> dict[int, int]:
        return {k: d[k] for k in sorted(d)}

    return RingTotals(
        t.cycles, hists(t.host), list(t.sequences_by_accepted), t.accepted, t.drafted, t.emitted,
        by_k(t.sequences_by_draft_length), (list(t.batch[0]), t.batch[1]), t.batches,
        t.last_end_ns, hists(t.gpu), by_k(t.cycles_by_draft_length),
        {k: list(t.host_ns_by_draft_length[k]) for k in sorted(t.host_ns_by_draft_length)},
        by_k(t.emitted_by_draft_length), by_k(t.accepted_by_draft_length),
        by_k(t.batch_by_draft_length), (list(t.gap[0]), t.gap[1]), t.idle_gaps)


def add_stamps_by_k(into: dict[int, list[int]], k: int, stamps: Any, nph: int) -> None:
    """Add one cycle's host ns per phase (from its ``nph + 1`` stamps) under draft length
    ``k``: what the ring counts of the cycles it places, and the resolver of the others."""
    have = into.get(k)
    if have is None:
        have = into[k] = [0] * nph
    for i in range(nph):
        have[i] += stamps[i + 1] - stamps[i]


def add_ns_by_k(into: dict[int, list[int]], more: dict[int, list[int]]) -> None:
    """Add host ns per phase by draft length ``more`` into ``into`` (lists are not shared)."""
    for k, ns in more.items():
        have = into.get(k)
        into[k] = list(ns) if have is None else [a + b for a, b in zip(have, ns, strict=True)]


def add_counts(into: dict[int, int], more: dict[int, int]) -> None:
    """Add counts by key ``more`` into ``into``."""
    for k, n in more.items():
        into[k] = into.get(k, 0) + n

