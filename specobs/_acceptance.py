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

Records are :class:`Record` objects: what the hot path's ring kept as objects for one cycle
(specobs/_ring.py: anything it did not count itself). These functions read their fields:
``_acc`` (the accepted lengths as given, or the record's own reused list they were copied
into), ``_acc_copy`` (a CUDA copy; the resolver normally reads it into ``_acc`` before calling
these, so copies take the column path too), ``_draft_len``, ``_emitted``, ``_batch``; and they
write ``_resolved_acc`` (the validated acceptance of a cycle that took the per-cycle path) and
normalise ``_draft_len`` / ``_batch``. Records are pooled: a list read from a record may be
refilled by a later cycle once the record is recycled, so whoever keeps one copies it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Set
from operator import attrgetter
from typing import Any

from specobs import _bucketing
from specobs._config import MAX_DRAFT_LENGTH
from specobs._model import Acceptance, BatchAcceptance
from specobs._recorder import short_repr

__all__ = [
    "MAX_BATCH",
    "MAX_DRAFT_LENGTH",
    "Record",
    "Report",
    "as_count",
    "batch_acceptance",
    "batch_sizes",
    "cycle_acceptance",
    "resolved_acceptance",
]

class Record:
    """One cycle's values as the ring kept them, shaped as the functions below read one:
    ``_acc`` (as given, or read from ``_acc_copy``, a CUDA copy), ``_draft_len``, ``_emitted``,
    ``_batch``; the per-cycle validation writes ``_resolved_acc``."""

    __slots__ = ("_acc", "_acc_copy", "_batch", "_draft_len", "_emitted", "_resolved_acc")

    def __init__(self, acc: Any, copy: Any, draft: Any, emitted: Any, batch: Any) -> None:
        self._acc = acc
        self._acc_copy = copy
        self._draft_len = draft
        self._emitted = emitted
        self._batch = batch
        self._resolved_acc: Acceptance | None = None


#: ``report(kind, message)``: count one bad value of ``kind`` (an ``errors{kind}`` label value).
#: A caller's value appears in ``message`` only through ``short_repr`` (bounded text and work).
Report = Callable[[str, str], None]

#: Largest batch size counted; anything above is a caller's bug, not a batch.
MAX_BATCH = 1 << 31
#: Most sequences one cycle's acceptance may hold (bounds the resolver's work per cycle).
MAX_SEQUENCES = 1 << 20

_GET_ACC = attrgetter("_acc")
_GET_EMITTED = attrgetter("_emitted")
_GET_DRAFT_LEN = attrgetter("_draft_len")
_GET_BATCH = attrgetter("_batch")
_LIST_ONLY = {list}
_NONE_ONLY = {None}


def batch_acceptance(
    cycles: list[Record], max_draft_length: int, report: Report
) -> tuple[BatchAcceptance | None, list[int]]:
    """The acceptance of a chunk (``None`` when no cycle gave any) and its batch sizes.

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


def _columns(
    cycles: list[Record], k_max: int
) -> tuple[BatchAcceptance, list[int]] | None:
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
    return BatchAcceptance(counts, accepted, k * sequences, accepted + sequences,
                           {k: sequences}), batches


def _each(
    cycles: list[Record], k_max: int, report: Report
) -> tuple[BatchAcceptance | None, list[int]]:
    """The chunk in two groups: cycles that gave a list with an int draft length and the default
    emitted count (validated together over their concatenation), and the rest, validated one by
    one (as is the first group when its joint check fails). Batch sizes likewise: a column check,
    then per cycle."""
    fast_lengths: list[int] = []
    fast: list[Record] = []
    k_counts: dict[int, int] = {}
    k_min = k_max
    slow: list[Record] = []
    batches: list[int] = []
    for c in cycles:
        acc = c._acc
        c._resolved_acc = None
        if acc is None and c._acc_copy is None:
            if c._batch is not None:
                batches.append(c._batch)
            continue
        dl = c._draft_len  # set by accept(), with _acc / _acc_copy
        if dl is not None and type(dl) is not int:
            dl = c._draft_len = _as_scalar_count(dl)  # numpy / torch scalars; else as was
        if type(acc) is list and (dl is None or type(dl) is int) and c._emitted is None:
            k = k_max if dl is None else dl
            n = len(acc)
            fast_lengths += acc
            fast.append(c)
            k_counts[k] = k_counts.get(k, 0) + n
            if k < k_min:
                k_min = k
            batches.append(n if c._batch is None else c._batch)
        else:
            slow.append(c)
    width = k_max + 1
    counts = [0] * width  # sequences per accepted length
    accepted = drafted = emitted = 0
    if fast:
        ok = k_min >= 0 and max(k_counts) <= k_max
        if ok and fast_lengths:
            try:  # raises on any element that is not an int in 0..k_min
                counts = _bucketing.count_lengths([fast_lengths], k_min, width)
            except (TypeError, ValueError, OverflowError):
                ok = False
        if ok:
            # Sequences of cycles that drafted nothing (k = 0, so every value was 0) are no
            # drafts: they emit a token each but have no accept length.
            counts[0] -= k_counts.get(0, 0)
            accepted = sum(v * n for v, n in enumerate(counts))
            drafted = sum(k * n for k, n in k_counts.items())
            emitted = accepted + len(fast_lengths)
        else:  # someone sent bad values: find and count them one by one
            k_counts = {}
            slow = fast + slow
    if slow:
        valid: list[list[int]] = []
        for c in slow:
            a = cycle_acceptance(c, k_max, report)
            c._resolved_acc = a
            if a is None:
                c._acc = None  # invalid and counted: not shown on the resolved cycle either
                continue
            shape = a.shape
            if isinstance(shape, tuple):
                if shape[0] > 0:
                    valid.append(a.lengths)
            else:  # only the sequences that drafted something have an accept length
                valid.append([v for v, kk in zip(a.lengths, shape, strict=True) if kk > 0])
            accepted += a.accepted
            drafted += a.drafted
            emitted += a.emitted
            if isinstance(shape, tuple):
                k_counts[shape[0]] = k_counts.get(shape[0], 0) + shape[1]
            else:
                for kk in shape:
                    k_counts[kk] = k_counts.get(kk, 0) + 1
        if valid:  # validated per cycle: ints in 0..max_draft_length
            counts = list(map(operator.add, counts, _bucketing.count_lengths(valid, k_max, width)))
    if slow or not _batches_ok(batches):
        batches = batch_sizes(cycles, report)
    if not any(counts) and not k_counts:
        return None, batches
    return BatchAcceptance(counts, accepted, drafted, emitted, k_counts), batches


def batch_sizes(cycles: Iterable[Record], report: Report) -> list[int]:
    """Batch size of each cycle that has one (given, or the number of sequences whose acceptance
    is valid), validated one by one; a bad given size is reported and dropped (the cycle stays).
    Used only when the column check failed."""
    batches: list[int] = []
    for c in cycles:
        b = c._batch
        if b is not None:
            v = _as_batch(b)
            if v is None:
                report(
                    "bad_batch_size",
                    f"batch_size must be an integer between 0 and {MAX_BATCH}, got "
                    f"{short_repr(b)}; the cycle is kept without a batch size",
                )
            c._batch = v
            if v is not None:
                batches.append(v)
            continue
        a: Acceptance | None = getattr(c, "_resolved_acc", None)  # the per-cycle path's
        if a is not None:
            batches.append(len(a.lengths))
        elif type(c._acc) is list:
            batches.append(len(c._acc))
    return batches


def resolved_acceptance(c: Record, max_draft_length: int) -> Acceptance | None:
    """One cycle's acceptance for its :class:`ResolvedCycle`, after :func:`batch_acceptance`
    validated the chunk it belongs to. ``lengths`` may be the record's own reused list: copy it
    to keep it."""
    a: Acceptance | None = getattr(c, "_resolved_acc", None)  # set by the per-cycle path
    if a is not None:
        return a
    acc = c._acc
    if type(acc) is list:
        dl = c._draft_len
        k = max_draft_length if dl is None else dl
        n = sum(acc)
        return Acceptance(acc, n, k * len(acc), n + len(acc), (k, len(acc)))
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
    acc = c._acc
    copy = c._acc_copy
    if copy is not None:
        c._acc_copy = None
        try:
            acc = copy.read()
        except Exception as exc:
            report("bad_acceptance",
                   f"could not read the copied acceptance: {short_repr(exc, 200)}")
            return None
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
    dl = c._draft_len
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
    em = c._emitted
    emitted = accepted + len(lengths)
    if em is not None:
        try:
            got = sum(as_count(x) for x in em) if _is_sequence(em) else as_count(em)
        except (TypeError, ValueError, OverflowError):
            got = -1
        if got < 0:
            report("bad_acceptance", f"emitted must be a count >= 0, got {short_repr(em)}; the "
                   f"default (accepted + 1 per sequence) is used")
        else:
            emitted = got
    shape: list[int] | tuple[int, int] = per_seq_k if per_seq_k is not None else (k, len(lengths))
    return Acceptance(lengths, accepted, drafted, emitted, shape)


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


def _batches_ok(batches: list[Any]) -> bool:
    """Whether every batch size is an int in 0..MAX_BATCH, with C-level builtins only: a float
    anywhere makes the sum a float, a string or None makes it raise."""
    try:
        return type(sum(batches)) is int and (
            not batches or (min(batches) >= 0 and max(batches) <= MAX_BATCH)
        )
    except (TypeError, ValueError):
        return False


def _as_scalar_count(dl: Any) -> Any:
    """A numpy or torch integer scalar ``draft_length`` as an int; anything else unchanged
    (a per-sequence sequence, or a bad value that per-cycle validation reports)."""
    if isinstance(dl, bool) or _is_sequence(dl):
        return dl
    try:
        return as_count(dl)
    except Exception:
        return dl


def _as_batch(b: Any) -> int | None:
    try:
        v = as_count(b)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 <= v <= MAX_BATCH else None
