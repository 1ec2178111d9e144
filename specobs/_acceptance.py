"""Validation of what callers pass to ``accept()`` and ``begin(batch_size)``: pure functions.

The hot path stores whatever it is given, untouched; the resolver calls these functions on each
chunk of records before anything is applied to the aggregation. Bad values cost only themselves:
a value that cannot be read as counts is reported through ``report(kind, message)`` (the
recorder counts it in ``errors{kind}`` and logs it at a limited rate) and that cycle's value is
left out, nothing else. Counts are ints, integral floats and numpy / torch integer scalars;
bools are not (``[True, False]`` is a mask, not two lengths), on either path and whatever else
is in the chunk.

The common case -- every cycle gave a list, one integer draft length, the default emitted count
-- is checked for a whole chunk with C-level builtins and no Python work per cycle or per
sequence (:func:`batch_acceptance`); anything else, or any bad value, goes through the per-cycle
path (:func:`cycle_acceptance`).

Records are :class:`Record` tuples: what the hot path's ring kept as objects for one cycle
(specobs/_ring.py: anything it did not count itself), as the caller gave them. The functions
only read them, and return what they found (:class:`Validated`): the chunk's acceptance, its
batch sizes, and the acceptance each cycle shows on its resolved cycle. The resolver owns the
records; nothing writes a field of one after it is made.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Set
from operator import attrgetter
from typing import Any, NamedTuple

from specobs import _bucketing
from specobs._config import MAX_DRAFT_LENGTH
from specobs._model import Acceptance, BatchAcceptance
from specobs._recorder import short_repr

__all__ = [
    "MAX_BATCH",
    "MAX_DRAFT_LENGTH",
    "MAX_TOKENS",
    "Record",
    "Report",
    "Validated",
    "as_count",
    "batch_acceptance",
    "batch_size_of",
    "batch_sizes",
    "bounded_count",
    "cycle_acceptance",
    "cycle_draft_length",
    "draft_length_of",
    "integer_or_none",
    "resolved_acceptance",
]


class Record(NamedTuple):
    """One cycle's values as the caller passed them and the ring kept them, never changed."""

    #: The accepted lengths as given (a list, a tuple, an array, ...), or None.
    accepted: Any = None
    #: ``draft_length`` as given: an int, one per sequence, None (the observer's maximum).
    draft_length: Any = None
    #: ``emitted`` as given, or None (accepted + one per sequence).
    emitted: Any = None
    #: ``batch_size`` as given, or None (the number of sequences).
    batch_size: Any = None


class Validated(NamedTuple):
    """What the validation of a chunk of records found."""

    #: The chunk's acceptance (None when no cycle gave any valid).
    acceptance: BatchAcceptance | None
    #: The batch size of each cycle that has a valid one.
    batches: list[int]
    #: Per record, in order, the acceptance its resolved cycle shows (None: none given, or bad
    #: and reported); None as a whole when every record was read by columns (lists, one draft
    #: length, default emitted), whose acceptance :func:`resolved_acceptance` derives.
    cycles: list[Acceptance | None] | None = None


#: ``report(kind, message)``: count one bad value of ``kind`` (an ``errors{kind}`` label value).
#: A caller's value appears in ``message`` only through ``short_repr`` (bounded text and work).
Report = Callable[[str, str], None]

#: Largest batch size counted; anything above is a caller's bug, not a batch.
MAX_BATCH = 1 << 31
#: Most sequences one cycle's acceptance may hold (bounds the resolver's work per cycle).
MAX_SEQUENCES = 1 << 20
#: Most tokens one call may count: a cycle's ``emitted`` (a count, or the sum of one per
#: sequence), a ``drafts_unverified`` report, a finished request's drafted tokens. Far above any
#: real batch, and low enough that no running total reaches 2**63 - 1 -- the largest integer an
#: exporter can encode (OTLP's int64; one value past it fails every later export of the
#: process) -- before two billion calls at the bound itself.
MAX_TOKENS = 1 << 32

_GET_ACC = attrgetter("accepted")
_GET_EMITTED = attrgetter("emitted")
_GET_DRAFT_LEN = attrgetter("draft_length")
_GET_BATCH = attrgetter("batch_size")
_LIST_ONLY = {list}
_INT_ONLY = {int}
_NONE_ONLY = {None}


def batch_acceptance(
    cycles: list[Record], max_draft_length: int, report: Report
) -> Validated:
    """The acceptance of a chunk (``None`` when no cycle gave any), its batch sizes and what
    each cycle shows.

    By columns when it can: :func:`specobs._bucketing.count_lengths` counts the whole chunk's
    accepted lengths at C speed and raises on a non-int or a value above the draft length
    anywhere. Anything else goes to the per-cycle path, which counts a bad value against its
    own cycle.
    """
    try:
        fast = _columns(cycles, max_draft_length)
    except (TypeError, ValueError, OverflowError, AttributeError):
        fast = None
    return fast if fast is not None else _each(cycles, max_draft_length, report)


def _columns(cycles: list[Record], k_max: int) -> Validated | None:
    accs = list(map(_GET_ACC, cycles))
    if set(map(type, accs)) != _LIST_ONLY:
        return None
    if set(map(_GET_EMITTED, cycles)) != _NONE_ONLY:  # a list there raises TypeError
        return None
    dls = set(map(_GET_DRAFT_LEN, cycles))
    if len(dls) != 1:
        return None
    (k,) = dls
    if k is None:
        k = k_max
    elif type(k) is not int or not 0 <= k <= k_max:
        return None
    # Every value an int in 0..k, counted per accepted length (compiled where built; raises
    # otherwise, and the per-cycle path finds the bad values).
    counts = _bucketing.count_lengths(accs, k, k_max + 1)
    sequences = sum(counts)
    if k == 0:  # nothing drafted: the sequences emit a token each, but are no drafts
        counts = [0] * (k_max + 1)
    given = list(map(_GET_BATCH, cycles))
    if given.count(None) == len(given):
        batches = list(map(len, accs))
    else:
        batches = [len(a) if b is None else b for a, b in zip(accs, given, strict=True)]
        if not _batches_ok(batches):
            return None
    accepted = 0
    for v in range(1, k + 1):
        accepted += v * counts[v]
    return Validated(BatchAcceptance(counts, accepted, k * sequences, accepted + sequences,
                                     {k: sequences}, {k: accepted}), batches)


def _each(cycles: list[Record], k_max: int, report: Report) -> Validated:
    """The chunk in two groups: cycles that gave a list with an int draft length and the default
    emitted count (validated together over their concatenation), and the rest, validated one by
    one (as is the first group when its joint check fails). Batch sizes likewise: a column check,
    then per cycle."""
    g = _grouped(cycles, k_max)
    shown: list[Acceptance | None] = [None] * len(cycles)
    total = _Total([0] * (k_max + 1), {}, 0, 0, 0, {})
    slow = g.slow
    if g.fast:
        joint = _joint(g, k_max)
        if joint is None:  # someone sent bad values: find and count them one by one
            slow = g.fast + slow
        else:
            total = joint
            for i in g.fast:
                shown[i] = _listed(cycles[i].accepted, k_max if g.dls[i] is None else g.dls[i])
    if slow:
        total = _one_by_one(cycles, slow, g.dls, k_max, report, shown, total)
    batches = g.batches
    if slow or not _batches_ok(batches):
        batches = batch_sizes(cycles, report, shown)
    counts, k_counts, accepted, drafted, emitted, k_accepted = total
    # A chunk whose only acceptance is tokens emitted without drafts (``accept([],
    # emitted=n)``) still has them: the same count alone in its chunk as beside others.
    if not any(counts) and not k_counts and not emitted:
        return Validated(None, batches, shown)
    return Validated(BatchAcceptance(counts, accepted, drafted, emitted, k_counts, k_accepted),
                     batches, shown)


class _Groups(NamedTuple):
    """A chunk sorted for :func:`_each`: the positions of the cycles validated together (lists,
    an int draft length, the default emitted count) with their joint figures, and the rest."""

    fast: list[int]
    #: The fast group's accepted lengths, concatenated.
    lengths: list[int]
    #: Sequences per draft length in the fast group.
    k_counts: dict[int, int]
    slow: list[int]
    #: The batch sizes the fast group and the cycles without acceptance gave or imply.
    batches: list[int]
    #: Per cycle, its draft length with numpy / torch scalars made ints.
    dls: list[Any]
    #: The fast group's draft length and sequences, per cycle (accepted tokens by draft length).
    fast_k: list[int]
    fast_n: list[int]


class _Total(NamedTuple):
    """What a chunk's valid acceptance adds up to."""

    counts: list[int]  # sequences per accepted length
    k_counts: dict[int, int]  # sequences per draft length
    accepted: int
    drafted: int
    emitted: int
    k_accepted: dict[int, int]  # accepted tokens per draft length


def _grouped(cycles: list[Record], k_max: int) -> _Groups:
    g = _Groups([], [], {}, [], [], [None] * len(cycles), [], [])
    for i, c in enumerate(cycles):
        acc = c.accepted
        if acc is None:
            if c.batch_size is not None:
                g.batches.append(c.batch_size)
            continue
        dl = c.draft_length
        if dl is not None and type(dl) is not int:
            dl = _as_scalar_count(dl)  # numpy / torch scalars; else as was
        g.dls[i] = dl
        if (type(acc) is list and (dl is None or type(dl) is int)
                and c.emitted is None):
            k = k_max if dl is None else dl
            n = len(acc)
            g.lengths.extend(acc)
            g.fast.append(i)
            g.fast_k.append(k)
            g.fast_n.append(n)
            g.k_counts[k] = g.k_counts.get(k, 0) + n
            g.batches.append(n if c.batch_size is None else c.batch_size)
        else:
            g.slow.append(i)
    return g


def _joint(g: _Groups, k_max: int) -> _Total | None:
    """The fast group's total, checked in one pass over its concatenated lengths (None: some
    value is not an int in 0..its draft length)."""
    width = k_max + 1
    k_min = min(g.k_counts)  # the smallest draft length: every value must fit under it
    if k_min < 0 or max(g.k_counts) > k_max:
        return None
    counts = [0] * width
    if g.lengths:
        try:  # raises on any element that is not an int in 0..k_min
            counts = _bucketing.count_lengths([g.lengths], k_min, width)
        except (TypeError, ValueError, OverflowError):
            return None
    # Sequences of cycles that drafted nothing (k = 0, so every value was 0) are no drafts:
    # they emit a token each but have no accept length.
    counts[0] -= g.k_counts.get(0, 0)
    accepted = sum(v * n for v, n in enumerate(counts))
    drafted = sum(k * n for k, n in g.k_counts.items())
    if len(g.k_counts) == 1:
        k_accepted = dict.fromkeys(g.k_counts, accepted)
    else:  # several draft lengths: each cycle's sum, by its own (validated ints by now)
        k_accepted = dict.fromkeys(g.k_counts, 0)
        at = 0
        lengths = g.lengths
        for k, n in zip(g.fast_k, g.fast_n, strict=True):
            k_accepted[k] += sum(lengths[at:at + n])
            at += n
    return _Total(counts, dict(g.k_counts), accepted, drafted, accepted + len(g.lengths),
                  k_accepted)


def _one_by_one(cycles: list[Record], positions: list[int], dls: list[Any], k_max: int,
                report: Report, shown: list[Acceptance | None], total: _Total) -> _Total:
    """``total`` with the cycles at ``positions`` validated one by one; each one's acceptance
    goes to ``shown`` (None: invalid and counted, not shown on its resolved cycle either)."""
    counts, k_counts, accepted, drafted, emitted, k_accepted = total
    k_counts = dict(k_counts)
    k_accepted = dict(k_accepted)
    valid: list[list[int]] = []
    for i in positions:
        a = cycle_acceptance(cycles[i]._replace(draft_length=dls[i]), k_max, report)
        shown[i] = a
        if a is None:
            continue
        shape = a.shape
        if isinstance(shape, tuple):
            if shape[0] > 0:
                valid.append(a.lengths)
            k_counts[shape[0]] = k_counts.get(shape[0], 0) + shape[1]
            k_accepted[shape[0]] = k_accepted.get(shape[0], 0) + a.accepted
        else:  # only the sequences that drafted something have an accept length
            valid.append([v for v, kk in zip(a.lengths, shape, strict=True) if kk > 0])
            for v, kk in zip(a.lengths, shape, strict=True):
                k_counts[kk] = k_counts.get(kk, 0) + 1
                k_accepted[kk] = k_accepted.get(kk, 0) + v
        accepted += a.accepted
        drafted += a.drafted
        emitted += a.emitted
    if valid:  # validated per cycle: ints in 0..max_draft_length
        more = _bucketing.count_lengths(valid, k_max, len(counts))
        counts = list(map(operator.add, counts, more))
    return _Total(counts, k_counts, accepted, drafted, emitted, k_accepted)


def _listed(acc: list[Any], k: int) -> Acceptance:
    """The acceptance of a list validated with its chunk: counts in 0..k (numpy / torch integer
    scalars among them made ints)."""
    if set(map(type, acc)) - {int}:
        acc = [operator.index(x) for x in acc]
    n = sum(acc)
    return Acceptance(acc, n, k * len(acc), n + len(acc), (k, len(acc)))


def batch_sizes(cycles: Iterable[Record], report: Report,
                shown: list[Acceptance | None] | None = None) -> list[int]:
    """Batch size of each cycle that has one (given, or the number of sequences whose acceptance
    is valid: ``shown``, what the validation found per cycle), validated one by one; a bad given
    size is reported and dropped (the cycle stays). Used only when the column check failed."""
    batches: list[int] = []
    for i, c in enumerate(cycles):
        b = c.batch_size
        if b is not None:
            v = batch_size_of(b)
            if v is None:
                report(
                    "bad_batch_size",
                    f"batch_size must be an integer between 0 and {MAX_BATCH}, got "
                    f"{short_repr(b)}; the cycle is kept without a batch size",
                )
            else:
                batches.append(v)
            continue
        a = shown[i] if shown is not None else None
        if a is not None:
            batches.append(len(a.lengths))
        elif shown is None and type(c.accepted) is list:
            batches.append(len(c.accepted))
    return batches


def resolved_acceptance(validated: Validated, i: int, record: Record,
                        max_draft_length: int) -> Acceptance | None:
    """The acceptance the ``i``-th record of a validated chunk shows on its
    :class:`ResolvedCycle`. ``lengths`` may be the caller's list: copy it to keep it."""
    if validated.cycles is not None:
        return validated.cycles[i]
    acc = record.accepted  # read by columns: a list of ints in 0..k, one int draft length
    if type(acc) is list:
        dl = record.draft_length
        return _listed(acc, max_draft_length if dl is None else dl)
    return None


def cycle_acceptance(c: Record, max_draft_length: int, report: Report) -> Acceptance | None:
    """Validated acceptance of one cycle, or ``None`` (nothing given, or bad and reported).

    Whatever the caller passed, this never raises: a value that cannot be read as counts
    costs this cycle's acceptance and one ``report("bad_acceptance", ...)``.
    """
    try:
        return _cycle_acceptance(c, max_draft_length, report)
    except Exception as exc:
        report("bad_acceptance", f"could not read the acceptance: {short_repr(exc, 200)}")
        return None


def _cycle_acceptance(c: Record, k_max: int, report: Report) -> Acceptance | None:
    acc = c.accepted
    if acc is None:
        return None
    if type(acc) is not list and not _is_sequence(acc):
        report(
            "bad_acceptance",
            f"accepted lengths must be a sequence of integers (list, tuple, array, tensor), "
            f"got {type(acc).__name__}",
        )
        return None
    try:
        lengths = [as_count(a) for a in acc]
    except (TypeError, ValueError, OverflowError):
        report("bad_acceptance", f"accepted lengths must be integers >= 0 (not bools), got "
               f"{short_repr(acc)}")
        return None
    lo = min(lengths, default=0)
    hi = max(lengths, default=0)
    dl = c.draft_length
    if dl is None:
        dl = k_max
    per_seq_k: list[int] | None = None
    if type(dl) is int:
        k = dl
        drafted = dl * len(lengths)
        ok = 0 <= dl <= k_max
    else:
        try:
            per_seq_k = [as_count(x) for x in dl] if _is_sequence(dl) else []
        except (TypeError, ValueError, OverflowError):
            per_seq_k = []
        k = max(per_seq_k, default=0)
        drafted = sum(per_seq_k)
        ok = len(per_seq_k) == len(lengths) and min(per_seq_k, default=0) >= 0 and k <= k_max
    if not ok:
        report(
            "bad_acceptance",
            f"draft_length must be an int (or one per sequence) between 0 and "
            f"max_draft_length={k_max}, got {short_repr(dl)} for {len(lengths)} sequences",
        )
        return None
    if lo < 0 or hi > k:
        report(
            "bad_acceptance",
            f"accepted lengths must be between 0 and the draft length {k}, got min={lo} max={hi}",
        )
        return None
    if per_seq_k is not None and any(a > b for a, b in zip(lengths, per_seq_k, strict=False)):
        report("bad_acceptance", "an accepted length exceeds its draft length")
        return None
    accepted = sum(lengths)
    em = c.emitted
    emitted = accepted + len(lengths)
    if em is not None:
        got = _emitted(em, len(lengths))
        if got is None:
            report("bad_acceptance", f"emitted must be a count between 0 and {MAX_TOKENS}, or "
                   f"one per sequence ({len(lengths)} here) summing to at most that, got "
                   f"{short_repr(em)}; the default (accepted + 1 per sequence) is used")
        else:
            emitted = got
    shape: list[int] | tuple[int, int] = per_seq_k if per_seq_k is not None else (k, len(lengths))
    return Acceptance(lengths, accepted, drafted, emitted, shape)


def _emitted(em: Any, sequences: int) -> int | None:
    """``emitted`` as the tokens one cycle gave its requests: a count, or one per sequence (as
    many as there are sequences), within :data:`MAX_TOKENS` in all; ``None`` for anything else."""
    if not _is_sequence(em):
        return bounded_count(em, MAX_TOKENS)
    if len(em) != sequences:
        return None
    total = 0
    for x in em:
        v = bounded_count(x, MAX_TOKENS)
        if v is None:
            return None
        total += v
    return total if total <= MAX_TOKENS else None


def _is_sequence(x: Any) -> bool:
    """A finite, ordered collection of per-sequence values: list, tuple, range, array, tensor.

    Not a string, a mapping (``{1: 2}`` would count its keys), a set (unordered, deduplicated)
    or an iterator (it could be endless, and the resolver must finish its chunk).
    """
    if isinstance(x, (str, bytes, bytearray, Mapping, Set)):
        return False
    try:
        n = len(x)
    except Exception:
        return False
    return isinstance(n, int) and n <= MAX_SEQUENCES and hasattr(x, "__getitem__")


def as_count(a: Any) -> int:
    """An integer count from an int, an integral float, or a numpy/torch integer scalar.

    Raises ValueError for bools, NaN, infinities, fractions and anything else.
    """
    if type(a) is int:
        return a
    if isinstance(a, bool):
        raise ValueError(f"not an integer count: {a!r}")
    try:
        return operator.index(a)  # numpy integers, 0-d integer tensors
    except TypeError:
        pass
    if isinstance(a, float) and a.is_integer():  # also rejects NaN and infinities
        return int(a)
    raise ValueError(f"not an integer count: {a!r}")


def bounded_count(value: Any, limit: int) -> int | None:
    """``value`` as a count in ``0..limit`` (:func:`as_count`: ints, integral floats, numpy /
    torch integer scalars; no bools), else ``None``. Every count a caller hands specobs that
    reaches an exporter's totals goes through this with its bound, so none can overflow what
    an exporter encodes (a 64-bit integer) or count backwards."""
    try:
        v = as_count(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 <= v <= limit else None


def _batches_ok(batches: list[Any]) -> bool:
    """Whether every batch size is an int in 0..MAX_BATCH, with C-level builtins only (a bool,
    a numpy integer or a float anywhere sends the chunk to the per-cycle check)."""
    if not set(map(type, batches)) <= _INT_ONLY:
        return False
    return not batches or (min(batches) >= 0 and max(batches) <= MAX_BATCH)


def _as_scalar_count(dl: Any) -> Any:
    """A numpy or torch integer scalar ``draft_length`` as an int; anything else unchanged
    (a per-sequence sequence, or a bad value that per-cycle validation reports)."""
    if isinstance(dl, bool) or _is_sequence(dl):
        return dl
    try:
        return as_count(dl)
    except Exception:
        return dl


def integer_or_none(value: Any) -> int | None:
    """``value`` as an int when it is an integer (numpy / torch integer scalars too) and not a
    bool, else ``None``: no float, however integral, and no text."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except Exception:
        return None


def draft_length_of(value: Any, max_draft_length: int) -> int | None:
    """``begin(draft_length=)`` as an int in 0..max_draft_length (numpy / torch integer scalars
    made ints), or ``None`` for anything else: bools, floats, negatives, values above the
    maximum (the resolver counts those as ``bad_draft_length``)."""
    v = integer_or_none(value)
    return v if v is not None and 0 <= v <= max_draft_length else None


def cycle_draft_length(draft_length: Any, acceptance: Acceptance | None) -> int | None:
    """A cycle's draft length from its validated acceptance, where ``begin`` named none:
    ``draft_length`` as ``accept`` was given it -- an int: that; one per sequence: their
    largest -- or ``None`` (``accept`` named none, the acceptance was bad or not given, or
    there was no sequence to take a largest of)."""
    if draft_length is None or acceptance is None:
        return None
    shape = acceptance.shape
    if isinstance(shape, tuple):
        return shape[0]
    return max(shape, default=None)


def batch_size_of(b: Any) -> int | None:
    """A given ``batch_size`` as an int in 0..MAX_BATCH (numpy / torch integer scalars and
    integral floats made ints), or ``None`` for anything else."""
    return bounded_count(b, MAX_BATCH)
