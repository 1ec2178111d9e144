"""The report's HTML page: one self-contained file (plotly.js inlined once) holding the tables,
the findings of ``specobs doctor``'s diagnosis and the charts, for one run or two compared."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import Any

from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools import _scrape as scr
from specobs.tools.report import _data as data
from specobs.tools.report import _stats as stats
from specobs.tools.report._charts import figures, section_notes
from specobs.tools.report._tables import compare_table, fmt, summary_html

__all__ = ["batch_finding", "compare_changes", "findings_section", "render_compare",
           "render_run", "run_findings"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid
#ddd;padding-bottom:3px}.meta{color:#666;font-size:13px;margin-bottom:12px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 9px;text-align:right;
border-bottom:1px solid #eee}th{text-align:left;font-weight:600;color:#444}
.summary{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
tr.total td{font-weight:600}.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.chart{min-height:300px;border:1px solid #f0f0f0}.chart.wide{grid-column:1/-1}
.note{color:#666;font-size:13px}
.significant{background:#fde2e1;font-weight:600}.consequence{background:#fff4d6}
.findings{padding:8px 12px;border-left:4px solid #e45756;background:#fff8f7;margin:10px 0}
table.diagnosis td{text-align:left;vertical-align:top}.sev-fail{background:#fde2e1}
.sev-warn{background:#fff4d6}
.findings.none{border-color:#54a24b;background:#f4fbf3}
td.verdict{text-align:left}table.compare td{white-space:nowrap}
table.compare td.verdict,table.compare td.note{white-space:normal}td.note{text-align:left}
"""


def _draws_something(fig: Any) -> bool:
    """Whether any trace of ``fig`` has a finite value to draw (x of a horizontal bar, else
    y): an empty chart is a line of text instead."""
    for t in fig.data:
        values = t.x if getattr(t, "orientation", None) == "h" else t.y
        if any(isinstance(v, (int, float)) and math.isfinite(v) for v in values or ()):
            return True
    return False


def _page(title: str, meta: str, body: str, figs: list[tuple[str, str, Any]],
          notes: dict[str, str] | None = None) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    notes = notes or {}
    order = list(dict.fromkeys(section for _, section, _ in figs))
    sections: list[str] = []
    for section in order:
        sections.append(f"<h2>{html.escape(section)}</h2>{notes.get(section, '')}"
                        '<div class="grid">')
        members = [(fid, fig) for fid, s, fig in figs if s == section]
        for fid, fig in members:
            if not _draws_something(fig):
                sections.insert(-1, f'<p class="note" data-empty="{fid}">'
                                f"{html.escape(fig.layout.title.text or fid)}: no data in "
                                "this run.</p>")
        members = [(fid, fig) for fid, fig in members if _draws_something(fig)]
        for i, (fid, fig) in enumerate(members):
            div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=fid,
                              config={"displaylogo": False, "responsive": True,
                                      "displayModeBar": False})
            title_text = fig.layout.title.text or ""
            # A chart alone in its row of two takes the whole row.
            wide = " wide" if i == len(members) - 1 and len(members) % 2 else ""
            sections.append(f'<div class="chart{wide}" data-title="{html.escape(title_text)}">'
                            f"{div}</div>")
        sections.append("</div>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1><div class=\"meta\">{meta}</div>{body}"
        + "".join(sections)
        + "</body></html>\n"
    )


def _meta(r: data.Run) -> str:
    info = r.total.info
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.start_unix))
    # A run named after its source (a single run of a URL) shows the source once.
    parts = [
        f"<b>{html.escape(r.name)}</b>: {html.escape(r.source)}"
        if r.name and r.name != r.source else f"<b>{html.escape(r.source)}</b>",
        f"{when}, {r.duration_seconds:.0f} s, {len(r.windows)} windows",
    ]
    if info:
        parts.append(html.escape(", ".join(
            f"{k}={v}" for k, v in sorted(info.items()) if k not in ("instance", "job"))))
    if r.failures:
        parts.append(f'<span class="significant">{len(r.failures)} failed samples '
                     f"(first: {html.escape(r.failures[0][1][:120])})</span>")
    return " · ".join(parts)


def run_findings(r: data.Run) -> list[dg.Finding]:
    """The diagnosis of a run (docs/diagnosis.md): the whole run's findings, the batch size
    above which speculation stops paying fitted over the run's windows (:func:`batch_finding`),
    then its last window against the run before it when the run has at least four windows."""
    whole = dg.window(r.total_delta, r.end_unix)
    findings = [f for f in dg.diagnose(whole) if f.code != "SPEC-ADVICE-BATCH"]
    batch = batch_finding(r)
    if batch is not None:
        findings.append(batch)
    if len(r.windows) >= 4 and r.total.cycles > 0:
        findings += dg.against_past(r.windows[-1].breakdown, before_last_window(r))
    return findings


def batch_finding(r: data.Run) -> dg.Finding | None:
    """``SPEC-ADVICE-BATCH`` over the batch sizes the run served: one point per window (short
    ones joined, :func:`specobs.tools.report._data.batch_windows`), each at its mean batch with
    the baseline read at its end. The whole run is no point of its own: its baseline gauge was
    read at its end, on the batch served then, not on the run's mean batch. ``None`` without a
    window of 50 cycles and a baseline measured on the served batch."""
    windows = data.batch_windows(r.windows)
    if not windows:
        return None
    # diagnose() fits the threshold over its recent window and the others given.
    found = dg.diagnose(windows[-1], batch_windows=windows[:-1])
    return next((f for f in found if f.code == "SPEC-ADVICE-BATCH"), None)


def before_last_window(r: data.Run) -> bd.Breakdown:
    """The run up to its last window, as one breakdown (the counters of the earlier windows
    added up, the gauges as the last of them read): what the last window is compared with, so
    a change within it is not diluted by being part of what it is compared with."""
    return bd.breakdown(data.joined([w.delta for w in r.windows[:-1]]))


def findings_section(findings: Sequence[dg.Finding]) -> str:
    """The report's findings: one row per finding, the worst first, with what to change."""
    order = sorted(findings, key=lambda f: -dg.SEVERITIES.index(f.severity))
    rows = "".join(
        f'<tr class="sev-{f.severity}" data-code="{html.escape(f.code)}">'
        f"<td>{html.escape(f.severity.upper())}</td><td><code>{html.escape(f.code)}</code></td>"
        f"<td>{html.escape(f.sentence)}</td><td>{html.escape(f.advice)}</td></tr>"
        for f in order
    )
    return (f'<h2>Findings ({html.escape(dg.status_line(findings))})</h2>'
            '<p class="note">The diagnosis of <code>specobs doctor</code> on the whole run, the '
            "batch size above which speculation stops paying over the batch sizes its windows "
            "served, and its last window against the run (docs/diagnosis.md).</p>"
            '<table class="diagnosis"><tr><th>severity</th><th>code</th><th>finding</th>'
            f"<th>what to look at</th></tr>{rows}</table>")


def render_run(r: data.Run, title: str | None = None) -> str:
    """The HTML report of one run."""
    body = ("<h2>Summary (whole run, as <code>specobs top</code> computes it)</h2>"
            + summary_html(r.total) + findings_section(run_findings(r)))
    if r.up:
        down = {k: sum(1 for _, v in pts if v < 1) for k, pts in r.up.items()}
        body += ('<p class="note">scrape health (Prometheus <code>up</code>): '
                 + html.escape(", ".join(f"{k or 'target'}: {n} failed of {len(r.up[k])}"
                                         for k, n in sorted(down.items()))) + "</p>")
    if r.scrape_seconds:
        worst = max(s for _, s in r.scrape_seconds)
        body += (f'<p class="note">scrapes: {len(r.scrape_seconds)} ok, {len(r.failures)} '
                 f"failed, slowest {scr.format_seconds(worst)}</p>")
    return _page(title or f"specobs report — {r.name}", _meta(r), body, figures([r]),
                 section_notes([r]))


def compare_changes(a: data.Run, b: data.Run, *, alpha: float = 0.01,
                    min_change: float = 0.10) -> list[stats.Change]:
    """Every compared metric of runs ``a`` and ``b`` with its verdict."""
    positions = [p for p, _ in a.total.position_acceptance]
    positions += [p for p, _ in b.total.position_acceptance if p not in positions]
    phases = list(a.total.phases) + [p for p in b.total.phases if p not in a.total.phases]
    return stats.compare(
        stats.metric_defs(phases, positions), a.total, b.total,
        [w.breakdown for w in a.windows], [w.breakdown for w in b.windows],
        alpha=alpha, min_change=min_change,
    )


def render_compare(
    a: data.Run, b: data.Run, *, title: str | None = None, alpha: float = 0.01,
    min_change: float = 0.10,
) -> str:
    """The HTML report comparing runs ``a`` and ``b``."""
    if a.name == b.name:
        a.name, b.name = f"A: {a.name}", f"B: {b.name}"
    changes = compare_changes(a, b, alpha=alpha, min_change=min_change)
    found = stats.findings(changes)
    consequences = [c for c in changes if c.verdict == "consequence"]
    load = [c for c in changes if c.verdict == "load differs"]
    caveat = ("<p>The load differed (" + html.escape(", ".join(
        f"{c.metric.label} {fmt(c.metric.kind, c.a)} → {fmt(c.metric.kind, c.b)}"
        for c in load)) + "): timing and throughput compare unlike traffic.</p>") if load else ""
    if found:
        items = "".join(
            f"<li data-finding=\"{c.metric.key}\"><b>{html.escape(c.metric.label)}</b>: "
            f"{fmt(c.metric.kind, c.a)} → {fmt(c.metric.kind, c.b)}</li>" for c in found)
        extra = ("<p>Following from them: " + html.escape(", ".join(
            c.metric.label for c in consequences)) + ".</p>") if consequences else ""
        box = (f'<div class="findings"><b>Changes beyond run-to-run noise</b> (Welch t-test '
               f"over windows at alpha {alpha:g} and at least {min_change:.0%} change)"
               f"<ul>{items}</ul>{extra}{caveat}</div>")
    else:
        box = ('<div class="findings none"><b>No change beyond run-to-run noise</b> '
               f"(Welch t-test over windows at alpha {alpha:g} and at least "
               f"{min_change:.0%} change){caveat}</div>")
    body = (box + "<h2>Side by side (whole runs)</h2>"
            + compare_table(changes, a.name, b.name)
            + f"<h2>Summary of {html.escape(a.name)}</h2>" + summary_html(a.total, "a.")
            + f"<h2>Summary of {html.escape(b.name)}</h2>" + summary_html(b.total, "b."))
    meta = _meta(a) + "<br>" + _meta(b)
    return _page(title or f"specobs report — {a.name} vs {b.name}", meta, body,
                 figures([a, b]), section_notes([a, b]))
