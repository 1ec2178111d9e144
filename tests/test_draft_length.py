"""The draft length in effect per cycle: ``begin(draft_length=k)`` (engines change k at run time:
vLLM's per-batch-size bands with k = 0, SGLang's adaptive tiers, TRT-LLM's schedules), else the
draft length ``accept`` names, and the series by k -- ``specobs_draft_length``, cycles, phase
time and emitted tokens by the cycle's k, accepted / drafted tokens by each sequence's own k --
on both rings (the native core and its specification), through every path (native acceptance,
acceptance the resolver validates, deferred cycles), and exported by both sinks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import specobs
from specobs import _ring, catalog
from specobs.sinks.otlp import OtlpSink
from tests._cores import CORES, PHASES, K
from tests._otlp_receiver import OtlpReceiver, attributes_to_dict
from tests.test_ring import K_MAX, acceptance_input, make, make_random, normalise

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test extra
    torch = None



def run(obs: specobs.Observer, accepted: Any = None, /, *, begin: Any = None,
        **accept_kw: Any) -> Any:
    """One cycle with its three phases; ``begin`` is begin's draft length (None: not given)."""
    c = obs.begin(draft_length=begin) if begin is not None else obs.begin()
    c.mark("verify")
    c.mark("bookkeeping")
    if accepted is not None:
        c.accept(accepted, **accept_kw)
    c.end()
    return c


def snap(obs: specobs.Observer) -> specobs.Snapshot:
    assert obs.force_flush(5.0)
    return obs.snapshot()


# -- the catalog -------------------------------------------------------------------------------


def test_the_catalog_names_translate_to_the_documented_prometheus_names() -> None:
    assert {m.name: m.labels for m in (
        catalog.DRAFT_LENGTH, catalog.CYCLES_BY_DRAFT_LENGTH, catalog.PHASE_TIME_BY_DRAFT_LENGTH,
        catalog.EMITTED_BY_DRAFT_LENGTH, catalog.ACCEPTED_BY_DRAFT_LENGTH,
        catalog.DRAFTED_BY_DRAFT_LENGTH)} == {
        "specobs_draft_length": (),
        "specobs_cycles_by_draft_length_total": ("draft_length",),
        "specobs_phase_time_by_draft_length_seconds_total": ("phase", "draft_length"),
        "specobs_emitted_tokens_by_draft_length_total": ("draft_length",),
        "specobs_accepted_tokens_by_draft_length_total": ("draft_length",),
        "specobs_draft_tokens_by_draft_length_total": ("draft_length",),
    }
    assert catalog.DRAFT_LENGTH.kind == "histogram" and catalog.DRAFT_LENGTH.buckets is None
    assert catalog.draft_length_buckets(3) == (0.0, 1.0, 2.0, 3.0)
    assert "bad_draft_length" in catalog.ERROR_KINDS
    assert catalog.BASELINE_SOURCE_PLAIN_STEPS == "plain_steps"


# -- counting, on both rings -------------------------------------------------------------------


def test_cycles_that_draft_nothing_are_cycles_of_k0_with_their_phases_timed(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers()
    for _ in range(5):
        run(obs, [0, 0, 0], begin=0, draft_length=0)
    run(obs, [2, 1, 4], begin=4, draft_length=4)
    s = snap(obs)
    assert s.cycles_total == 6
    assert s.cycles_by_draft_length == {0: 5, 4: 1}
    # Every phase of the k = 0 cycles timed, and the per-k seconds add up to the host histograms.
    assert all(x > 0 for x in s.phase_seconds_by_draft_length[0])
    for i, p in enumerate(PHASES):
        total = sum(v[i] for v in s.phase_seconds_by_draft_length.values())
        assert total == pytest.approx(s.phase_seconds_sum(p, "host"), rel=1e-9)
    assert s.emitted_by_draft_length == {0: 15, 4: 10}
    h = s.draft_length
    assert h.bounds == (0.0, 1.0, 2.0, 3.0, 4.0)
    assert h.counts == (5, 0, 0, 0, 1, 0) and h.count == 6 and h.sum == 4.0
    # Sequences that drafted nothing verified no drafts: labelled, with nothing accepted.
    assert s.accepted_by_draft_length == {0: 0, 4: 7}
    assert s.drafted_by_draft_length == {0: 0, 4: 12}


def test_the_histogram_holds_every_k_used_and_only_cycles_with_one(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers()
    used = [0, 1, 2, 3, 4, 2, 2, 0]
    for k in used:
        run(obs, [0] * 2, begin=k, draft_length=k)
    run(obs, [1, 1])  # neither begin nor accept names a k: left out of every per-k series
    run(obs)  # no acceptance at all
    s = snap(obs)
    assert s.cycles_total == len(used) + 2
    assert s.draft_length.counts[:5] == (2, 1, 3, 1, 1)
    assert s.draft_length.count == len(used) and s.draft_length.sum == sum(used)
    assert s.cycles_by_draft_length == {0: 2, 1: 1, 2: 3, 3: 1, 4: 1}


@pytest.mark.parametrize("verified", ["int", "per_row"])
def test_vllm_v2_cycle_counts_under_the_k_drafted_and_acceptance_under_the_k_verified(
    core: str, observers: Callable[..., specobs.Observer], verified: str
) -> None:
    """A V2 step verifies the previous step's drafts (k = 3 each) while drafting k' = 2."""
    obs = observers()
    dl: Any = 3 if verified == "int" else [3, 3]  # int: stored natively; per row: validated
    run(obs, [1, 3], begin=2, draft_length=dl)
    s = snap(obs)
    assert s.cycles_by_draft_length == {2: 1}
    assert s.draft_length.counts[2] == 1 and s.draft_length.count == 1
    assert s.emitted_by_draft_length == {2: 6}
    assert s.accepted_by_draft_length == {3: 4}
    assert s.drafted_by_draft_length == {3: 6}
    assert s.draft_tokens_total == 6 and s.accepted_tokens_total == 4


def test_without_begin_the_k_comes_from_what_accept_names(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers()
    run(obs, [1, 2], draft_length=3)  # an int: native acceptance
    run(obs, [1, 0, 2], draft_length=[2, 1, 2])  # one per sequence: their largest
    run(obs, np.array([1, 1]), draft_length=np.int64(1))  # a numpy scalar k: validated
    run(obs, [1, 2])  # accept named none: no k
    run(obs, [5, 5], draft_length=3)  # bad acceptance: no acceptance, no k
    s = snap(obs)
    assert s.cycles_by_draft_length == {1: 1, 2: 1, 3: 1}
    assert s.emitted_by_draft_length == {1: 4, 2: 6, 3: 5}
    assert s.accepted_by_draft_length == {1: 0 + 2, 2: 1 + 2, 3: 3, K: 3}
    assert s.errors["bad_acceptance"] == 1 and s.errors["bad_draft_length"] == 0


@pytest.mark.parametrize("bad", [True, False, -1, K + 1, 2.0, "2", [2], object()])
def test_a_bad_draft_length_is_counted_and_the_cycle_kept_without_a_k(
    core: str, observers: Callable[..., specobs.Observer], bad: Any
) -> None:
    obs = observers()
    run(obs, [1, 1], begin=bad, draft_length=2)  # begin's k is bad: accept's is not used
    run(obs, [1, 1], begin=2, draft_length=2)
    s = snap(obs)
    assert s.errors["bad_draft_length"] == 1
    assert s.cycles_total == 2 and s.emitted_tokens_total == 8 and s.accepted_tokens_total == 4
    assert s.cycles_by_draft_length == {2: 1}
    assert s.phase_count("draft", "host") == 2


def test_integer_scalars_are_draft_lengths(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers()
    run(obs, [1, 1], begin=np.int64(3), draft_length=3)
    if torch is not None:
        run(obs, [0, 1], begin=torch.tensor(3), draft_length=3)
    run(obs, begin=np.int32(0))
    s = snap(obs)
    assert s.errors["bad_draft_length"] == 0
    assert s.cycles_by_draft_length == {0: 1, 3: 2 if torch is not None else 1}
    assert s.emitted_by_draft_length[3] == (7 if torch is not None else 4)


def test_deferred_cycles_land_by_k_once_settled_and_by_begins_k_when_unsettled(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers(settle_timeout_seconds=0.05)
    c = obs.begin(draft_length=3)
    c.mark("verify")
    c.mark("bookkeeping")
    settled = c.defer()
    d = obs.begin()  # no begin k: its k comes from what settle names
    d.mark("verify")
    d.mark("bookkeeping")
    named = d.defer()
    e = obs.begin(draft_length=1)  # never settled: its times under k = 1, no tokens
    e.mark("verify")
    e.mark("bookkeeping")
    e.defer()
    f = obs.begin()  # settled with nothing, no begin k: no k at all
    f.mark("verify")
    f.mark("bookkeeping")
    nothing = f.defer()
    run(obs, [2], begin=2, draft_length=2)  # a later cycle waits behind the deferred ones
    settled.settle([3, 0], draft_length=3)
    named.settle([1, 1], draft_length=[2, 1])
    nothing.settle(None)
    s = snap(obs)
    assert s.dropped["unsettled"] == 1
    assert s.cycles_total == 5
    assert s.cycles_by_draft_length == {1: 1, 2: 2, 3: 1}
    assert s.emitted_by_draft_length == {1: 0, 2: 3 + 4, 3: 5}
    assert all(x > 0 for x in s.phase_seconds_by_draft_length[1])
    assert s.accepted_by_draft_length == {1: 1, 2: 3, 3: 3}


def test_acceptance_the_resolver_validates_is_placed_like_native_acceptance(
    observers: Callable[..., specobs.Observer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same cycles with acceptance the ring stores (lists) and acceptance it keeps for the
    resolver (an ``emitted`` given keeps it as an object) give the same series by k."""
    def series(form: str) -> tuple[Any, ...]:
        obs = observers()
        rng = random.Random(7)
        for _ in range(60):
            k = rng.choice([None, 0, 2, 4])
            n = rng.randint(0, 4)
            kv = rng.choice([2, 3, 4])
            acc = [rng.randint(0, kv) for _ in range(n)]
            extra = {"emitted": sum(acc) + n} if form == "python" else {}
            run(obs, acc, begin=k, draft_length=kv, **extra)
        s = snap(obs)
        return (s.cycles_by_draft_length, s.emitted_by_draft_length,
                s.accepted_by_draft_length, s.sequences_by_draft_length, s.draft_length.counts)

    for core in CORES:
        monkeypatch.setattr(_ring, "NATIVE", core == "native")
        assert series("native") == series("python")


# -- the ring against its specification -------------------------------------------------------


def draft_length_input(rng: random.Random) -> Any:
    return rng.choice([None, None, 0, 0, 1, 3, K_MAX, K_MAX + 1, -1, True, 2.5, np.int64(2),
                       "3"])


def run_stream(kind: str, seed: int) -> list[Any]:
    """Random cycles with begin's draft length, every accept form, defer / settle / expire and
    drains at random points, straight on a ring."""
    rng = random.Random(seed)
    ring, slow = make_random(kind, seed, rng, [8, 64], sampled=0.3, intervals=[1, 3])
    log: list[Any] = []
    deferred: list[Any] = []
    for step in range(300):
        u = rng.random()
        k = draft_length_input(rng)
        c = ring.begin(rng.choice([None, 4]), k) if k is not None else ring.begin()
        c.mark("verify")
        c.mark("bookkeeping")
        if u < 0.75:
            acc, kw = acceptance_input(rng)
            c.accept(acc, **kw)
        if rng.random() < 0.2:
            c.defer()
            deferred = [*deferred[-4:], c]
        else:
            c.end()
        if deferred and rng.random() < 0.25:
            h = deferred.pop(rng.randrange(len(deferred)))
            if rng.random() < 0.2:
                h.settle(None)
            else:
                acc, kw = acceptance_input(rng)
                h.settle(acc, **kw)
        if rng.random() < 0.05:
            log.append(("expire", ring.expire(rng.choice([0, 997 * 40]))))
        if rng.random() < 0.15:
            held, bound = ring.pending(1 << 20)
            args = (bound, rng.choice([4, 1000]), [], rng.choice([-1, 30 * 997]),
                    rng.random() < 0.2)
            if rng.random() < 0.3:
                log.append(("drain", normalise(_ring.Drained._make(ring.drain(*args)))))
            else:
                log.append(("drain_into", normalise(ring.drain_into(*args))))
                log.append(("totals", normalise(ring.totals())))
        log.append(("counters", step, len(ring), ring.deferred, ring.unsettled))
    log.append(("expire", ring.expire(0)))
    log.append(("final", normalise(ring.drain_into(1 << 60, 1 << 30, [], -1, False))))
    log.append(("totals", normalise(ring.totals())))
    log.append(("calls", slow.calls))
    return log


@pytest.mark.skipif(not _ring.BUILT, reason="the native core is not built here")
@pytest.mark.parametrize("seed", range(30))
def test_native_ring_counts_by_k_as_its_specification_does(seed: int) -> None:
    native = run_stream("native", seed)
    python = run_stream("python", seed)
    assert len(native) == len(python)
    for a, b in zip(native, python, strict=True):
        assert a == b


def test_the_streams_exercise_every_way_to_a_k() -> None:
    totals = []
    cycle_ks: set[int] = set()
    for seed in range(30):
        log = run_stream("python", seed)
        totals.append(_ring.RingTotals(*log[-2][1]))
        for e in log:
            if e[0] in ("drain_into", "final"):
                cycle_ks |= {d[11] for d in e[1][2]}
    merged: dict[int, int] = {}
    for t in totals:
        for k, n in t.cycles_by_draft_length.items():
            merged[k] = merged.get(k, 0) + n
    assert {0, 1, 3, K_MAX} <= set(merged)
    assert -2 in cycle_ks and -1 in cycle_ks and any(k >= 0 for k in cycle_ks)
    assert any(t.emitted_by_draft_length for t in totals)


def test_a_drained_ring_reports_the_k_of_each_cycle_in_its_totals() -> None:
    for kind in ["native", "python"] if _ring.BUILT else ["python"]:
        ring, _ = make(kind, 0, 16)
        for k, acc in [(0, [0, 0]), (2, [1, 2]), (2, [0]), (None, [1, 1])]:
            c = ring.begin(None, k) if k is not None else ring.begin()
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(acc, draft_length=3 if k is None else k)
            c.end()
        ring.drain_into(1 << 60, 100, [], -1, False)
        t = _ring.RingTotals._make(ring.totals())
        assert t.cycles_by_draft_length == {0: 1, 2: 2, 3: 1}, kind
        assert t.emitted_by_draft_length == {0: 2, 2: 5 + 1, 3: 4}, kind
        assert t.accepted_by_draft_length == {0: 0, 2: 3, 3: 2}, kind
        # Each cycle: three phases of 997 ns ticks (one clock read per boundary).
        assert t.host_ns_by_draft_length[2] == [2 * 997] * 3, kind


# -- the measured baseline and the exporters ---------------------------------------------------


def scrape(obs: specobs.Observer, registry: CollectorRegistry) -> dict[str, Any]:
    assert obs.force_flush(5.0)
    text = generate_latest(registry).decode()
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("model",)}
            out[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return out


def test_the_series_by_k_in_a_real_prometheus_parse(observers: Callable[..., Any]) -> None:
    registry = CollectorRegistry()
    obs = observers(sinks=[specobs.PrometheusSink(registry=registry)], labels={"model": "m"})
    for _ in range(3):
        run(obs, [0, 0], begin=0, draft_length=0)
    run(obs, [1, 3], begin=2, draft_length=[3, 3])
    got = scrape(obs, registry)
    s = obs.snapshot()
    assert got[("specobs_draft_length_bucket", (("le", "0.0"),))] == 3
    assert got[("specobs_draft_length_bucket", (("le", "2.0"),))] == 4
    assert got[("specobs_draft_length_bucket", (("le", "4.0"),))] == 4
    assert got[("specobs_draft_length_count", ())] == 4
    assert got[("specobs_draft_length_sum", ())] == 2
    assert got[("specobs_cycles_by_draft_length_total", (("draft_length", "0"),))] == 3
    assert got[("specobs_cycles_by_draft_length_total", (("draft_length", "2"),))] == 1
    assert ("specobs_cycles_by_draft_length_total", (("draft_length", "1"),)) not in got
    for i, p in enumerate(PHASES):
        key = ("specobs_phase_time_by_draft_length_seconds_total",
               (("draft_length", "0"), ("phase", p)))
        assert got[key] == pytest.approx(s.phase_seconds_by_draft_length[0][i])
        assert got[key] > 0
    assert got[("specobs_emitted_tokens_by_draft_length_total", (("draft_length", "0"),))] == 6
    assert got[("specobs_emitted_tokens_by_draft_length_total", (("draft_length", "2"),))] == 6
    assert got[("specobs_accepted_tokens_by_draft_length_total", (("draft_length", "3"),))] == 4
    assert got[("specobs_draft_tokens_by_draft_length_total", (("draft_length", "3"),))] == 6
    assert ("specobs_accepted_tokens_by_draft_length_total", (("draft_length", "2"),)) not in got
    # Fewer than 16 plain steps: no measured baseline yet.
    assert not any(name.startswith("specobs_baseline") for name, _ in got)


def test_the_baseline_is_measured_from_16_plain_steps_unless_one_is_configured(
    core: str, observers: Callable[..., Any]
) -> None:
    registry = CollectorRegistry()
    obs = observers(sinks=[specobs.PrometheusSink(registry=registry)], labels={"model": "m"})
    for _ in range(catalog.PLAIN_STEPS_MIN_CYCLES - 1):
        run(obs, [0, 0], begin=0)
    run(obs, [1, 2], begin=3, draft_length=3)
    assert not any(n.startswith("specobs_baseline") for n, _ in scrape(obs, registry))
    run(obs, [0, 0], begin=0)
    got = scrape(obs, registry)
    s = obs.snapshot()
    key = ("specobs_baseline_sequence_tokens_per_second", (("source", "plain_steps"),))
    k0_seconds = sum(s.phase_seconds_by_draft_length[0])
    assert got[key] == pytest.approx(catalog.PLAIN_STEPS_MIN_CYCLES / k0_seconds, rel=1e-9)
    assert s.baseline_source == "plain_steps"

    registry2 = CollectorRegistry()
    configured = observers(sinks=[specobs.PrometheusSink(registry=registry2)],
                           labels={"model": "m"}, baseline_tokens_per_second=25.0)
    for _ in range(catalog.PLAIN_STEPS_MIN_CYCLES + 4):
        run(configured, [0], begin=0)
    got = scrape(configured, registry2)
    assert got[("specobs_baseline_sequence_tokens_per_second", ())] == 25.0
    assert not any(n == "specobs_baseline_sequence_tokens_per_second" and labels
                   for n, labels in got)


def test_otlp_exports_the_series_by_k(otlp_receiver: OtlpReceiver,
                                      observers: Callable[..., Any]) -> None:
    sink = OtlpSink(endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf",
                    export_interval_seconds=3600.0)
    obs = observers(sinks=[sink])
    for _ in range(catalog.PLAIN_STEPS_MIN_CYCLES):
        run(obs, [0], begin=0, draft_length=0)
    run(obs, [1, 3], begin=2, draft_length=[3, 3])
    assert obs.force_flush(5.0)
    received: dict[str, Any] = {}
    for _, metric in otlp_receiver.metrics():
        received[metric.name] = metric

    def by_attrs(name: str) -> dict[frozenset[tuple[str, Any]], float]:
        m = received[name]
        data = getattr(m, str(m.WhichOneof("data")))
        return {frozenset(attributes_to_dict(p.attributes).items()):
                float(getattr(p, str(p.WhichOneof("value")))) for p in data.data_points}

    assert by_attrs("specobs.cycles_by_draft_length") == {
        frozenset({("draft_length", "0")}): 16.0, frozenset({("draft_length", "2")}): 1.0}
    assert by_attrs("specobs.emitted_tokens_by_draft_length")[
        frozenset({("draft_length", "2")})] == 6.0
    assert by_attrs("specobs.accepted_tokens_by_draft_length") == {
        frozenset({("draft_length", "0")}): 0.0, frozenset({("draft_length", "3")}): 4.0}
    phase = by_attrs("specobs.phase.time_by_draft_length")
    assert {dict(k)["phase"] for k in phase} == set(PHASES) and all(v > 0 for v in phase.values())
    assert received["specobs.phase.time_by_draft_length"].unit == "s"
    hist = received["specobs.draft.length"].histogram.data_points[0]
    assert list(hist.explicit_bounds) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert list(hist.bucket_counts)[:3] == [16, 0, 1] and hist.count == 17
    baseline = by_attrs("specobs.baseline.sequence_tokens")
    assert set(baseline) == {frozenset({("source", "plain_steps")})}


# -- drafts the engine left out of verification ----------------------------------------------------


def test_unverified_drafts_are_counted_apart_and_bad_counts_refused(
    observers: Callable[..., specobs.Observer], caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    obs = observers(sinks=[specobs.PrometheusSink(registry=registry)])
    run(obs, [1, 0], draft_length=[3, 2])
    assert "specobs_draft_tokens_unverified" not in generate_latest(registry).decode()
    obs.drafts_unverified(4)
    obs.drafts_unverified(np.int64(2))
    obs.drafts_unverified(0)  # nothing left out: nothing to add
    for bad in (-1, True, 2.5, "3", 1 << 41):
        obs.drafts_unverified(bad)  # type: ignore[arg-type]
    s = snap(obs)
    assert s.draft_tokens_unverified == 6
    assert s.draft_tokens_total == 5  # the verified drafts alone
    assert s.errors["bad_acceptance"] == 5
    text = generate_latest(registry).decode()
    values = {smp.name: smp.value for fam in text_string_to_metric_families(text)
              for smp in fam.samples}
    assert values["specobs_draft_tokens_unverified_total"] == 6
    assert values["specobs_draft_tokens_total"] == 5
