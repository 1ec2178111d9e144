"""Bucketing a resolved chunk: what the resolver does for every cycle, in one place.

Three functions, each with a pure-Python reference here and a compiled version in
``specobs/_speedups.c`` used when it was built (``COMPILED``); both return exactly the same
thing for the same input (tests/test_bucketing.py), and the resolver falls back to the
reference if the compiled one raises. Values are integers (nanoseconds, batch sizes); each is
compared with the bucket bounds as ``value * scale`` under the Prometheus "le" rule (the first
bucket whose bound is >= the value; the last bucket is +Inf), and sums are exact integer sums,
scaled once by the aggregation.

Why compiled: the resolver shares the GIL with the inference worker, and inside a GPU loop a
worker waiting for the GIL leaves the GPU idle, so every microsecond the resolver spends per
cycle comes off throughput (benchmarks/RESULTS.md has the figures).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import chain

__all__ = [
    "COMPILED", "Bucketed", "bucket", "bucket_py", "count_lengths", "count_lengths_py",
    "host_chunk", "host_chunk_py",
]

#: Counts per bucket (the last one +Inf) and the exact sum of the raw values.
Bucketed = tuple[list[int], int]


def bucket_py(values: list[int], bounds: Sequence[float], scale: float) -> Bucketed:
    """Counts of ``values`` per bucket (``value * scale`` against ``bounds``) and their sum."""
    counts = [0] * (len(bounds) + 1)
    if not values:
        return counts, 0
    vs = sorted([v * scale for v in values]) if scale != 1.0 else sorted(values)
    prev = 0
    n = len(vs)
    for i, bound in enumerate(bounds):
        k = bisect_right(vs, bound, prev)  # values <= bound
        counts[i] = k - prev
        prev = k
        if prev == n:
            break
    counts[-1] = n - prev
    return counts, sum(values)


def host_chunk_py(
    stamps: list[list[int]], nphases: int, bounds: Sequence[float]
) -> tuple[list[Bucketed], int]:
    """Host-clock histograms of a chunk: (counts, sum ns) per phase and then for the whole
    cycle, from each cycle's ``nphases + 1`` timestamps; and the sum of the cycle times."""
    cols = [[t[i + 1] - t[i] for t in stamps] for i in range(nphases)]
    totals = [t[nphases] - t[0] for t in stamps]
    out = [bucket_py(c, bounds, 1e-9) for c in cols]
    out.append(bucket_py(totals, bounds, 1e-9))
    return out, sum(totals)


#: ``_UPTO[k]``: the bytes 0..k, which ``bytes.translate`` deletes to leave the values above k.
_UPTO = [bytes(range(k + 1)) for k in range(256)]


def count_lengths_py(lists: list[list[int]], k: int, width: int) -> list[int]:
    """How many of the ints in ``lists`` equal each of 0..width-1 (accepted lengths, say).

    Raises ``TypeError`` / ``ValueError`` unless every value is an int in 0..k. A bool is not
    an int here: ``[True, False]`` is a mask, not two accepted lengths."""
    if not 0 <= k < width <= 4096:
        raise ValueError(f"need 0 <= k < width <= 4096, got k={k}, width={width}")
    # One bytes() per list, joined (bytes() rejects a non-int or a value outside 0..255);
    # deleting the bytes 0..k leaves exactly the values above k.
    column = b"".join(map(bytes, lists))
    if column.translate(None, _UPTO[k]):
        raise ValueError(f"a value is outside 0..{k}")
    if bool in set(map(type, chain.from_iterable(lists))):  # bytes() took them as 0 / 1
        raise TypeError("a bool is not a count")
    return [column.count(v) for v in range(width)]


try:
    from specobs._speedups import bucket, count_lengths, host_chunk

    COMPILED = True
except ImportError:  # not built (no compiler at install time, or another interpreter)
    bucket = bucket_py
    count_lengths = count_lengths_py
    host_chunk = host_chunk_py
    COMPILED = False
