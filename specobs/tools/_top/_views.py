"""How ``specobs top`` shows a :class:`Frame`: one plain line or one JSON object per interval,
or the live terminal view (bars, sparklines, the status line)."""


from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, TextIO

from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools import _engine_series as es
from specobs.tools import _scrape as scr
from specobs.tools._top import _requests
from specobs.tools._top._sources import Frame, status_text

__all__ = ["ENGINE_FIELDS", "JsonView", "LiveView", "PlainView", "bar", "frame_json",
           "plain_line", "spark"]

#: The breakdown's fields a server's engine series give (the rest needs the plugin).
ENGINE_FIELDS = frozenset({
    "elapsed_seconds", "acceptance_rate", "mean_accept_length", "position_acceptance",
    "emitted_tokens_per_second", "requests_running", "requests_waiting",
})
_BAR_WIDTH = 16
_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARK = " ▁▂▃▄▅▆▇█"

# -- plain output ---------------------------------------------------------------------------------


def _no_gpu_clock(b: bd.Breakdown) -> bool:
    """The process times on the host clock only (``gpu_clock`` "none", or "auto" without CUDA)
    and sampled nothing on the GPU in this interval."""
    return b.info.get("gpu_clock") in ("none", "auto") and not b.cycle_counts.get("gpu")


def _gpu_clock_why(b: bd.Breakdown) -> str:
    clock = b.info.get("gpu_clock")
    if clock == "none":
        return "configured for the host clock"
    if clock == "auto":
        return "the process has not initialised CUDA"
    return f"gpu clock {clock}: events pending, or this interval sampled none"


def _sampling_text(b: bd.Breakdown) -> str:
    if _no_gpu_clock(b):
        return "GPU sampling off (host clock only)"
    return "GPU sampling 1 in " + (
        f"{b.sampling_interval:.0f}" if b.sampling_interval is not None else scr.DASH)


def _plain_clock(b: bd.Breakdown) -> str:
    return "gpu" if b.cycle_counts.get("gpu", 0) > 0 else "host"


def plain_line(frame: Frame, now: float | None = None) -> str:
    """One line of text for one poll (the non-terminal output)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    b = frame.breakdown
    if frame.kind != "data" or b is None:
        label = {"error": "error: ", "reset": "", "waiting": ""}.get(frame.kind, "")
        return f"{stamp} {label}{frame.message}"
    if frame.engine is not None:
        return _engine_line(stamp, frame, b)
    if not b.cycles > 0:
        return f"{stamp} {frame.message}"
    us = True
    clock = _plain_clock(b)
    parts = [stamp, f"clock={clock}"]
    for phase in b.phases:
        st = b.stats[(phase, clock)]
        parts.append(
            f"{phase}={scr.format_seconds(st.mean_seconds, us)}"
            f"({scr.format_percent(st.share)},p50={scr.format_seconds(st.p50_seconds, us)},"
            f"p99={scr.format_seconds(st.p99_seconds, us)})"
        )
    parts.append(f"cycle={scr.format_seconds(b.cycle_mean_seconds.get(clock), us)}")
    if clock == "gpu":
        parts.append(f"host_cycle={scr.format_seconds(b.cycle_mean_seconds.get('host'), us)}")
    if b.gap_count:  # the time between cycles, and its share of the busy time
        parts.append(f"between={scr.format_seconds(b.gap_mean_seconds, us)}"
                     f"({scr.format_percent(b.gap_share)})")
    pos = ",".join(scr.format_percent(v, 0) for _, v in b.position_acceptance)
    parts += [
        f"cycles/s={scr.format_rate(b.cycles_per_second)}",
        f"accept={scr.format_percent(b.acceptance_rate)}",
        f"accept_len={scr.format_rate(b.mean_acceptance_length, 2)}",
        f"accepted_per_draft={scr.format_rate(b.mean_accept_length, 2)}",
        f"pos=[{pos}]",
        f"tok/s={scr.format_rate(b.emitted_tokens_per_second)}",
        f"batch={scr.format_rate(b.mean_batch_size, 2)}",
    ]
    if b.draft_length_shares:
        ks = ",".join(f"{k}:{scr.format_percent(v, 0)}" for k, v in b.draft_length_shares)
        parts.append(f"k={scr.format_rate(b.mean_draft_length, 2)}[{ks}]")
    if b.baseline_tokens_per_second is not None:
        parts += [f"baseline={scr.format_rate(b.baseline_tokens_per_second)}",
                  f"speedup={scr.format_rate(bd.speedups(b)[0], 2, 'x')}"]
    parts.append(f"drops={scr.format_rate(b.dropped_total, 0)}")
    own = b.own_drops()
    if own:
        parts[-1] += "(" + ",".join(f"{k}:{v:.0f}" for k, v in own) + ")"
    if b.engine_raised:
        parts.append(f"engine_raised={b.engine_raised:.0f}")
    if b.sampling_interval is not None and not _no_gpu_clock(b):
        parts.append(f"sampling=1/{b.sampling_interval:.0f}")
    if frame.requests is not None:
        parts.append(_requests.plain_text(frame.requests))
    if frame.findings:
        parts.append(_status(frame.findings))
    return " ".join(parts)


def _status(findings: tuple[dg.Finding, ...]) -> str:
    level = dg.worst(findings)
    codes = [f.code for f in findings if f.severity == level]
    return f"status={level}({','.join(codes)})" if level in ("warn", "fail") else "status=ok"


def _engine_line(stamp: str, frame: Frame, b: bd.Breakdown) -> str:
    """The plain line of a server read through its engine's own series: what it gives, and
    what needs the plugin named as such (never a zero)."""
    pos = ",".join(scr.format_percent(v, 0) for _, v in b.position_acceptance)
    parts = [
        stamp, f"source={es.SOURCE}", f"engine={frame.engine}", f"instance={frame.instance}",
        f"accept={scr.format_percent(b.acceptance_rate)}",
        f"accept_len={scr.format_rate(b.mean_acceptance_length, 2)}",
        f"pos=[{pos}]" if pos else "pos=[none exported]",
        f"tok/s={scr.format_rate(b.emitted_tokens_per_second)}",
    ]
    if b.requests_running is not None or b.requests_waiting is not None:
        parts.append(f"requests={scr.format_rate(b.requests_running, 0)}"
                     f"+{scr.format_rate(b.requests_waiting, 0)}waiting")
    needs = ",".join(name.replace(" ", "_") for name, _ in es.NEEDS_PLUGIN)
    parts.append(f"{needs}={es.NEEDS_PLUGIN_TEXT.replace(' ', '_')}")
    if frame.findings:
        parts.append(_status(frame.findings))
    return " ".join(parts)


class PlainView:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def show(self, frame: Frame, last: Frame | None) -> None:
        self.stream.write(plain_line(frame) + "\n")
        self.stream.flush()


def frame_json(frame: Frame, now: float | None = None) -> dict[str, Any]:
    """One poll as JSON: its kind and message, the breakdown (per-phase statistics keyed
    ``phase/clock``) and the findings (``specobs doctor --json``'s shape)."""
    out: dict[str, Any] = {"time": time.time() if now is None else now, "kind": frame.kind,
                           "message": frame.message}
    b = frame.breakdown
    if b is not None:
        out["breakdown"] = b.as_json()
    out["source"] = es.SOURCE if frame.engine is not None else "plugin"
    if frame.engine is not None:
        out["engine"], out["instance"] = frame.engine, frame.instance
        # What only the plugin measures is left out of the breakdown (a cycle count of 0
        # would read as a stall), and named here instead.
        if b is not None:
            out["breakdown"] = {k: v for k, v in out["breakdown"].items() if k in ENGINE_FIELDS}
            out["breakdown"]["mean_acceptance_length"] = b.mean_acceptance_length
        out["needs_plugin"] = [name for name, _ in es.NEEDS_PLUGIN]
    out["requests"] = (None if frame.requests is None
                       else dataclasses.asdict(frame.requests))
    out["status"] = status_text(frame.findings) if frame.findings else None
    out["findings"] = [dataclasses.asdict(f) for f in frame.findings]
    return out


class JsonView(PlainView):
    """``--json``: one JSON object per poll, one per line."""

    def show(self, frame: Frame, last: Frame | None) -> None:
        self.stream.write(json.dumps(frame_json(frame), default=_json_default) + "\n")
        self.stream.flush()


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return str(value)


# -- terminal output ------------------------------------------------------------------------------


def bar(value: float | None, scale: float | None, width: int = _BAR_WIDTH) -> str:
    """A horizontal bar of ``width`` cells, ``value/scale`` full, in eighths of a cell."""
    if value is None or scale is None or not scale > 0 or not value > 0:
        return " " * width
    eighths = round(min(1.0, value / scale) * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[rest] if rest else "")
    return text.ljust(width)


def spark(value: float | None) -> str:
    if value is None:
        return " "
    return _SPARK[max(0, min(8, round(value * 8)))]


class LiveView:
    """A ``rich.live.Live`` redrawn once per poll (no auto refresh: nothing to animate)."""

    def __init__(self, description: str, interval: float, console: Any) -> None:
        self.description = description
        self.interval = interval
        self.console = console
        self._live: Any = None

    def __enter__(self) -> LiveView:
        from rich.live import Live

        self._live = Live(
            console=self.console, auto_refresh=False, transient=False,
            redirect_stdout=False, redirect_stderr=False, vertical_overflow="visible",
        )
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def show(self, frame: Frame, last: Frame | None) -> None:
        self._live.update(self.render(frame, last), refresh=True)

    def render(self, frame: Frame, last: Frame | None) -> Any:
        from rich.console import Group
        from rich.text import Text

        shown = frame if frame.breakdown is not None else last
        b = shown.breakdown if shown is not None else None
        header = Text()
        header.append("specobs top", style="bold")
        header.append(f"  {self.description}  every {self.interval:g} s  ")
        header.append(time.strftime("%H:%M:%S"), style="dim")
        header.append("  q quits", style="dim")
        parts: list[Any] = [header]
        if b is not None and b.info:
            info = b.info
            consts = " ".join(
                f"{k}={v}" for k, v in sorted(info.items())
                if k not in ("version", "phases", "gpu_clock", "sampling")
            )
            parts.append(Text(
                f"specobs {info.get('version', '?')}  gpu clock {info.get('gpu_clock', '?')}"
                f"  sampling {info.get('sampling', '?')}  {consts}".rstrip(), style="dim",
            ))
        status = frame.message
        if frame.kind == "error":
            parts.append(Text(f"error: {status}", style="bold red"))
        elif frame.kind == "reset":
            parts.append(Text(status, style="bold yellow"))
        elif status:
            parts.append(Text(status, style="yellow"))
        if shown is not None and shown.findings:
            level = dg.worst(shown.findings)
            style = {"fail": "bold red", "warn": "bold yellow"}.get(level, "green")
            parts.append(Text(f"status {status_text(shown.findings)}", style=style))
        if b is not None and shown is not None and shown.engine is not None:
            parts += self._engine_body(b, shown)
        elif b is not None:
            parts += self._body(b)
        requests = frame.requests if frame.breakdown is not None else (
            last.requests if last is not None else None)
        if b is not None and requests is not None:
            parts.append(Text(_requests.live_text(requests)))
        return Group(*parts)

    def _engine_body(self, b: bd.Breakdown, frame: Frame) -> list[Any]:
        """A server read through its engine's own series: its figures, and a line for each
        figure only the plugin measures."""
        from rich.table import Table
        from rich.text import Text

        out: list[Any] = [Text(f"{frame.engine}'s own series at {frame.instance}: no specobs "
                               "plugin", style="bold")]
        grid = Table.grid(padding=(0, 3))
        for _ in range(3):
            grid.add_column(no_wrap=True)
        grid.add_row(
            f"acceptance {scr.format_percent(b.acceptance_rate)}",
            f"accept length {scr.format_rate(b.mean_acceptance_length, 2)}",
            f"emitted {scr.format_rate(b.emitted_tokens_per_second)} tok/s",
        )
        grid.add_row(
            f"requests running {scr.format_rate(b.requests_running, 0)}",
            f"waiting {scr.format_rate(b.requests_waiting, 0)}", "",
        )
        out.append(grid)
        if b.position_acceptance:
            line = Text("per position ")
            line.append("".join(spark(v) for _, v in b.position_acceptance), style="green")
            line.append("  " + "  ".join(
                f"{p}: {scr.format_percent(v, 0)}" for p, v in b.position_acceptance))
            out.append(line)
        else:
            out.append(Text("per position: the engine exports none", style="dim"))
        for name, what in es.NEEDS_PLUGIN:
            out.append(Text(f"{name}: {es.NEEDS_PLUGIN_TEXT} ({what})", style="dim"))
        return out

    def _body(self, b: bd.Breakdown) -> list[Any]:
        from rich.text import Text

        means = [v for v in b.cycle_mean_seconds.values() if v is not None]
        scale = max(means) if means else None
        out: list[Any] = []
        for clock in bd.CLOCKS:
            n = b.cycle_counts.get(clock, 0.0)
            if clock == "gpu" and not n:
                # One line, not a table of dashes: a CPU host, or no sampled cycle this time.
                out.append(Text(f"GPU clock: no sampled cycle in this interval "
                                f"({_gpu_clock_why(b)})", style="dim"))
                continue
            out.append(_clock_table(b, clock, n, scale))
            out.append(Text(""))
        out.append(_figures(b))
        out.extend(_tail(b))
        return out


def _clock_table(b: bd.Breakdown, clock: str, n: float, scale: float | None) -> Any:
    """One clock's table: each phase per cycle with its bar, share and quantiles, the cycle,
    and on the host clock the time between cycles."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    title = (
        f"GPU clock: {n:.0f} sampled cycles" if clock == "gpu"
        else f"host clock: {n:.0f} cycles"
    )
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, title=title,
                  title_justify="left", title_style="bold", pad_edge=False,
                  padding=(0, 1))
    table.add_column("phase")
    table.add_column("per cycle", justify="right")
    table.add_column("", width=_BAR_WIDTH, no_wrap=True)
    table.add_column("share", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    style = "cyan" if clock == "gpu" else "magenta"
    for phase in b.phases:
        st = b.stats[(phase, clock)]
        table.add_row(
            phase, scr.format_seconds(st.mean_seconds),
            Text(bar(st.mean_seconds, scale), style=style),
            scr.format_percent(st.share),
            scr.format_seconds(st.p50_seconds), scr.format_seconds(st.p99_seconds),
        )
    p50, p99 = b.cycle_quantiles.get(clock, (None, None))
    mean = b.cycle_mean_seconds.get(clock)
    table.add_row(
        Text("cycle", style="bold"), scr.format_seconds(mean),
        Text(bar(mean, scale), style="dim"), "", scr.format_seconds(p50),
        scr.format_seconds(p99),
    )
    if clock == "host" and b.gap_count:
        # Outside the cycles (the engine's scheduler, Python between steps): the share
        # is of the gaps plus the host cycle time.
        table.add_row(
            Text("between cycles", style="dim"), scr.format_seconds(b.gap_mean_seconds),
            Text(bar(b.gap_mean_seconds, scale), style="dim"),
            scr.format_percent(b.gap_share), scr.format_seconds(b.gap_median_seconds),
            scr.format_seconds(b.gap_p99_seconds),
        )
    return table


def _figures(b: bd.Breakdown) -> Any:
    """The grid of the interval's figures: acceptance, rates, batch, baseline, overhead."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 3))
    for _ in range(3):
        grid.add_column(no_wrap=True)
    grid.add_row(
        f"acceptance {scr.format_percent(b.acceptance_rate)}",
        # vLLM's mean acceptance length: the bonus token plus the accepted drafts.
        f"accept length {scr.format_rate(b.mean_acceptance_length, 2)} "
        f"(1 + {scr.format_rate(b.mean_accept_length, 2)})",
        f"emitted {scr.format_rate(b.emitted_tokens_per_second)} tok/s",
    )
    grid.add_row(
        f"cycles {scr.format_rate(b.cycles_per_second)}/s",
        f"mean batch {scr.format_rate(b.mean_batch_size, 2)}",
        f"per sequence {scr.format_rate(b.sequence_tokens_per_second)} tok/s",
    )
    grid.add_row(
        f"baseline {scr.format_rate(b.baseline_tokens_per_second)} tok/s, speedup "
        f"{scr.format_rate(bd.speedups(b)[0], 2, 'x')}"
        if b.baseline_tokens_per_second is not None else "no baseline",
        _sampling_text(b),
        f"overhead {scr.format_percent(b.overhead_ratio, 2)}",
    )
    return grid


def _tail(b: bd.Breakdown) -> list[Any]:
    """The lines under the figures: k in effect, acceptance by position, drops, and cycles the
    engine raised inside."""
    from rich.text import Text

    out: list[Any] = []
    if b.draft_length_shares:
        out.append(Text(
            f"k in effect {scr.format_rate(b.mean_draft_length, 2)}  " + "  ".join(
                f"k={k}: {scr.format_percent(v, 0)}" for k, v in b.draft_length_shares)
            + " of cycles"))
    if b.position_acceptance:
        line = Text("per position ")
        line.append("".join(spark(v) for _, v in b.position_acceptance), style="green")
        line.append("  " + "  ".join(
            f"{p}: {scr.format_percent(v, 0)}" for p, v in b.position_acceptance
        ))
        out.append(line)
    own = b.own_drops()
    if own:
        drops = ", ".join(f"{k} {v:.0f}" for k, v in own)
        out.append(Text(
            f"drops {b.dropped_total:.0f} ({drops}), "
            f"{scr.format_percent(bd.ratio(b.dropped_total, b.cycles))} of cycles",
            style="yellow",
        ))
    else:
        out.append(Text("drops 0", style="dim"))
    if b.engine_raised:
        out.append(Text(
            f"engine raised inside {b.engine_raised:.0f} cycles "
            f"({scr.format_percent(bd.ratio(b.engine_raised, b.cycles))} of cycles), "
            "discarded: the engine's failure, see its log",
            style="yellow",
        ))
    return out
