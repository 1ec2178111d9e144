"""The live terminal summary of ``specobs demo``: numbers from two observer snapshots.

:func:`compute_view` turns the change between two :class:`specobs.Snapshot` reads (plus the
engine's request counts) into a :class:`DemoView`: mean milliseconds per cycle and share of the
cycle for each phase on the GPU and host clocks, acceptance rate, mean accept length, acceptance
by draft position, tokens/s, cycles/s, mean batch size, per-sequence speed and the realized
speedup against the non-speculative baseline. :func:`render_rich` draws it with rich (used inside
``rich.live.Live``); :func:`plain_line` is the one-line form for logs and pipes;
:func:`final_lines` the summary printed at exit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "DemoView",
    "PhaseTime",
    "compute_view",
    "final_lines",
    "plain_line",
    "render_rich",
    "where_lines",
]

CLOCKS = ("gpu", "host")


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """One phase on one clock: mean milliseconds per cycle and share of the cycle (0..1)."""

    ms_per_cycle: float
    share: float


@dataclasses.dataclass(frozen=True)
class DemoView:
    window_seconds: float
    cycles: int
    cycles_total: int
    emitted_total: int
    cycles_per_second: float
    tokens_per_second: float
    acceptance_rate: float | None
    mean_accept_length: float | None
    per_position: tuple[float, ...]
    batch_size_mean: float | None
    phases: dict[str, dict[str, PhaseTime | None]]
    cycle_ms: dict[str, float | None]
    sequence_tokens_per_second: float | None
    baseline_tokens_per_second: float | None
    dropped_total: int
    gpu_sampling_interval: int

    @property
    def speedup(self) -> float | None:
        if self.sequence_tokens_per_second is None or not self.baseline_tokens_per_second:
            return None
        return self.sequence_tokens_per_second / self.baseline_tokens_per_second


def _hist_delta(new: Any, old: Any) -> tuple[int, float, tuple[int, ...]]:
    if old is None:
        return new.count, new.sum, tuple(new.counts)
    counts = tuple(a - b for a, b in zip(new.counts, old.counts, strict=True))
    return new.count - old.count, new.sum - old.sum, counts


def compute_view(
    new: Any, old: Any | None, window_seconds: float, baseline: float | None = None
) -> DemoView:
    """The view of what happened between snapshots ``old`` and ``new`` (``old=None``: since the
    start). ``window_seconds`` is the wall time between them. ``baseline``: the non-speculative
    tokens/s per sequence when the demo measures it (else the observer's configured one)."""
    window = max(window_seconds, 1e-9)

    def d(attr: str) -> int:
        return int(getattr(new, attr) - (getattr(old, attr) if old is not None else 0))

    cycles = d("cycles_total")
    drafted = d("draft_tokens_total")
    accepted = d("accepted_tokens_total")
    emitted = d("emitted_tokens_total")
    seq_count, seq_sum, seq_counts = _hist_delta(
        new.accept_length, old.accept_length if old is not None else None
    )
    k = int(new.max_draft_length)
    per_position = tuple(
        (sum(seq_counts[i + 1 : k + 1]) / seq_count) if seq_count else 0.0 for i in range(k)
    )
    b_count, b_sum, _ = _hist_delta(new.batch_size, old.batch_size if old is not None else None)
    phases: dict[str, dict[str, PhaseTime | None]] = {}
    means: dict[str, dict[str, float]] = {clock: {} for clock in CLOCKS}
    for clock in CLOCKS:
        for phase in new.phases:
            n, s, _ = _hist_delta(
                new.phase(phase, clock), old.phase(phase, clock) if old is not None else None
            )
            if n > 0:
                means[clock][phase] = s / n
    for phase in new.phases:
        phases[phase] = {}
        for clock in CLOCKS:
            total = sum(means[clock].values())
            m = means[clock].get(phase)
            phases[phase][clock] = (
                None if m is None else PhaseTime(m * 1000.0, m / total if total > 0 else 0.0)
            )
    cycle_ms: dict[str, float | None] = {}
    for clock in CLOCKS:
        n, s, _ = _hist_delta(
            new.cycle_histograms[clock],
            old.cycle_histograms[clock] if old is not None else None,
        )
        cycle_ms[clock] = s / n * 1000.0 if n else None
    sequence_speed = None
    host_ms = cycle_ms.get("host")
    if seq_count and host_ms:
        # Tokens one sequence gains per cycle over the wall time of a cycle (prefill excluded).
        sequence_speed = (emitted / seq_count) / (host_ms / 1000.0)
    return DemoView(
        window_seconds=window_seconds,
        cycles=cycles,
        cycles_total=int(new.cycles_total),
        emitted_total=int(new.emitted_tokens_total),
        cycles_per_second=cycles / window,
        tokens_per_second=emitted / window,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accept_length=seq_sum / seq_count if seq_count else None,
        per_position=per_position,
        batch_size_mean=b_sum / b_count if b_count else None,
        phases=phases,
        cycle_ms=cycle_ms,
        sequence_tokens_per_second=sequence_speed,
        baseline_tokens_per_second=(
            baseline if baseline is not None else new.baseline_tokens_per_second
        ),
        dropped_total=int(new.dropped_total()),
        gpu_sampling_interval=int(new.sampling_interval),
    )


def _f(v: float | None, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _phase_cell(p: PhaseTime | None) -> str:
    return "-" if p is None else f"{p.ms_per_cycle:7.2f} ms {p.share:4.0%}"


def plain_line(view: DemoView, *, fault: str | None, requests: str = "") -> str:
    """One line: rates, acceptance and the per-phase split on each clock."""
    parts = [
        f"cycles/s {view.cycles_per_second:6.1f}",
        f"tokens/s {view.tokens_per_second:7.1f}",
        f"acceptance {_f(view.acceptance_rate, '.2f')}",
        f"accept length {_f(view.mean_accept_length, '.2f')}",
        f"batch {_f(view.batch_size_mean, '.1f')}",
        f"speedup {_f(view.speedup, '.2f')}x",
    ]
    for clock in CLOCKS:
        split = [
            f"{phase} {t.ms_per_cycle:.2f} ms ({t.share:.0%})"
            for phase, by_clock in view.phases.items()
            if (t := by_clock[clock]) is not None
        ]
        parts.append(f"{clock}: " + (", ".join(split) if split else "n/a"))
    parts.append(f"fault {fault or 'none'}")
    if requests:
        parts.append(requests)
    return " | ".join(parts)


def where_lines(
    metrics_url: str | None, completions_url: str, target: str | None, *, admin: bool = False
) -> list[str]:
    """Where to point Prometheus and Grafana (and, when admin endpoints are on, faults)."""
    faults = (f"   (faults: POST {completions_url}/admin/fault, with the admin token)" if admin
              else "")
    out = [f"completions  {completions_url}/v1/completions{faults}"]
    if metrics_url:
        out += [
            f"metrics      {metrics_url}",
            "Prometheus   scrape_configs:",
            "               - job_name: specobs",
            "                 scrape_interval: 5s",
            f"                 static_configs: [{{targets: ['{target}']}}]",
            "Grafana      docker compose up -d  (Prometheus, Grafana dashboards, alerts; see "
            "docs/deploy.md), or scripts/stack-local.sh without Docker",
        ]
    else:
        out.append(f"metrics      {completions_url}/metrics (no Prometheus exporter port: "
                   "SPECOBS_EXPORTERS excludes prometheus)")
    return out


def render_rich(
    view: DemoView,
    *,
    title: str,
    fault: str | None,
    requests: str,
    where: list[str],
    baseline_note: str,
) -> Any:
    """A rich renderable of the view (phase table, rates, acceptance, where to look)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    phases = Table(title="cycle breakdown (last window)", expand=False, title_justify="left")
    phases.add_column("phase")
    for clock in CLOCKS:
        phases.add_column(f"{clock} ms/cycle", justify="right")
        phases.add_column(f"{clock} share", justify="right")
    for phase, by_clock in view.phases.items():
        row = [phase]
        for clock in CLOCKS:
            t = by_clock[clock]
            row += ["-", "-"] if t is None else [f"{t.ms_per_cycle:.2f}", f"{t.share:.0%}"]
        phases.add_row(*row)
    total_row = ["cycle"]
    for clock in CLOCKS:
        total_row += [_f(view.cycle_ms[clock], ".2f"), ""]
    phases.add_row(*total_row, style="bold")

    gpu_missing = all(by_clock["gpu"] is None for by_clock in view.phases.values())
    stats = Table.grid(padding=(0, 2))
    stats.add_column(style="bold")
    stats.add_column()
    speed = _f(view.sequence_tokens_per_second, ".1f")
    base = _f(view.baseline_tokens_per_second, ".1f")
    speedup = _f(view.speedup, ".2f")
    rows = [
        ("cycles/s", f"{view.cycles_per_second:.1f}  (total {view.cycles_total})"),
        ("tokens/s", f"{view.tokens_per_second:.1f}  (total {view.emitted_total})"),
        ("acceptance rate", _f(view.acceptance_rate, ".1%")),
        ("mean accept length", f"{_f(view.mean_accept_length, '.2f')} of {len(view.per_position)}"),
        ("by draft position", "  ".join(f"{i + 1}: {p:.0%}" for i, p in
                                        enumerate(view.per_position))),
        ("batch size", _f(view.batch_size_mean, ".1f")),
        ("per-sequence tokens/s", f"{speed}  vs baseline {base} ({baseline_note}): "
                                  f"speedup {speedup}x"),
        ("fault", fault or "none"),
        ("requests", requests),
        ("exporter", f"dropped {view.dropped_total}, " + (
            "no GPU clock (host only)" if gpu_missing
            else f"GPU clock on 1 cycle in {view.gpu_sampling_interval}")),
    ]
    for name, value in rows:
        stats.add_row(name, value)
    notes = []
    if gpu_missing:
        notes.append(Text("no GPU clock on this device: host clock only", style="dim"))
    return Panel(
        Group(phases, *notes, Text(""), stats, Text(""), Text("\n".join(where), style="cyan")),
        title=title,
    )


def final_lines(
    view: DemoView,
    *,
    seconds: float,
    fault: str | None,
    baseline_note: str,
    requests: str,
) -> list[str]:
    """The summary printed when the demo stops (over its whole run)."""
    out = [
        f"specobs demo ran {seconds:.1f} s: {view.cycles_total} cycles, {view.emitted_total} "
        f"tokens ({view.cycles_per_second:.1f} cycles/s, {view.tokens_per_second:.1f} tokens/s)",
        f"  acceptance rate {_f(view.acceptance_rate, '.1%')}, mean accept length "
        f"{_f(view.mean_accept_length, '.2f')} of {len(view.per_position)}, by position "
        + ", ".join(f"{p:.0%}" for p in view.per_position),
        f"  mean batch size {_f(view.batch_size_mean, '.1f')}; per-sequence "
        f"{_f(view.sequence_tokens_per_second, '.1f')} tokens/s vs baseline "
        f"{_f(view.baseline_tokens_per_second, '.1f')} ({baseline_note}): speedup "
        f"{_f(view.speedup, '.2f')}x",
        "  cycle breakdown (mean per cycle, share):",
    ]
    for clock in CLOCKS:
        cells = [
            f"{phase} {t.ms_per_cycle:.2f} ms ({t.share:.0%})"
            for phase, by_clock in view.phases.items()
            if (t := by_clock[clock]) is not None
        ]
        total = view.cycle_ms[clock]
        out.append(
            f"    {clock:4s}: "
            + (", ".join(cells) + f"; cycle {total:.2f} ms" if cells and total else
               "n/a (no GPU clock on this device)" if clock == "gpu" else "n/a")
        )
    out.append(f"  final fault {fault or 'none'}; requests {requests}")
    return out
