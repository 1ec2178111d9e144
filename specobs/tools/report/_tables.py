"""The report's tables: the summary of a run (the numbers ``specobs top`` shows, from
:func:`specobs.tools._breakdown.breakdown`), its phase table per clock, and the side-by-side
table of a comparison with each metric's verdict (:mod:`specobs.tools.report._stats`)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from specobs.tools import _breakdown as bd
from specobs.tools import _scrape as scr
from specobs.tools.report import _stats as stats
from specobs.tools.report._charts import no_clock_text

__all__ = ["compare_table", "fmt", "summary_html", "summary_rows"]


def fmt(kind: str, value: float | None) -> str:
    """``value`` as text for a metric of ``kind`` (seconds, percent, rate, count, ratio)."""
    if kind == "seconds":
        return scr.format_seconds(value)
    if kind == "percent":
        return scr.format_percent(value)
    if kind == "rate":
        return scr.format_rate(value)
    if kind == "count":
        return scr.format_rate(value, 0)
    return scr.format_rate(value, 2)


def _cell(key: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<td data-key="{html.escape(key)}"{c}>{html.escape(text)}</td>'


def summary_rows(b: bd.Breakdown) -> list[tuple[str, str, str]]:
    """``(key, label, text)`` for every number of the summary table (what ``top`` shows)."""
    realized, predicted = bd.speedups(b)
    own = b.own_drops()
    rows = [
        ("window", "window", f"{b.elapsed_seconds:.1f} s"),
        ("cycles", "cycles", scr.format_rate(b.cycles, 0)),
        ("cycles_per_second", "cycles/s", scr.format_rate(b.cycles_per_second)),
        ("acceptance", "acceptance", scr.format_percent(b.acceptance_rate)),
        ("accept_length", "mean acceptance length (incl. bonus)",
         scr.format_rate(b.mean_acceptance_length, 2)),
        ("accepted_per_draft", "accepted drafts per drafting sequence (excl. bonus)",
         scr.format_rate(b.mean_accept_length, 2)),
        ("positions", "per draft position (from 0)",
         ", ".join(f"{p}: {scr.format_percent(v, 0)}" for p, v in b.position_acceptance)
         or scr.DASH),
        ("tokens_per_second", "emitted tok/s", scr.format_rate(b.emitted_tokens_per_second)),
        ("sequence_tokens_per_second", "tok/s per sequence",
         scr.format_rate(b.sequence_tokens_per_second)),
        ("batch", "mean batch", scr.format_rate(b.mean_batch_size, 2)),
        ("baseline", "baseline tok/s", scr.format_rate(b.baseline_tokens_per_second)),
        ("speedup_realized", "realized speedup",
         f"{realized:.2f}x" if realized is not None else scr.DASH),
        ("speedup_predicted", "predicted speedup (one verify taken for one plain step)",
         ", ".join(f"{v:.2f}x ({clock} clock)" for clock in ("gpu", "host")
                   if (v := predicted.get(clock)) is not None) or scr.DASH),
        ("drops", "drops by specobs", scr.format_rate(b.dropped_total, 0) + (
            " (" + ", ".join(f"{k} {v:.0f}" for k, v in own) + ")" if own else "")),
        ("engine_raised", "cycles the engine raised in (discarded)",
         scr.format_rate(b.engine_raised, 0)),
        ("sampling", "GPU sampling", f"1 in {b.sampling_interval:.0f}"
         if b.sampling_interval is not None else scr.DASH),
        ("overhead", "exporter overhead", scr.format_percent(b.overhead_ratio, 2)),
        ("exporter_cpu", "exporter CPU / cycle",
         scr.format_seconds(b.exporter_cpu_seconds_per_cycle)),
    ]
    return rows


def _phase_table(b: bd.Breakdown, prefix: str = "") -> str:
    head = ("<tr><th>clock</th><th>phase</th><th>per cycle</th><th>share</th><th>p50</th>"
            "<th>p99</th></tr>")
    body = []
    for clock in bd.CLOCKS:
        n = b.cycle_counts.get(clock, 0.0)
        if not n > 0:
            body.append(f'<tr class="no-clock" data-clock="{clock}"><td>{clock}</td>'
                        f'<td colspan="5" class="note">{html.escape(no_clock_text(clock))}'
                        "</td></tr>")
            continue
        for phase in b.phases:
            st = b.stats[(phase, clock)]
            k = f"{prefix}{phase}.{clock}"
            body.append(
                f"<tr><td>{clock}</td><td>{html.escape(phase)}</td>"
                + _cell(f"{k}.mean", scr.format_seconds(st.mean_seconds))
                + _cell(f"{k}.share", scr.format_percent(st.share))
                + _cell(f"{k}.p50", scr.format_seconds(st.p50_seconds))
                + _cell(f"{k}.p99", scr.format_seconds(st.p99_seconds)) + "</tr>"
            )
        p50, p99 = b.cycle_quantiles.get(clock, (None, None))
        k = f"{prefix}cycle.{clock}"
        label = f"cycle ({n:.0f} {'sampled ' if clock == 'gpu' else ''}cycles)"
        body.append(
            f'<tr class="total"><td>{clock}</td><td>{label}</td>'
            + _cell(f"{k}.mean", scr.format_seconds(b.cycle_mean_seconds.get(clock)))
            + "<td></td>" + _cell(f"{k}.p50", scr.format_seconds(p50))
            + _cell(f"{k}.p99", scr.format_seconds(p99)) + "</tr>"
        )
    return f'<table class="phases">{head}{"".join(body)}</table>'


def summary_html(b: bd.Breakdown, prefix: str = "") -> str:
    """The summary table and the phase table of ``b``; cell keys start with ``prefix``."""
    rows = summary_rows(b)
    half = (len(rows) + 1) // 2
    cells = []
    for i in range(half):
        pair = [rows[i]] + ([rows[i + half]] if i + half < len(rows) else [])
        cells.append("<tr>" + "".join(f"<th>{html.escape(label)}</th>" + _cell(prefix + key, text)
                                      for key, label, text in pair) + "</tr>")
    return (f'<div class="summary"><table class="numbers">{"".join(cells)}</table>'
            f"{_phase_table(b, prefix)}</div>")


def compare_table(changes: Sequence[stats.Change], name_a: str, name_b: str) -> str:
    """A comparison's metrics side by side, grouped, with the difference, noise and verdict."""
    head = (f"<tr><th>metric</th><th>{html.escape(name_a)}</th><th>{html.escape(name_b)}</th>"
            "<th>difference</th><th>relative</th><th>noise (±1 SE)</th><th>windows</th>"
            "<th>verdict</th></tr>")
    rows = []
    group = ""
    # A metric neither run has (the gpu clock of CPU runs) is left out, and named once below.
    absent = [c for c in changes if c.a is None and c.b is None]
    for c in changes:
        if c in absent:
            continue
        m = c.metric
        if m.group != group:
            group = m.group
            rows.append(f'<tr><th colspan="8">{html.escape(group)}</th></tr>')
        diff = c.difference
        if m.kind == "percent":
            d_text = "—" if diff is None else f"{diff * 100:+.1f} pp"
            noise = "—" if c.noise is None else f"{c.noise * 100:.1f} pp"
        else:
            d_text = "—" if diff is None else ("+" if diff >= 0 else "-") + fmt(m.kind, abs(diff))
            noise = "—" if c.noise is None else fmt(m.kind, c.noise)
        rel = c.relative
        verdict = c.verdict + (f" of {', '.join(c.explained_by)}" if c.explained_by else "")
        if c.t is not None and c.verdict != "n/a":
            verdict += f" (t={c.t:+.1f})" if math.isfinite(c.t) else " (t=±inf)"
        cls = {"significant": "significant", "consequence": "consequence",
               "load differs": "consequence"}.get(c.verdict, "")
        rows.append(
            f'<tr class="{cls}" data-metric="{m.key}" data-verdict="{c.verdict}">'
            f"<th>{html.escape(m.label)}</th>"
            + _cell(f"a.{m.key}", fmt(m.kind, c.a)) + _cell(f"b.{m.key}", fmt(m.kind, c.b))
            + _cell(f"diff.{m.key}", d_text)
            + _cell(f"rel.{m.key}", "—" if rel is None else f"{rel * 100:+.1f}%")
            + _cell(f"noise.{m.key}", noise)
            + f"<td>{c.windows_a} / {c.windows_b}</td>"
            + f'<td class="verdict">{html.escape(verdict)}</td></tr>'
        )
    if absent:
        gpu = [c for c in absent if "gpu" in c.metric.key]
        text = ("no GPU-clock samples in either run (no CUDA device, or GPU timing off): "
                "its rows are left out" if len(gpu) == len(absent) else
                "in neither run: " + ", ".join(c.metric.label for c in absent))
        rows.append(f'<tr class="no-data"><td colspan="8" class="note">{html.escape(text)}'
                    "</td></tr>")
    return f'<table class="compare">{head}{"".join(rows)}</table>'
