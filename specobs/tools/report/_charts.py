"""The report's charts, plotly figures built from runs (plotly is imported inside each builder):
the cycle breakdown per clock, phase shares and p50/p99, acceptance over time and per draft
position, the accept-length distribution, tokens/s per server and per sequence, speedups, and
health. A clock without samples is a line of text (:func:`section_notes`), never an empty chart.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _scrape as scr
from specobs.tools.report import _data as data

__all__ = ["PHASE_COLORS", "RUN_COLORS", "figures", "no_clock_text", "section_notes"]

PHASE_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")
RUN_COLORS = ("#4c78a8", "#e45756")


def _layout(fig: Any, title: str, y: str, height: int = 320, **kw: Any) -> Any:
    kw.setdefault("margin", {"l": 60, "r": 20, "t": 50, "b": 45})
    kw.setdefault("legend", {"orientation": "h", "y": -0.22})
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"}, template="plotly_white",
        height=height, yaxis_title=y, **kw,
    )
    return fig


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _xs(r: data.Run) -> list[float]:
    return [round(w.end_seconds, 3) for w in r.windows]


def _breakdown_figure(r: data.Run, clock: str, title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, phase in enumerate(r.total.phases):
        ys = [_ms(w.breakdown.stats[(phase, clock)].mean_seconds)
              if (phase, clock) in w.breakdown.stats else None for w in r.windows]
        fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=phase, stackgroup="one", mode="lines",
                                 line={"color": PHASE_COLORS[i % len(PHASE_COLORS)]}))
    return _layout(fig, title, "ms per cycle", xaxis_title="seconds")


def _has_clock(r: data.Run, clock: str) -> bool:
    return r.total.cycle_counts.get(clock, 0.0) > 0


def no_clock_text(clock: str) -> str:
    """The line that stands for the charts of a clock without samples."""
    if clock == "gpu":
        return ("no GPU-clock samples in this run (no CUDA device, or GPU timing off): "
                "host clock only")
    return f"no {clock}-clock samples in this run"


def _phase_share_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    phases = runs[0].total.phases
    rows = [(r, clock) for r in runs for clock in bd.CLOCKS if _has_clock(r, clock)]
    ys = [f"{r.name} · {clock}" if len(runs) > 1 else clock for r, clock in rows]
    for i, phase in enumerate(phases):
        xs = []
        for r, clock in rows:
            st = r.total.stats.get((phase, clock))
            xs.append(None if st is None or st.share is None else st.share * 100)
        fig.add_trace(go.Bar(y=ys, x=xs, name=phase, orientation="h",
                             marker_color=PHASE_COLORS[i % len(PHASE_COLORS)],
                             text=[f"{x:.0f}%" if x is not None else "" for x in xs],
                             textposition="inside", textangle=0))
    # A share too narrow for its label shows none (hover has it), rather than a rotated one.
    fig.update_layout(uniformtext={"minsize": 11, "mode": "hide"})
    fig.update_yaxes(autorange="reversed")  # the first run on top
    return _layout(fig, "Phase share of cycle time", "", height=230 + 40 * len(ys),
                   barmode="stack", xaxis_title="% of cycle time",
                   legend={"orientation": "h", "y": -0.45})


def _quantile_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        for clock in bd.CLOCKS:
            if not r.total.cycle_counts.get(clock, 0) > 0:
                continue
            xs = [*r.total.phases, "cycle"]
            p50 = [_ms(r.total.stats[(p, clock)].p50_seconds) for p in r.total.phases]
            p99 = [_ms(r.total.stats[(p, clock)].p99_seconds) for p in r.total.phases]
            c50, c99 = r.total.cycle_quantiles.get(clock, (None, None))
            tag = f"{r.name} · {clock}" if len(runs) > 1 else clock
            fig.add_trace(go.Bar(x=xs, y=[*p50, _ms(c50)], name=f"p50 {tag}",
                                 marker_color=RUN_COLORS[ri], opacity=0.55))
            fig.add_trace(go.Bar(x=xs, y=[*p99, _ms(c99)], name=f"p99 {tag}",
                                 marker_color=RUN_COLORS[ri]))
    return _layout(fig, "Phase latency p50 / p99", "ms", barmode="group")


def _line_figure(
    runs: Sequence[data.Run], title: str, y: str, getter: Any, scale: float = 1.0,
    hline: float | None = None,
) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        ys = []
        for w in r.windows:
            v = getter(w.breakdown)
            ys.append(None if v is None else v * scale)
        fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=r.name, mode="lines+markers",
                                 line={"color": RUN_COLORS[ri % 2]}))
    if hline is not None:
        fig.add_hline(y=hline, line_dash="dot", line_color="#888")
    return _layout(fig, title, y, xaxis_title="seconds")


def _positions_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        pos = r.total.position_acceptance
        fig.add_trace(go.Bar(x=[f"position {p}" for p, _ in pos],
                             y=[None if v is None else v * 100 for _, v in pos], name=r.name,
                             marker_color=RUN_COLORS[ri % 2]))
    return _layout(fig, "Acceptance per draft position", "% of drafted accepted",
                   barmode="group", yaxis_range=[0, 100],
                   xaxis_title="draft position (0 = the first drafted token, as the engines "
                               "count)")


def draft_length(b: bd.Breakdown) -> int | None:
    """k, the most draft tokens a sequence proposes per cycle: the draft positions the
    per-position counters name (0..k-1, as vLLM's), ``None`` when they name none."""
    positions = [int(p) for p, _ in b.position_acceptance if p.isdigit()]
    return max(positions) + 1 if positions else None


def accept_length_distribution(
    delta: scr.Delta, k: int | None = None
) -> list[tuple[str, float]]:
    """Drafting sequences per number of accepted draft tokens (0..k, the bonus token
    excluded), from the histogram's bucket deltas, non-cumulative.

    The histogram's buckets are 0..k+1 (``catalog.accept_length_buckets``): the one at k+1
    (and +Inf) can never fill, so with ``k`` known the axis ends at k. A bucket above k that
    did fill (a source with another k) is kept, never hidden."""
    buckets: dict[float, float] = {}
    for le, v in delta.counters.by(catalog.ACCEPT_LENGTH.name + "_bucket", "le").items():
        try:
            buckets[float(le)] = v
        except ValueError:
            continue
    out: list[tuple[str, float]] = []
    prev = 0.0
    for i, bound in enumerate(sorted(buckets)):
        count = max(0.0, buckets[bound] - prev)
        prev = buckets[bound]
        label = f"{bound:g}" if math.isfinite(bound) else "more"
        beyond = bound > k if k is not None else bool(i) and not math.isfinite(bound)
        if beyond and count == 0:
            continue
        out.append((label, count))
    return out


def _accept_length_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    ks = {draft_length(r.total) for r in runs} - {None}
    for ri, r in enumerate(runs):
        dist = accept_length_distribution(r.total_delta, draft_length(r.total))
        total = math.fsum(v for _, v in dist) or 1.0
        fig.add_trace(go.Bar(x=[k for k, _ in dist], y=[v / total * 100 for _, v in dist],
                             name=r.name, marker_color=RUN_COLORS[ri % 2]))
    k_text = f", k = {ks.pop()}" if len(ks) == 1 else ""
    fig.update_xaxes(type="category")
    return _layout(fig, "Accept-length distribution", "% of drafting sequence-cycles",
                   barmode="group",
                   xaxis_title=f"accepted draft tokens per sequence-cycle (0..k{k_text}; "
                               "tokens emitted = 1 more, the bonus)")


def _per_server_figure(
    runs: Sequence[data.Run], title: str, y: str, attr: str, baseline: bool = False
) -> Any:
    """One line per run and server of ``Breakdown.attr`` per window; with ``baseline``, the
    non-speculative baseline gauge of each (``specobs_baseline_sequence_tokens_per_second``)
    as a dashed line beside it, or a note where the data holds none."""
    import plotly.graph_objects as go

    fig = go.Figure()
    any_baseline = False
    for ri, r in enumerate(runs):
        for si, server in enumerate(r.servers()):
            per_window = [data.per_server(w.delta, server) for w in r.windows]
            ys = [getattr(b, attr) for b in per_window]
            name = " · ".join(x for x in (r.name if len(runs) > 1 else "", server) if x) \
                or (r.name if not baseline else "speculative")
            fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=name, mode="lines+markers",
                                     line={"color": RUN_COLORS[ri % 2],
                                           "dash": ("solid", "dash", "dot")[si % 3]}))
            base = [b.baseline_tokens_per_second for b in per_window]
            if baseline and any(v is not None for v in base):
                any_baseline = True
                shown = "" if name == "speculative" else f"{name} · "
                fig.add_trace(go.Scatter(
                    x=_xs(r), y=base, name=f"{shown}non-speculative baseline",
                    mode="lines", opacity=0.8, line={"color": RUN_COLORS[ri % 2],
                                                     "dash": "longdash", "width": 3}))
    if baseline and not any_baseline:
        fig.add_annotation(text="no non-speculative baseline in this run", showarrow=False,
                           x=0.5, y=0.95, xref="paper", yref="paper", font={"color": "#888"})
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, title, y, xaxis_title="seconds")


def _speedup_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        tag = f"{r.name} · " if len(runs) > 1 else ""
        sp = [bd.speedups(w.breakdown) for w in r.windows]
        fig.add_trace(go.Scatter(x=_xs(r), y=[s[0] for s in sp], name=f"{tag}realized",
                                 mode="lines+markers", line={"color": RUN_COLORS[ri % 2]}))
        for clock, dash in (("gpu", "dash"), ("host", "dot")):
            ys = [s[1].get(clock) for s in sp]
            if any(v is not None for v in ys):
                fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=f"{tag}predicted ({clock})",
                                         mode="lines", line={"color": RUN_COLORS[ri % 2],
                                                             "dash": dash}))
    if not any(r.total.baseline_tokens_per_second for r in runs):
        fig.add_annotation(text="no baseline configured: realized speedup unknown",
                           showarrow=False, x=0.5, y=0.95, xref="paper", yref="paper",
                           font={"color": "#888"})
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    return _layout(fig, "Speedup: realized vs predicted", "x baseline", xaxis_title="seconds")


def _requests_figure(runs: Sequence[data.Run]) -> Any:
    """The engine's requests running and waiting at each window's end: the load the other
    charts were served under (a queue that grows while tokens/s falls is a server behind)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        tag = f"{r.name} · " if len(runs) > 1 else ""
        for field, dash in (("requests_running", "solid"), ("requests_waiting", "dot")):
            fig.add_trace(go.Scatter(
                x=_xs(r), y=[getattr(w.breakdown, field) for w in r.windows],
                name=tag + field.removeprefix("requests_"), mode="lines+markers",
                line={"color": RUN_COLORS[ri % 2], "dash": dash}))
    return _layout(fig, "Requests running and waiting", "requests", xaxis_title="seconds")


def _has_requests(runs: Sequence[data.Run]) -> bool:
    return any(w.breakdown.requests_running is not None
               or w.breakdown.requests_waiting is not None for r in runs for w in r.windows)


def _health_figure(runs: Sequence[data.Run]) -> Any:
    """Drops, the exporter's CPU per cycle and its overhead, each on its own axis: µs and a
    fraction of a percent on one axis flattened the overhead to zero."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=(
        "dropped records / s", "exporter CPU per cycle (µs)", "exporter overhead (% of cycle)"))
    for ri, r in enumerate(runs):
        tag = f"{r.name} · " if len(runs) > 1 else ""
        colour = RUN_COLORS[ri % 2]
        reasons = sorted({k for w in r.windows for k, _ in w.breakdown.own_drops()})
        lines: list[str | None] = [None, *reasons] if len(reasons) > 1 else [None]
        if any(w.breakdown.engine_raised for w in r.windows):
            lines.append(catalog.DROP_REASON_EXCEPTION)
        for reason in lines:
            ys = [(w.breakdown.dropped_total if reason is None else
                   w.breakdown.drops.get(reason, 0.0)) / (w.breakdown.elapsed_seconds or 1)
                  for w in r.windows]
            name = ("dropped by specobs" if reason is None
                    else "engine raised (discarded)" if reason == catalog.DROP_REASON_EXCEPTION
                    else f"dropped: {reason}")
            fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=tag + name, mode="lines",
                                     line={"color": colour,
                                           "dash": "solid" if reason is None else "dot"}),
                          row=1, col=1)
        fig.add_trace(go.Scatter(
            x=_xs(r), y=[None if w.breakdown.exporter_cpu_seconds_per_cycle is None else
                         w.breakdown.exporter_cpu_seconds_per_cycle * 1e6 for w in r.windows],
            name=f"{tag}CPU µs/cycle", mode="lines", line={"color": colour}), row=1, col=2)
        fig.add_trace(go.Scatter(
            x=_xs(r), y=[None if w.breakdown.overhead_ratio is None else
                         w.breakdown.overhead_ratio * 100 for w in r.windows],
            name=f"{tag}overhead %", mode="lines", line={"color": colour, "dash": "dot"}),
            row=1, col=3)
    fig.update_yaxes(rangemode="tozero")
    fig.update_annotations(font_size=12)
    return _layout(fig, "Drops and exporter health", "", margin={"l": 60, "r": 20, "t": 80,
                                                                  "b": 45})


def figures(runs: Sequence[data.Run]) -> list[tuple[str, str, Any]]:
    """``(id, section, figure)`` in page order."""
    figs: list[tuple[str, str, Any]] = []
    for ri, r in enumerate(runs):
        for clock in bd.CLOCKS:
            # A clock without samples gets a line (section_notes), not an empty chart.
            if not _has_clock(r, clock):
                continue
            tag = f" — {r.name}" if len(runs) > 1 else ""
            figs.append((f"breakdown-{clock}-{ri}", "Cycle breakdown",
                         _breakdown_figure(r, clock, f"Cycle breakdown, {clock} clock{tag}")))
    figs += [
        ("phase-share", "Phases", _phase_share_figure(runs)),
        ("phase-quantiles", "Phases", _quantile_figure(runs)),
        ("acceptance", "Acceptance", _line_figure(
            runs, "Acceptance rate over time", "% of drafted tokens accepted",
            lambda b: b.acceptance_rate, 100.0)),
        ("positions", "Acceptance", _positions_figure(runs)),
        ("accept-length", "Acceptance", _accept_length_figure(runs)),
        ("tokens-server", "Throughput", _per_server_figure(
            runs, "Emitted tokens/s per server", "tokens/s", "emitted_tokens_per_second")),
        ("tokens-sequence", "Throughput", _per_server_figure(
            runs, "Tokens/s per sequence", "tokens/s", "sequence_tokens_per_second",
            baseline=True)),
        ("speedup", "Throughput", _speedup_figure(runs)),
    ]
    if _has_requests(runs):  # an engine that reports none gets no empty chart
        figs.append(("requests", "Throughput", _requests_figure(runs)))
    figs.append(("health", "Health", _health_figure(runs)))
    return figs


def section_notes(runs: Sequence[data.Run]) -> dict[str, str]:
    """Section → one line of HTML under its heading: the clocks a run has no samples of."""
    lines = []
    for clock in bd.CLOCKS:
        missing = [ri for ri, r in enumerate(runs) if not _has_clock(r, clock)]
        if len(runs) > 1 and len(missing) == len(runs):
            text = no_clock_text(clock).replace("in this run", "in either run")
            lines.append(f'<p class="note" data-no-clock="{clock}-all">'
                         f"{html.escape(text)}.</p>")
            continue
        for ri in missing:
            who = f"{html.escape(runs[ri].name)}: " if len(runs) > 1 else ""
            lines.append(f'<p class="note" data-no-clock="{clock}-{ri}">{who}'
                         f"{html.escape(no_clock_text(clock))}.</p>")
    return {"Cycle breakdown": "".join(lines)} if lines else {}
