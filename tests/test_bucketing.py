"""The resolver's bucketing: the compiled version returns exactly what the reference does."""

from __future__ import annotations

import random
import shutil
from bisect import bisect_left

import pytest

import specobs
from specobs import _bucketing, catalog
from specobs._bucketing import bucket_py, host_chunk_py

BOUNDS = catalog.DURATION_BUCKETS_SECONDS
compiled = pytest.mark.skipif(not _bucketing.COMPILED, reason="specobs._speedups not built")


def naive(values, bounds, scale):
    """One bisect per value: the "le" rule stated as plainly as it can be."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect_left(bounds, v * scale)] += 1
    return counts, sum(values)


def random_values(rng, n):
    pick = rng.random()
    if pick < 0.3:  # right on the bounds, and one nanosecond either side
        base = [round(b * 1e9) for b in BOUNDS]
        return [rng.choice(base) + rng.choice((-1, 0, 1)) for _ in range(n)]
    if pick < 0.6:
        return [rng.randrange(0, 20_000_000_000) for _ in range(n)]
    return [int(10 ** rng.uniform(0, 10.5)) for _ in range(n)]


def test_the_reference_follows_the_le_rule_on_and_around_every_bound():
    rng = random.Random(1)
    for n in (0, 1, 2, 7, 300):
        values = random_values(rng, n)
        assert bucket_py(values, BOUNDS, 1e-9) == naive(values, BOUNDS, 1e-9)
    sizes = [1, 2, 3, 64, 65, 1024, 5000]
    assert bucket_py(sizes, catalog.BATCH_SIZE_BUCKETS, 1.0) == naive(
        sizes, catalog.BATCH_SIZE_BUCKETS, 1.0
    )


@compiled
def test_bucket_compiled_equals_the_reference():
    rng = random.Random(2)
    for _ in range(300):
        values = random_values(rng, rng.randrange(0, 400))
        assert _bucketing.bucket(values, BOUNDS, 1e-9) == bucket_py(values, BOUNDS, 1e-9)
    sizes = [rng.randrange(1, 3000) for _ in range(500)]
    got = _bucketing.bucket(sizes, catalog.BATCH_SIZE_BUCKETS, 1.0)
    assert got == bucket_py(sizes, catalog.BATCH_SIZE_BUCKETS, 1.0)


@compiled
@pytest.mark.parametrize("nphases", [1, 3, 4])
def test_host_chunk_compiled_equals_the_reference(nphases):
    rng = random.Random(nphases)
    for _ in range(200):
        stamps = []
        for _ in range(rng.randrange(0, 300)):
            t = rng.randrange(0, 10**15)
            ts = [t]
            for d in random_values(rng, nphases):
                t += d
                ts.append(t)
            stamps.append(ts)
        got = _bucketing.host_chunk(stamps, nphases, BOUNDS)
        want = host_chunk_py(stamps, nphases, BOUNDS)
        assert got == want
        assert len(got[0]) == nphases + 1


@compiled
@pytest.mark.parametrize(
    "args",
    [
        ([[0, 1, 2]], 3),  # a cycle with too few timestamps
        ([[0, 1.5, 2, 3]], 3),  # not an int
        ([(0, 1, 2, 3)], 3),  # not a list
        ([[0, 1, 2, 2**63]], 3),  # a difference beyond 64 bits
        ([[0, 1, 2, 3]], 0),
    ],
)
def test_host_chunk_compiled_refuses_what_it_cannot_read(args):
    stamps, nphases = args
    with pytest.raises((TypeError, ValueError, OverflowError)):
        _bucketing.host_chunk(stamps, nphases, BOUNDS)


@compiled
def test_bucket_compiled_refuses_bad_values_and_bounds():
    with pytest.raises(TypeError):
        _bucketing.bucket([1, "2"], BOUNDS, 1e-9)
    with pytest.raises(OverflowError):
        _bucketing.bucket([2**62, 2**62], BOUNDS, 1e-9)
    with pytest.raises(ValueError):
        _bucketing.bucket([1], (1.0, 0.5), 1.0)


def test_the_speedups_are_built_where_a_compiler_is_installed():
    """An install on a machine with a C compiler must not silently run the slow path."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert _bucketing.COMPILED


def _run(monkeypatch, reference: bool):
    if reference:
        monkeypatch.setattr(_bucketing, "bucket", bucket_py)
        monkeypatch.setattr(_bucketing, "host_chunk", host_chunk_py)
    from specobs.timing.fake import FakeEventClock, FakeGpu

    gpu = FakeGpu()
    obs = specobs.configure(
        sinks=[], clock=FakeEventClock(gpu, pool_size=4096), sample_every=3,
        poll_interval_seconds=3600,
    )
    rng = random.Random(7)
    for i in range(600):
        c = obs.begin(1 + i % 70)
        gpu.run(rng.randrange(1, 3_000_000))
        c.mark("verify")
        gpu.run(rng.randrange(1, 9_000_000))
        c.mark("bookkeeping")
        gpu.run(rng.randrange(1, 500_000))
        c.accept([rng.randrange(0, 5) for _ in range(1 + i % 70)], draft_length=4)
        c.end()
        if i % 50 == 0:
            gpu.complete()
            obs.force_flush()
    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    obs.shutdown()
    return s


def test_the_resolver_aggregates_the_same_through_either_path(monkeypatch):
    fast = _run(monkeypatch, reference=False)
    with monkeypatch.context() as m:
        ref = _run(m, reference=True)
    assert fast.cycles_total == ref.cycles_total == 600
    for key, h in ref.phase_histograms.items():
        if key[1] == "gpu":  # identical GPU intervals from the fake clock
            assert fast.phase_histograms[key].counts == h.counts
            assert fast.phase_histograms[key].sum == pytest.approx(h.sum)
        assert fast.phase_histograms[key].count == h.count
    assert fast.cycle_histograms["gpu"].counts == ref.cycle_histograms["gpu"].counts
    assert fast.batch_size.counts == ref.batch_size.counts
    assert fast.sampled_cycles_total == ref.sampled_cycles_total == 200


class Index:
    """Not an int, but an index (as numpy's integers are)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def _outcome(f, *args):
    try:
        return f(*args)
    except (TypeError, ValueError, OverflowError):  # the callers catch all three alike
        return "refused"


@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_count_lengths_counts_exactly_and_refuses_what_the_reference_refuses(k):
    rng = random.Random(k)
    odd = [k + 1, -1, 1.0, "1", None, True, Index(min(k, 1)), 2**70, 300]
    for trial in range(400):
        lists = [[rng.randrange(0, k + 1) for _ in range(rng.randrange(0, 70))]
                 for _ in range(rng.randrange(0, 40))]
        if trial % 2 and lists and lists[-1]:
            lists[rng.randrange(len(lists))].append(rng.choice(odd))
        want = _outcome(_bucketing.count_lengths_py, lists, k, 9)
        if isinstance(want, list):  # the plain count, stated plainly
            flat = [int(v) if not isinstance(v, Index) else v.v for lst in lists for v in lst]
            assert want == [flat.count(v) for v in range(9)]
        assert _outcome(_bucketing.count_lengths, lists, k, 9) == want
