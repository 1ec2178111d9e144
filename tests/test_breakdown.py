"""One breakdown definition (:mod:`specobs.tools._breakdown`) for ``specobs top``, ``doctor``,
``report`` and the ``specobs demo`` summary, the quantities the recording rules compute.

A real observer on a fake GPU clock is driven with a cycle stream on which the demo's former
definitions gave other numbers (sequences that draft fewer than k tokens, a batch larger than the
sequences that speculate); the demo summary must show the recording rules' numbers, and must
agree number for number with ``top``'s breakdown of the same two snapshots read through a real
Prometheus exposition.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator

import pytest

import specobs
from specobs.timing import FakeEventClock, FakeGpu
from specobs.tools import _breakdown as bd
from specobs.tools import _scrape as scr

pytest.importorskip("prometheus_client")

K = 4
# One cycle: three sequences speculate (draft lengths 4, 2 and 1; accepted 2, 0 and 1) in a
# batch of 4 (the fourth is in prefill). 6 tokens emitted (accepted + 1 each).
ACCEPTED = [2, 0, 1]
DRAFT_LENGTHS = [4, 2, 1]
BATCH = 4
EMITTED = sum(a + 1 for a in ACCEPTED)


@pytest.fixture
def observer() -> Iterator[specobs.Observer]:
    gpu = FakeGpu()
    obs = specobs.configure(
        sinks=[specobs.MemorySink()],
        clock=FakeEventClock(gpu),
        sample_every=1,
        max_draft_length=K,
        labels={"model": "tiny"},
        baseline_tokens_per_second=50.0,
        poll_interval_seconds=0.01,
    )
    obs.gpu = gpu  # type: ignore[attr-defined]
    yield obs
    obs.shutdown()


def _run(obs: specobs.Observer, n: int) -> None:
    gpu: FakeGpu = obs.gpu  # type: ignore[attr-defined]
    for _ in range(n):
        with obs.cycle(batch_size=BATCH) as c:
            gpu.run(200_000)
            c.mark("verify")
            gpu.run(600_000)
            c.mark("bookkeeping")
            gpu.run(100_000)
            c.accept(list(ACCEPTED), draft_length=list(DRAFT_LENGTHS))
        gpu.complete()
    assert obs.force_flush(5)


class _Frozen:
    """A metric source that always answers the same snapshot."""

    def __init__(self, snapshot: specobs.Snapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> specobs.Snapshot:
        return self._snapshot

    def add_cpu(self, component: str, seconds: float) -> None:
        pass


def _scrape(snapshot: specobs.Snapshot, at: float) -> scr.Scrape:
    """``snapshot`` read as top and doctor read an endpoint: its Prometheus exposition."""
    from prometheus_client import CollectorRegistry, generate_latest

    from specobs.sinks.prometheus import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector(_Frozen(snapshot), exemplars=False)  # type: ignore[arg-type]
    collector.outer.counting = True  # the snapshot's CPU seconds stay as they are
    registry.register(collector)
    return scr.Scrape(scr.parse_exposition(generate_latest(registry).decode()), at)


def test_demo_summary_uses_the_recording_rules_definitions(observer: specobs.Observer) -> None:
    from specobs.demo import _summary

    _run(observer, 3)
    old = observer.snapshot()
    _run(observer, 10)
    new = observer.snapshot()
    view = _summary.compute_view(new, old, 2.0)

    # Per position: accepted / drafted tokens at that position (the dashboards' panel), not the
    # share of speculating sequences that got that far (which gave 1/3 at position 2).
    assert view.per_position == pytest.approx((2 / 3, 1 / 2, 0.0, 0.0))
    # Per-sequence speed divides by the batch-size sum (instance:specobs_sequence_tokens_per_
    # second), not by the number of speculating sequences (which gave 6/3 per cycle).
    host_cycle = (new.cycle_seconds_sum("host") - old.cycle_seconds_sum("host")) / 10
    assert view.sequence_tokens_per_second == pytest.approx(EMITTED / BATCH / host_cycle)
    assert view.speedup == pytest.approx(EMITTED / BATCH / host_cycle / 50.0)
    assert view.batch_size_mean == pytest.approx(BATCH)
    assert view.acceptance_rate == pytest.approx(3 / 7)
    assert view.mean_accept_length == pytest.approx(1.0)
    assert view.cycles_per_second == pytest.approx(5.0)
    assert view.tokens_per_second == pytest.approx(10 * EMITTED / 2.0)
    assert view.phases["verify"]["gpu"] == _summary.PhaseTime(pytest.approx(0.6),
                                                              pytest.approx(6 / 9))
    # The renderings keep their format; a position nothing was drafted at shows a dash.
    line = _summary.plain_line(view, fault=None)
    assert "acceptance 0.43" in line and "batch 4.0" in line
    assert "gpu: draft 0.20 ms (22%), verify 0.60 ms (67%), bookkeeping 0.10 ms (11%)" in line
    final = "\n".join(_summary.final_lines(view, seconds=2.0, fault=None, baseline_note="x",
                                           requests="-"))
    assert ("mean acceptance length 2.00 incl. bonus (1.00 of 4 drafts accepted), by position "
            "67%, 50%, 0%, 0%") in final
    # Draft positions are numbered from 0, as in top, the report and vLLM's own counters.
    from rich.console import Console

    console = Console(width=160, record=True, file=io.StringIO())
    console.print(_summary.render_rich(view, title="t", fault=None, requests="-", where=[],
                                       baseline_note="x"))
    assert "0: 67%  1: 50%  2: 0%  3: 0%" in console.export_text()


def test_demo_and_top_agree_number_for_number_on_the_same_snapshots(
    observer: specobs.Observer,
) -> None:
    from specobs.demo import _summary

    _run(observer, 5)
    old = observer.snapshot()
    _run(observer, 20)
    new = observer.snapshot()

    delta = scr.difference(_scrape(old, 100.0), _scrape(new, 103.5))
    assert isinstance(delta, scr.Delta)
    top = bd.breakdown(delta)
    demo = _summary.compute_view(new, old, 3.5).breakdown
    assert dataclasses.asdict(demo) == dataclasses.asdict(top)
    assert top.cycles == 20 and top.position_acceptance[1] == ("1", pytest.approx(0.5))
    # Since the start, too (the demo's exit summary).
    first = bd.breakdown(scr.difference(scr.Scrape(scr.Series(), 0.0), _scrape(new, 3.5)))
    assert dataclasses.asdict(_summary.compute_view(new, None, 3.5).breakdown) \
        == dataclasses.asdict(first)


def test_the_acceptance_copies_time_per_cycle_is_read_apart_from_the_rest(
    observer: specobs.Observer,
) -> None:
    _run(observer, 5)
    old = dataclasses.replace(observer.snapshot(), cpu_seconds={"resolver": 1.0})
    _run(observer, 20)
    new = dataclasses.replace(observer.snapshot(), cpu_seconds={
        "resolver": 1.0 + 20 * 3e-6, "acceptance_copy": 20 * 5e-6})
    b = bd.breakdown(scr.difference(_scrape(old, 10.0), _scrape(new, 12.0)))
    assert b.cycles == 20
    assert b.acceptance_copy_seconds_per_cycle == pytest.approx(5e-6)
    assert b.exporter_cpu_seconds_per_cycle == pytest.approx(8e-6)
    # Acceptance as host data: no such component, no copy time.
    b = bd.breakdown(scr.difference(_scrape(old, 10.0), _scrape(
        dataclasses.replace(new, cpu_seconds={"resolver": 1.1}), 12.0)))
    assert b.acceptance_copy_seconds_per_cycle == 0.0


def test_a_measured_baseline_replaces_the_configured_gauge(observer: specobs.Observer) -> None:
    _run(observer, 4)
    snap = observer.snapshot()
    assert bd.breakdown(bd.snapshot_delta(snap, None, 1.0)).baseline_tokens_per_second == 50.0
    assert bd.breakdown(bd.snapshot_delta(snap, None, 1.0, 80.0)).baseline_tokens_per_second \
        == 80.0


def test_zero_window_and_no_cycles_give_none_not_a_division_by_zero(
    observer: specobs.Observer,
) -> None:
    from specobs.demo import _summary

    snap = observer.snapshot()
    view = _summary.compute_view(snap, snap, 0.0)
    assert view.breakdown.cycles_per_second is None and view.cycles_per_second == 0.0
    assert view.acceptance_rate is None and view.sequence_tokens_per_second is None
    assert all(p is None for p in view.per_position)
    assert "acceptance -" in _summary.plain_line(view, fault=None)
