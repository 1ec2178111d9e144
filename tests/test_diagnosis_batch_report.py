"""``SPEC-ADVICE-BATCH`` in ``specobs report``: fitted over the run's windows (short ones joined
to 50 cycles, never across two batch sizes), not over the whole run, whose baseline gauge was
read at its end; on constructed windows with the costs of tests/test_diagnosis_batch.py.
tests/test_diagnosis_batch_prometheus.py runs ``report --prometheus`` on a live server."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools._scrape import Delta
from specobs.tools.report import _data as data
from specobs.tools.report import _page as page
from tests.test_diagnosis import delta
from tests.test_diagnosis_batch import costs, measured, point


def at_batch(batch: float, cycles: float = 1000.0) -> Delta:
    """A window of ``cycles`` cycles at ``batch`` with the constructed server's costs and a
    baseline measured on that batch."""
    plain, verify, cycle = costs(batch)
    d = delta(batch=batch, cycles=cycles, positions=(0.75, 0.65, 0.55, 0.45), elapsed=2.0,
              host={"draft": cycle - verify - 0.2e-3, "verify": verify, "bookkeeping": 0.2e-3})
    return measured(d, 1.0 / plain)


def run_of(deltas: Sequence[Delta]) -> data.Run:
    windows = [data.Window(2.0 * (i + 1), d, bd.breakdown(d)) for i, d in enumerate(deltas)]
    total = data.joined(deltas)
    return data.Run("run", "constructed", 1000.0, 1000.0 + 2.0 * len(deltas), windows,
                    bd.breakdown(total), total)


def test_the_threshold_is_fitted_over_the_runs_windows() -> None:
    batches = (1.0, 2.0, 4.0, 8.0, 16.0)
    r = run_of([at_batch(b) for b in batches])
    found = {f.code: f for f in page.run_findings(r)}["SPEC-ADVICE-BATCH"]
    direct = dg.batch_threshold([point(b) for b in batches])
    assert direct is not None
    assert found.sentence == direct.sentence
    assert (found.severity, found.evidence["confidence"]) == ("info", "low")
    assert found.evidence["threshold_batch"] == pytest.approx(direct.evidence["threshold_batch"])
    # The whole run is no point: at its mean batch, 6.2, it would be a sixth batch size.
    assert r.total.mean_batch_size == pytest.approx(6.2)
    assert found.evidence["batches_observed"] == 5.0


def test_the_report_shows_the_threshold_in_its_findings() -> None:
    pytest.importorskip("plotly")
    html = page.render_run(run_of([at_batch(b) for b in (1.0, 4.0, 16.0, 32.0, 64.0, 128.0)]))
    row = html[html.index('data-code="SPEC-ADVICE-BATCH"'):]
    row = row[:row.index("</tr>")]
    assert "speculation stops paying between batch 32.0 (1.07x) and 64.0 (1.00x), about" in row
    assert "disable speculation above batch" in row
    assert "the batch size above which speculation stops paying over the batch sizes" in html


def test_a_steady_run_names_no_threshold() -> None:
    r = run_of([at_batch(4.0)] * 5)
    found = {f.code: f for f in page.run_findings(r)}["SPEC-ADVICE-BATCH"]
    assert found.severity == "ok" and found.evidence["threshold_batch"] is None
    assert found.evidence["batches_observed"] == 1.0
    # A configured baseline may be of any batch: no window is a point, and no finding.
    configured = [delta(batch=b, baseline=300.0, elapsed=2.0) for b in (1.0, 4.0, 16.0)]
    assert data.batch_windows(run_of(configured).windows) != []
    assert "SPEC-ADVICE-BATCH" not in {f.code for f in page.run_findings(run_of(configured))}


def test_short_windows_are_joined_within_one_batch_size() -> None:
    # 20 cycles a window: three at batch 4 make one point of 60 cycles; two at batch 16 are
    # 40, short of 50, and are not joined with the batch-4 ones.
    windows = [at_batch(4.0, 20.0)] * 3 + [at_batch(16.0, 20.0)] * 2
    joined = data.batch_windows(run_of(windows).windows)
    assert [(w.breakdown.cycles, w.breakdown.mean_batch_size) for w in joined] == [(60.0, 4.0)]
    assert joined[0].baseline_measured
    # Windows of 50 cycles or more stay as they are; windows without cycles are left out.
    idle = delta(cycles=0.0)
    joined = data.batch_windows(run_of([at_batch(4.0, 50.0), idle, at_batch(16.0, 80.0),
                                        at_batch(4.5, 30.0), at_batch(4.0, 30.0)]).windows)
    assert [(w.breakdown.cycles, w.breakdown.mean_batch_size) for w in joined] == [
        (50.0, 4.0), (80.0, 16.0), (60.0, pytest.approx(4.25))]
    # The join's gauges are its last window's.
    last = at_batch(4.0, 30.0)
    last.gauges.samples = {k: (200.0 if "baseline" in k[0] else v)
                           for k, v in last.gauges.samples.items()}
    (w,) = data.batch_windows(run_of([at_batch(4.0, 30.0), last]).windows)
    assert w.breakdown.baseline_tokens_per_second == 200.0
