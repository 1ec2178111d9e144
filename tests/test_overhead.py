"""The sampler's model of specobs's cost per cycle, and the CPU ledger (specobs/_overhead.py).

Pure: figures and ``now`` are passed in, no threads or clocks."""

from __future__ import annotations

import pytest

from specobs import sampling
from specobs._overhead import (
    ADAPT_EVERY_NS,
    RESOLVER_FIGURE_CYCLES,
    RESOLVER_FIGURE_NS,
    Counts,
    CpuLedger,
    OverheadModel,
)


def counts(enqueued: int = 0, copy_ns: int = 0, *, interval: int = 1, adaptive: bool = True,
           native_copies: bool = False) -> Counts:
    return Counts(enqueued, copy_ns, interval, adaptive, boundary_ns=100.0, nphases=3,
                  native_copies=native_copies)


def test_figures_gather_until_the_model_is_due_then_come_back_summed():
    m = OverheadModel(0.01, now=0)
    # Due at once the first time, then every ADAPT_EVERY_NS.
    assert m.gather(10, 1, 4_000, 4, 7, now=0) == (10, 1, 1_000.0, 7)
    assert m.gather(20, 2, 3_000, 1, 5, now=1) is None
    assert m.gather(30, 1, 5_000, 3, 0, now=ADAPT_EVERY_NS - 1) is None
    assert m.gather(0, 0, 0, 0, 0, now=ADAPT_EVERY_NS) == (50, 3, 2_000.0, 5)
    assert m.pending == [0, 0, 0, 0, 0]
    assert m.due == 2 * ADAPT_EVERY_NS


def test_no_cycles_gathered_reads_as_no_cycle_time():
    m = OverheadModel(0.01, now=0)
    assert m.gather(0, 0, 0, 0, 0, now=0) == (0, 0, 0.0, 0)


def test_the_interval_keeps_records_and_reads_within_the_budget():
    m = OverheadModel(0.01, now=0)
    r = m.run(6_000, 2, 100_000.0, 4_000, counts(), now=0)
    assert (m.cost_ewma, m.read_ewma, m.cycle_ewma) == (3_000.0, 2_000.0, 100_000.0)
    assert r.interval == sampling.adaptive_interval(5_000.0, 100_000.0, 0.01) == 5
    assert r.cost_seconds == pytest.approx(6e-6)
    # A fixed sample_every: the model leaves the interval alone.
    assert m.run(6_000, 2, 100_000.0, 0, counts(adaptive=False), now=0).interval is None


def test_a_run_without_sampled_cycles_keeps_the_cost_figures():
    m = OverheadModel(0.01, now=0)
    m.run(6_000, 2, 100_000.0, 0, counts(), now=0)
    r = m.run(0, 0, 200_000.0, 0, counts(), now=0)
    assert m.cost_ewma == 3_000.0 and r.cost_seconds == 0.0
    assert m.cycle_ewma == sampling.smoothed(100_000.0, 200_000.0)


def test_the_overhead_adds_records_stamps_resolver_cpu_and_native_copies():
    m = OverheadModel(0.01, now=0)
    assert m.run(0, 0, 0.0, 0, counts(), now=0).overhead is None  # no cycle time yet
    m.cost_ewma, m.cycle_ewma, m.record_ns, m.copy_ewma = 4_000.0, 100_000.0, 300.0, 700.0
    stamps = 100.0 * 4
    assert m.overhead(4, counts()) == pytest.approx((1_000 + stamps + 300) / 100_000)
    # The copies count only where the native core starts them (the worker's own time).
    assert m.overhead(4, counts(native_copies=True)) == pytest.approx(
        (1_000 + stamps + 300 + 700) / 100_000)


def test_the_overhead_counts_the_interval_the_run_chose():
    m = OverheadModel(0.01, now=0)
    r = m.run(6_000, 2, 100_000.0, 4_000, counts(interval=1), now=0)
    assert r.overhead == pytest.approx(m.overhead(5, counts()))
    assert r.overhead != pytest.approx(m.overhead(1, counts()))


def test_the_resolvers_cpu_per_cycle_waits_for_enough_cycles_or_time():
    m = OverheadModel(0.01, now=0)
    m.add_cpu(1_000 * (RESOLVER_FIGURE_CYCLES - 1))
    m.run(0, 0, 1.0, 0, counts(RESOLVER_FIGURE_CYCLES - 1), now=1)
    assert m.record_ns == 0.0  # too few cycles, too soon: a short slice is no spike
    m.add_cpu(1_000)
    m.run(0, 0, 1.0, 0, counts(RESOLVER_FIGURE_CYCLES), now=2)
    assert m.record_ns == 1_000.0 and m.cpu_acc == 0 and m.cpu_from == RESOLVER_FIGURE_CYCLES
    # Slow cycles: a few, once a second has passed.
    m.add_cpu(30_000)
    m.run(0, 0, 1.0, 0, counts(RESOLVER_FIGURE_CYCLES + 3), now=RESOLVER_FIGURE_NS + 2)
    assert m.record_ns == sampling.smoothed(1_000.0, 10_000.0)


def test_copy_time_per_cycle_follows_the_recorders_totals():
    m = OverheadModel(0.01, now=0)
    m.run(0, 0, 1.0, 0, counts(10, 5_000), now=0)
    assert m.copy_ewma == 500.0
    m.run(0, 0, 1.0, 0, counts(20, 5_000), now=0)
    assert m.copy_ewma == 400.0  # no copies in those cycles: decays


def test_reset_forgets_the_averages_and_counts_from_the_given_totals():
    m = OverheadModel(0.01, now=0)
    m.run(6_000, 2, 100_000.0, 4_000, counts(50, 9_000), now=0)
    m.add_cpu(123)
    m.reset(enqueued=80, copy_ns=12_000)
    assert (m.cost_ewma, m.cycle_ewma, m.copy_ewma, m.read_ewma, m.record_ns, m.cpu_acc) == (
        0.0, 0.0, 0.0, 0.0, 0.0, 0)
    m.run(0, 0, 1.0, 0, counts(90, 13_000), now=0)
    assert m.copy_ewma == 100.0  # 1,000 ns over the 10 cycles since the reset


def test_the_cpu_ledger_hands_out_each_nanosecond_once():
    ledger = CpuLedger()
    ledger.pending += 700
    assert ledger.take(pump_ns=300, copy_ns=50) == (1_000, 50)
    assert ledger.take(pump_ns=300, copy_ns=50) == (0, 0)
    ledger.pending += 5
    assert ledger.take(pump_ns=310, copy_ns=80) == (15, 30)
    ledger.reset(copy_ns=500)  # a forked child: the parent's copies are not its own
    assert ledger.take(pump_ns=310, copy_ns=520) == (0, 20)
