"""The report's findings section: the diagnosis of the whole run, and of its last window
against the run, on runs built from constructed scrapes."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from specobs.tools import _report, _report_data
from specobs.tools._scrape import Series
from tests.test_diagnosis import HEALTHY, delta

pytest.importorskip("plotly")


def _run(windows: Sequence[dict[str, object]]) -> _report_data.Run:
    """A run of one-second windows, each the interval ``delta(**kwargs)`` describes: the scrapes
    are the running sums of the windows' counters."""
    snapshots = []
    total = Series()
    parts = [delta(elapsed=1.0, **kw) for kw in windows]  # type: ignore[arg-type]
    gauges = parts[0].gauges
    zero = Series({k: 0.0 for k in parts[0].counters.samples})
    zero.samples.update(gauges.samples)
    snapshots.append(_report_data.Snapshot(1000.0, zero))
    for i, d in enumerate(parts, 1):
        for key, value in d.counters.samples.items():
            total.samples[key] = total.samples.get(key, 0.0) + value
        series = Series(dict(total.samples))
        series.samples.update(gauges.samples)
        snapshots.append(_report_data.Snapshot(1000.0 + i, series))
    return _report_data.run_from_scrapes("run", "constructed", snapshots)


def _rows(page: str) -> dict[str, str]:
    """code -> severity of each row of the findings table."""
    return {code: sev
            for sev, code in re.findall(r'<tr class="sev-(\w+)" data-code="([^"]+)"', page)}


def test_a_collapsed_run_leads_its_findings() -> None:
    r = _run([{"cycles": 200, "positions": (0.18, 0.175, 0.175, 0.175)}] * 5)
    page = _report.render_run(r)
    assert "<h2>Findings (FAIL: SPEC-ACCEPT-COLLAPSE)</h2>" in page
    rows = _rows(page)
    assert rows["SPEC-ACCEPT-COLLAPSE"] == "fail"
    # The worst first.
    first = re.search(r'<tr class="sev-\w+" data-code="([^"]+)"', page)
    assert first is not None and first.group(1) == "SPEC-ACCEPT-COLLAPSE"


def test_the_last_window_against_the_run() -> None:
    slow = {**HEALTHY, "verify": 4 * HEALTHY["verify"]}
    r = _run([{"cycles": 200, "host": HEALTHY}] * 5 + [{"cycles": 200, "host": slow}])
    rows = _rows(_report.render_run(r))
    assert rows["SPEC-RECENT-PHASE-SLOWER"] == "warn"
    assert rows["SPEC-ACCEPT-HEALTHY"] == "ok"


def test_a_healthy_run_says_so() -> None:
    r = _run([{"cycles": 200, "host": HEALTHY, "baseline": 300.0}] * 5)
    page = _report.render_run(r)
    assert "<h2>Findings (OK: no problem found)</h2>" in page
    assert _rows(page)["SPEC-SPEEDUP-OK"] == "ok"
