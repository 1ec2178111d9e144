"""The report rendered without servers: its findings section (the diagnosis of the whole run,
and of its last window against the run) on runs built from constructed scrapes, and every chart
of reports made from two real ``specobs demo`` runs on CPU (tests/data/report-demo-*.jsonl.gz,
saved by ``specobs report --compare ... --save`` from a healthy demo and one with
``--fault wrong-hidden-layers``, sampled side by side for 40 s) read back from the figures the
page embeds: no chart is empty where the run has its data, no line is flattened to zero by an
axis it shares, the accept-length axis is the quantity's own 0..k, and the per-sequence speed
has its baseline. tests/test_report.py runs the same checks on live reports in Chromium.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from specobs.tools import report as _report
from specobs.tools._scrape import Series
from specobs.tools.report import _charts
from specobs.tools.report import _data as _report_data
from tests.test_diagnosis import HEALTHY, delta

pytest.importorskip("plotly")

DATA = Path(__file__).resolve().parent / "data"
HEALTHY_RUN = DATA / "report-demo-healthy.jsonl.gz"
FAULTY_RUN = DATA / "report-demo-wrong-hidden-layers.jsonl.gz"


def _run(windows: Sequence[dict[str, object]]) -> _report_data.Run:
    """A run of one-second windows, each the interval ``delta(**kwargs)`` describes: the scrapes
    are the running sums of the windows' counters."""
    snapshots = []
    total = Series()
    parts = [delta(elapsed=1.0, **kw) for kw in windows]  # type: ignore[arg-type]
    for d, kw in zip(parts, windows, strict=True):
        _add_accept_length_buckets(d.counters, kw)
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


def _add_accept_length_buckets(counters: Series, kw: dict[str, object]) -> None:
    """The accept-length histogram's buckets (0..k+1, +Inf) that ``delta``'s counters imply:
    the unconditional acceptance p_j at position j is the share of drafts accepting more than
    j tokens, so the bucket ``le=j`` holds 1 - p_j of them."""
    k = int(kw.get("k", 4))  # type: ignore[call-overload]
    rates = list(kw.get("positions", (0.85, 0.83, 0.80, 0.78)))  # type: ignore[call-overload]
    drafts = counters.total("specobs_accept_length_count") or 0.0
    for j in range(k + 2):
        p = rates[j] if j < min(k, len(rates)) else 0.0
        counters.add("specobs_accept_length_bucket", {"le": f"{float(j)}"}, (1 - p) * drafts)
    counters.add("specobs_accept_length_bucket", {"le": "+Inf"}, drafts)


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


def test_the_last_window_is_compared_with_the_run_before_it() -> None:
    """The past the last window is held against is the run up to that window: verify 4x
    slower in the last of 6 windows reads as 4x (the whole run, which holds the slow window,
    would read it as 2.7x)."""
    from specobs.tools.report import _page

    slow = {**HEALTHY, "verify": 4 * HEALTHY["verify"]}
    r = _run([{"cycles": 200, "host": HEALTHY}] * 5 + [{"cycles": 200, "host": slow}])
    before = _page.before_last_window(r)
    assert before.cycles == 1000
    findings = {f.code: f for f in _page.run_findings(r)}
    got = findings["SPEC-RECENT-PHASE-SLOWER"].evidence
    factors = [v for k, v in got.items() if "factor" in k or k == "ratio"]
    text = findings["SPEC-RECENT-PHASE-SLOWER"].sentence
    assert "4.0" in text or any(abs(float(f) - 4.0) < 0.05 for f in factors), (text, got)


def test_a_healthy_run_says_so() -> None:
    r = _run([{"cycles": 200, "host": HEALTHY, "baseline": 300.0}] * 5)
    page = _report.render_run(r)
    assert "<h2>Findings (OK: no problem found)</h2>" in page
    assert _rows(page)["SPEC-SPEEDUP-OK"] == "ok"


# -- every chart, read from the page --------------------------------------------------------------

#: A trace whose largest value is below this share of the largest on the axis it shares draws
#: as a flat line at zero (an overhead of 0.06 % beside 50 µs of CPU).
FLAT_SHARE = 0.02


def embedded_charts(page: str) -> list[dict[str, Any]]:
    """Every ``Plotly.newPlot(id, data, layout, ...)`` of a report, as ``{"id", "title",
    "data", "layout"}``, after the inlined plotly.js (which has calls of its own)."""
    decoder = json.JSONDecoder()
    start = page.index("</head>")
    charts = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page[start:]):
        data, end = decoder.raw_decode(page, start + m.end())
        comma = re.compile(r"\s*,\s*").match(page, end)
        assert comma is not None, page[end:end + 80]
        layout, _ = decoder.raw_decode(page, comma.end())
        charts.append({"id": m.group(1), "title": layout["title"]["text"], "data": data,
                       "layout": layout})
    # Each chart's container names it, and each container holds one figure.
    assert [c["title"] for c in charts] == [html.unescape(t) for t in re.findall(
        r'<div class="chart[^"]*" data-title="([^"]*)"', page)]
    return charts


def _values(trace: dict[str, Any]) -> list[float]:
    """The finite numbers a trace draws: x of a horizontal bar, else y."""
    raw = trace.get("x" if trace.get("orientation") == "h" else "y") or []
    assert isinstance(raw, list), f"{trace.get('name')}: not a list of values: {raw!r}"[:200]
    return [v for v in raw if isinstance(v, (int, float)) and math.isfinite(v)]


def chart_problems(page: str) -> list[str]:
    """What is wrong with a report's charts, one line each (none: every chart is right).

    * a chart with no finite value in any trace is empty (a clock the run has no samples of
      gets a line of text, not a chart);
    * on an axis shared by unstacked traces, one that peaks under ``FLAT_SHARE`` of the
      axis's largest reads as zero;
    * the accept-length axis is accepted draft tokens 0..k, k the draft positions of the
      per-position chart (the histogram's bucket k+1 can never fill);
    * where the summary has a baseline, the per-sequence speed draws it as a line.
    """
    problems = []
    charts = embedded_charts(page)
    for c in charts:
        traces, title = c["data"], c["title"]
        if not any(_values(t) for t in traces):
            problems.append(f"{title}: empty, no trace has a value")
        stacked = c["layout"].get("barmode") == "stack"
        axes: dict[str, list[tuple[str, float]]] = {}
        for t in traces:
            vs = _values(t)
            if t.get("stackgroup") or stacked or not vs:
                continue
            axis = t.get("xaxis", "x") if t.get("orientation") == "h" else t.get("yaxis", "y")
            axes.setdefault(axis, []).append((t.get("name", ""), max(abs(v) for v in vs)))
        for axis, peaks in axes.items():
            top = max(p for _, p in peaks)
            for name, peak in peaks:
                if 0 < peak < FLAT_SHARE * top:
                    problems.append(f"{title}: {name!r} peaks at {peak:.3g}, under "
                                    f"{FLAT_SHARE:.0%} of {top:.3g} on its axis {axis}: it "
                                    "reads as zero")
    by_title = {c["title"]: c for c in charts}
    positions, lengths = by_title.get("Acceptance per draft position"), \
        by_title.get("Accept-length distribution")
    if positions and lengths:
        k = max(len(t["x"]) for t in positions["data"])
        for t in lengths["data"]:
            if [str(x) for x in t["x"]] != [str(i) for i in range(k + 1)]:
                problems.append(f"Accept-length distribution: axis {t['x']}, not the accepted "
                                f"draft tokens 0..{k} (k = {k} draft positions)")
        axis_title = lengths["layout"]["xaxis"]["title"]["text"]
        if "accepted draft tokens" not in axis_title or f"k = {k}" not in axis_title:
            problems.append(f"Accept-length distribution: axis title {axis_title!r} does not "
                            f"name the quantity and k = {k}")
    baselines = re.findall(r'<td data-key="(?:a\.|b\.)?baseline"[^>]*>(.*?)</td>', page)
    speed = by_title.get("Tokens/s per sequence")
    if speed and any(b.strip() not in ("", "—") for b in baselines):
        lines = [t for t in speed["data"] if "baseline" in t.get("name", "") and _values(t)]
        if not lines:
            problems.append("Tokens/s per sequence: the run has a baseline and the chart "
                            "draws none")
    return problems


@pytest.fixture(scope="module")
def demo_runs() -> tuple[_report_data.Run, _report_data.Run]:
    runs = []
    for path, name in ((HEALTHY_RUN, "healthy"), (FAULTY_RUN, "wrong-hidden-layers")):
        source, snapshots = _report_data.load_snapshots(str(path))
        runs.append(_report_data.run_from_scrapes(name, source, snapshots))
    return runs[0], runs[1]


def test_every_chart_of_a_real_cpu_run_is_drawn(
    demo_runs: tuple[_report_data.Run, _report_data.Run],
) -> None:
    healthy = demo_runs[0]
    assert healthy.total.cycle_counts.get("gpu", 0.0) == 0  # a CPU run: no GPU clock
    page = _report.render_run(healthy)
    assert chart_problems(page) == []
    titles = [c["title"] for c in embedded_charts(page)]
    assert titles == [
        "Cycle breakdown, host clock", "Phase share of cycle time", "Phase latency p50 / p99",
        "Acceptance rate over time", "Acceptance per draft position",
        "Accept-length distribution", "Emitted tokens/s per server", "Tokens/s per sequence",
        "Speedup: realized vs predicted", "Requests running and waiting",
        "Drops and exporter health",
    ]
    # No GPU clock: one line says so under the breakdown heading and in the phase table; the
    # host chart takes the row, and so does each chart left alone in its row.
    assert page.count('data-no-clock="gpu-0"') == 1
    assert len(re.findall(r'<tr class="no-clock" data-clock="gpu">', page)) == 1
    assert "<td>gpu</td><td>draft</td>" not in page
    wide = re.findall(r'<div class="chart wide" data-title="([^"]*)"', page)
    assert wide == ["Cycle breakdown, host clock", "Accept-length distribution",
                    "Drops and exporter health"]
    by_title = {c["title"]: c for c in embedded_charts(page)}
    # The load the run was served under: the demo's 4 clients, running or waiting.
    requests = {t["name"]: t["y"] for t in by_title["Requests running and waiting"]["data"]}
    assert set(requests) == {"running", "waiting"}
    assert all(v is not None and 0 <= v <= 4 for v in requests["running"])
    assert max(requests["running"]) > 0
    # Phase share: the host bar only.
    assert {y for t in by_title["Phase share of cycle time"]["data"] for y in t["y"]} == {"host"}
    # Overhead % and CPU µs each on an axis of their own.
    health = by_title["Drops and exporter health"]["data"]
    axes = {t["name"]: t.get("yaxis", "y") for t in health}
    assert len({axes["CPU µs/cycle"], axes["overhead %"], axes["dropped by specobs"]}) == 3
    # The accept-length axis: 0..4 for k = 4, the last bucket the all-accepted sequences.
    (lengths,) = by_title["Accept-length distribution"]["data"]
    assert lengths["x"] == ["0", "1", "2", "3", "4"]
    assert sum(lengths["y"]) == pytest.approx(100)
    assert max(lengths["y"]) == lengths["y"][-1]  # a healthy draft: mostly all accepted
    # The baseline the demo measured, one point per window, beside the speculative speed.
    speed = by_title["Tokens/s per sequence"]["data"]
    (base,) = [t for t in speed if "baseline" in t["name"]]
    assert base["y"] == [w.breakdown.baseline_tokens_per_second for w in healthy.windows]
    assert all(100 < v < 200 for v in base["y"])  # as the demo log said: about 110-150


def test_every_chart_of_a_real_comparison_is_drawn(
    demo_runs: tuple[_report_data.Run, _report_data.Run],
) -> None:
    page = _report.render_compare(*demo_runs)
    assert chart_problems(page) == []
    titles = [c["title"] for c in embedded_charts(page)]
    assert titles[:2] == ["Cycle breakdown, host clock — healthy",
                          "Cycle breakdown, host clock — wrong-hidden-layers"]
    # Neither run has the GPU clock: one line under the breakdown heading, one row in the
    # side-by-side table instead of five rows of dashes.
    assert page.count('data-no-clock="gpu-all"') == 1 and 'data-no-clock="gpu-0"' not in page
    assert page.count('<tr class="no-data">') == 1
    assert 'data-metric="cycle_gpu"' not in page and 'data-metric="cycle_host"' in page
    speed = next(c for c in embedded_charts(page) if c["title"] == "Tokens/s per sequence")
    assert sorted(t["name"] for t in speed["data"] if "baseline" in t["name"]) == [
        "healthy · non-speculative baseline", "wrong-hidden-layers · non-speculative baseline"]


def test_a_run_with_the_gpu_clock_draws_both_breakdowns() -> None:
    gpu = {"draft": 1.5e-3, "verify": 2.5e-3, "bookkeeping": 0.1e-3}
    r = _run([{"cycles": 200, "host": HEALTHY, "gpu": gpu, "gpu_cycles": 20,
               "baseline": 300.0}] * 5)
    page = _report.render_run(r)
    assert chart_problems(page) == []
    titles = [c["title"] for c in embedded_charts(page)]
    assert titles[:2] == ["Cycle breakdown, gpu clock", "Cycle breakdown, host clock"]
    assert "data-no-clock" not in page and 'class="no-clock"' not in page
    share = next(c for c in embedded_charts(page) if c["title"] == "Phase share of cycle time")
    assert share["data"][0]["y"] == ["gpu", "host"]


def test_the_checks_find_each_broken_chart(
    demo_runs: tuple[_report_data.Run, _report_data.Run],
) -> None:
    """chart_problems on the real run's pages broken as the report used to draw them: an empty
    gpu-clock chart, the overhead on the µs axis, a bucket at k+1, no baseline line."""
    r = demo_runs[0]
    page = _report.render_run(r)
    assert chart_problems(page) == []

    def broken(fix: Any) -> list[str]:
        import plotly.io as pio

        # The page as the report lays it out, without its guard against empty charts.
        page = _report.render_run(r)
        head = page[:page.index("</head>") + len("</head>")]
        charts = []
        for fid, _, fig in _charts.figures([r]):
            fix(fig)
            charts.append(f'<div class="chart" data-title="{html.escape(fig.layout.title.text)}">'
                          + pio.to_html(fig, full_html=False, include_plotlyjs=False,
                                        div_id=fid) + "</div>")
        summary = page[page.index("</head>"):page.index('<h2>Cycle breakdown')]
        return chart_problems(head + summary + "".join(charts))

    def empty_gpu(fig: Any) -> None:
        if fig.layout.title.text == "Cycle breakdown, host clock":
            fig.layout.title.text = "Cycle breakdown, gpu clock"
            for t in fig.data:
                t.y = [None] * len(t.y)

    def shared_axis(fig: Any) -> None:
        if fig.layout.title.text == "Drops and exporter health":
            for t in fig.data:
                if t.name == "overhead %":
                    t.yaxis = "y2"  # the CPU µs/cycle's axis

    def bucket_k1(fig: Any) -> None:
        if fig.layout.title.text == "Accept-length distribution":
            fig.data[0].x = [*fig.data[0].x, "5"]

    def no_baseline(fig: Any) -> None:
        if fig.layout.title.text == "Tokens/s per sequence":
            fig.data = [t for t in fig.data if "baseline" not in t.name]

    assert [p.split(":")[0] for p in broken(empty_gpu)] == ["Cycle breakdown, gpu clock"]
    (flat,) = broken(shared_axis)
    assert flat.startswith("Drops and exporter health: 'overhead %' peaks at")
    (k1,) = broken(bucket_k1)
    assert k1.startswith("Accept-length distribution: axis")
    assert broken(no_baseline) == ["Tokens/s per sequence: the run has a baseline and the "
                                   "chart draws none"]


def test_draft_positions_are_numbered_from_0_in_demo_top_and_the_report() -> None:
    """One numbering, the engines' (vLLM's per-position counters and specobs's ``position``
    label start at 0), in the demo's live view, ``specobs top`` and the report, read from the
    same counters; the rates differ per position so a shifted label shows."""
    pytest.importorskip("rich")
    import io

    from rich.console import Console

    from specobs.demo import _summary
    from specobs.tools import _top

    r = _run([{"cycles": 200, "host": HEALTHY, "positions": (0.9, 0.7, 0.5, 0.3)}] * 5)
    b = r.total
    assert [p for p, _ in b.position_acceptance] == ["0", "1", "2", "3"]
    expected = "0: 90%  1: 70%  2: 50%  3: 30%"

    def text(renderable: Any) -> str:
        console = Console(file=io.StringIO(), width=200, color_system=None, record=True)
        console.print(renderable)
        return " ".join(console.export_text().split("\n"))

    view = _summary.DemoView(b, b.elapsed_seconds, 1000, 1000, 0)
    assert view.position_labels == ("0", "1", "2", "3")
    demo = text(_summary.render_rich(view, title="t", fault=None, requests="-", where=[],
                                     baseline_note="x"))
    assert expected in demo
    top = text(_top.LiveView("t", 2.0, None).render(_top._data_frame(b), None))
    assert expected in top
    page = _report.render_run(r)
    assert re.search(r'data-key="positions">0: 90%, 1: 70%, 2: 50%, 3: 30%<', page)
    positions = next(c for c in embedded_charts(page)
                     if c["title"] == "Acceptance per draft position")
    assert positions["data"][0]["x"] == ["position 0", "position 1", "position 2", "position 3"]
    assert positions["data"][0]["y"] == pytest.approx([90, 70, 50, 30])


def test_a_run_whose_engine_reports_no_requests_gets_no_requests_chart(
    demo_runs: tuple[_report_data.Run, _report_data.Run],
) -> None:
    """The requests chart draws the engine's running and waiting gauges; an engine that sets
    neither (``set_requests`` never called) gets no empty chart."""
    import dataclasses

    healthy = demo_runs[0]
    assert "requests" in [fid for fid, _, _ in _charts.figures([healthy])]
    quiet = dataclasses.replace(healthy, windows=[
        dataclasses.replace(w, breakdown=dataclasses.replace(
            w.breakdown, requests_running=None, requests_waiting=None))
        for w in healthy.windows])
    assert "requests" not in [fid for fid, _, _ in _charts.figures([quiet])]
