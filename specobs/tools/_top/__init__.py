"""``specobs top``: a live cycle breakdown in the terminal.

    specobs top http://127.0.0.1:9477/metrics
    specobs top --prometheus http://prometheus:9090 --selector '{instance="gpu7:9477"}'

Every ``--interval`` seconds it polls the source and redraws: per-phase mean time per cycle on the
GPU and host clocks as bars, each phase's share, p50/p99 (interpolated inside histogram buckets
like ``histogram_quantile``), acceptance rate, mean accept length, per-position acceptance,
emitted tokens/s, mean batch size, drops by reason, the GPU sampling interval, the speedup over
the baseline, and a status line: the diagnosis of the interval (:mod:`specobs.tools._diagnosis`,
docs/diagnosis.md) as its worst severity, the codes that carry it and the worst finding's
sentence (``status=`` in the plain line). Every number is
computed from counter deltas between two polls (or ``increase()`` over ``--window`` when the
source is Prometheus), never from lifetime totals; the first frame of a direct endpoint waits for
a second sample.

On a terminal it uses ``rich`` and reads keys in cbreak mode on a small thread (q quits; so does
Ctrl-C). When stdout is not a terminal (or with ``--plain``) it prints one line per poll.
``--once`` / ``--count N`` stop after that many computed frames, for scripts; ``--json`` prints
one JSON object per poll instead (the breakdown and the findings).

A poll that fails (refused connection, HTTP error, a page that is not specobs metrics, a counter
that went down because the server restarted, a body serving a sample twice) shows a one-line
message and polling goes on. Credentials in a URL are sent as HTTP Basic authentication and never
shown.
Each poll fetches the endpoint once (or runs one query per series against Prometheus); every
request has one deadline, ``--timeout`` seconds from connecting to the last byte, and reads at
most ``--max-bytes`` of body after decompression (default 16 MiB), so an endpoint that never
stops sending, trickles, or sends a gzip bomb costs one failed poll, not a hang (see
:mod:`specobs.tools._http`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools import _http
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr

__all__ = ["add_arguments", "run"]

_PROG = "specobs top"
_BAR_WIDTH = 16
_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARK = " ▁▂▃▄▅▆▇█"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs top``."""
    parser.add_argument("url", nargs="?", default=None,
                        help="a specobs /metrics URL, e.g. http://127.0.0.1:9477/metrics "
                             "(host:port means http://host:port/metrics)")
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help="read from a Prometheus server instead (increase() over --window)")
    parser.add_argument("--selector", default="",
                        help="label matchers for --prometheus, e.g. "
                             "'{job=\"specobs\",instance=\"10.0.0.7:9477\"}'")
    parser.add_argument("--window", default="30s",
                        help="range of increase() with --prometheus (default: 30s)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between polls (default: 2)")
    _http.add_limit_arguments(parser)
    parser.add_argument("--plain", action="store_true",
                        help="one line of text per poll even on a terminal")
    parser.add_argument("--once", action="store_true",
                        help="print one computed frame and exit (same as --count 1)")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="exit after N computed frames (exit 1 if the last poll failed)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per poll, one per line (the breakdown and the "
                             "findings); with --once, one object")


# -- sources --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """What one poll produced: ``kind`` is data, waiting, reset or error."""

    kind: str
    message: str = ""
    breakdown: bd.Breakdown | None = None
    #: The diagnosis of this poll's interval (docs/diagnosis.md): the status line.
    findings: tuple[dg.Finding, ...] = ()


class EndpointSource:
    """Polls a specobs /metrics endpoint and differences consecutive scrapes."""

    def __init__(self, client: Any, url: str, limits: _http.Limits = _http.DEFAULT_LIMITS
                 ) -> None:
        self.client = client
        self.url = url
        self.limits = limits
        self.description = _http.display_url(url)
        self._prev: scr.Scrape | None = None

    def poll(self) -> Frame:
        try:
            cur = scr.scrape(self.client, self.url, limits=self.limits)
        except scr.ScrapeError as exc:
            return Frame("error", str(exc))
        prev, self._prev = self._prev, cur
        if prev is None:
            return Frame("waiting", "waiting for a second sample")
        delta = scr.difference(prev, cur)
        if isinstance(delta, scr.CounterReset):
            return Frame("reset", str(delta))
        window = dg.window(delta, time.time())
        return _data_frame(window.breakdown, tuple(dg.diagnose(window)))


class PrometheusSource:
    """Queries ``increase(...[window])`` from a Prometheus server on every poll."""

    def __init__(self, client: Any, base_url: str, selector: str, window_seconds: float,
                 limits: _http.Limits = _http.DEFAULT_LIMITS) -> None:
        self.client = client
        self.limits = limits
        self.base_url = base_url
        self.selector = selector
        self.window_seconds = window_seconds
        self.description = (
            f"{_http.display_url(base_url)} {{{selector}}} over "
            f"{scr.format_rate(window_seconds, 0)}s"
        )

    def poll(self) -> Frame:
        try:
            delta = pa.prometheus_delta(
                self.client, self.base_url, self.selector, self.window_seconds,
                limits=self.limits,
            )
        except scr.ScrapeError as exc:
            return Frame("error", str(exc))
        if not delta.counters.has(catalog.CYCLES.name):
            return Frame(
                "waiting",
                f"waiting for Prometheus to hold two samples of {catalog.CYCLES.name} in "
                f"the last {scr.format_rate(self.window_seconds, 0)} s",
            )
        window = dg.window(delta, time.time())
        return _data_frame(window.breakdown, tuple(dg.diagnose(window)))


def _data_frame(b: bd.Breakdown, findings: tuple[dg.Finding, ...] = ()) -> Frame:
    if not b.cycles > 0:
        stalled = next((f for f in findings if f.code == "SPEC-STALL"), None)
        if stalled is not None:
            return Frame("data", stalled.sentence, b, findings)
        return Frame("data", f"no cycles in the last {b.elapsed_seconds:.1f} s (idle?)", b,
                     findings)
    return Frame("data", "", b, findings)


def status_text(findings: tuple[dg.Finding, ...]) -> str:
    """The status line: the worst severity, the codes that carry it and the worst finding's
    sentence (``OK: no problem found`` when nothing warns or fails)."""
    line = dg.status_line(findings)
    worst = dg.worst(findings)
    first = next((f for f in findings if f.severity == worst), None)
    if first is None or worst not in ("warn", "fail"):
        return line
    return f"{line}: {first.sentence}"


# -- plain output ---------------------------------------------------------------------------------


def _plain_clock(b: bd.Breakdown) -> str:
    return "gpu" if b.cycle_counts.get("gpu", 0) > 0 else "host"


def plain_line(frame: Frame, now: float | None = None) -> str:
    """One line of text for one poll (the non-terminal output)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    b = frame.breakdown
    if frame.kind != "data" or b is None:
        label = {"error": "error: ", "reset": "", "waiting": ""}.get(frame.kind, "")
        return f"{stamp} {label}{frame.message}"
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
    pos = ",".join(scr.format_percent(v, 0) for _, v in b.position_acceptance)
    parts += [
        f"cycles/s={scr.format_rate(b.cycles_per_second)}",
        f"accept={scr.format_percent(b.acceptance_rate)}",
        f"accept_len={scr.format_rate(b.mean_acceptance_length, 2)}",
        f"accepted_per_draft={scr.format_rate(b.mean_accept_length, 2)}",
        f"pos=[{pos}]",
        f"tok/s={scr.format_rate(b.emitted_tokens_per_second)}",
        f"batch={scr.format_rate(b.mean_batch_size, 2)}",
        f"drops={scr.format_rate(b.dropped_total, 0)}",
    ]
    if b.drops:
        parts[-1] += "(" + ",".join(f"{k}:{v:.0f}" for k, v in sorted(b.drops.items())) + ")"
    if b.sampling_interval is not None:
        parts.append(f"sampling=1/{b.sampling_interval:.0f}")
    if frame.findings:
        level = dg.worst(frame.findings)
        codes = [f.code for f in frame.findings if f.severity == level]
        parts.append(f"status={level}({','.join(codes)})" if level in ("warn", "fail")
                     else "status=ok")
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
        if b is not None:
            parts += self._body(b)
        return Group(*parts)

    def _body(self, b: bd.Breakdown) -> list[Any]:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        means = [v for v in b.cycle_mean_seconds.values() if v is not None]
        scale = max(means) if means else None
        out: list[Any] = []
        for clock in bd.CLOCKS:
            n = b.cycle_counts.get(clock, 0.0)
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
            out.append(table)
            out.append(Text(""))

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
            "GPU sampling 1 in "
            + (f"{b.sampling_interval:.0f}" if b.sampling_interval is not None else scr.DASH),
            f"overhead {scr.format_percent(b.overhead_ratio, 2)}",
        )
        out.append(grid)
        if b.position_acceptance:
            line = Text("per position ")
            line.append("".join(spark(v) for _, v in b.position_acceptance), style="green")
            line.append("  " + "  ".join(
                f"{p}: {scr.format_percent(v, 0)}" for p, v in b.position_acceptance
            ))
            out.append(line)
        if b.drops:
            drops = ", ".join(f"{k} {v:.0f}" for k, v in sorted(b.drops.items()))
            out.append(Text(
                f"drops {b.dropped_total:.0f} ({drops}), "
                f"{scr.format_percent(bd.ratio(b.dropped_total, b.cycles))} of cycles",
                style="yellow",
            ))
        else:
            out.append(Text("drops 0", style="dim"))
        return out


# -- keys -----------------------------------------------------------------------------------------


class KeyReader:
    """Reads single keys from a terminal in cbreak mode on a daemon thread; q sets ``quit``.

    cbreak (not raw) keeps ISIG, so Ctrl-C still raises KeyboardInterrupt in the main thread.
    The terminal's settings are restored on exit, whatever happened.
    """

    def __init__(self, stream: TextIO, quit_event: threading.Event) -> None:
        self.stream = stream
        self.quit = quit_event
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: Any = None
        self._fd = -1

    def __enter__(self) -> KeyReader:
        try:
            import termios
            import tty

            fd = self.stream.fileno()
            if not os.isatty(fd):
                return self
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        except (ImportError, OSError, ValueError, AttributeError):
            self._saved = None
            return self
        self._fd = fd
        self._thread = threading.Thread(target=self._read, name="specobs-top-keys", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        fd = self._fd
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    continue
                ch = os.read(fd, 1)
            except (OSError, ValueError):
                return
            if not ch:  # the terminal went away
                return
            if ch in (b"q", b"Q"):
                self.quit.set()
                return

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._saved is not None:
            import termios

            try:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            except (OSError, termios.error):
                pass


# -- the loop -------------------------------------------------------------------------------------


def _usage(message: str) -> int:
    print(f"{_PROG}: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """``specobs top``; see the module docstring."""
    if (args.url is None) == (args.prometheus is None):
        return _usage("give either a specobs /metrics URL or --prometheus URL (exactly one)")
    try:
        if args.prometheus is not None:
            target = scr.normalize_url(args.prometheus, default_path="")
        else:
            target = scr.normalize_url(args.url)
        selector = pa.normalize_selector(args.selector)
        window = pa.parse_window(args.window)
    except ValueError as exc:
        return _usage(str(exc))
    if not (0 < args.interval < math.inf) or not (0 < args.timeout < math.inf):
        return _usage("--interval and --timeout must be positive numbers of seconds")
    if args.count is not None and args.count < 1:
        return _usage(f"--count must be at least 1, got {args.count}")
    if args.selector and args.prometheus is None:
        return _usage("--selector only applies with --prometheus")
    count = 1 if args.once else args.count
    try:
        import httpx  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
        import rich  # noqa: F401
    except ImportError as exc:
        print(f"{_PROG}: {exc.name or exc} is missing: pip install 'specobs[cli,prometheus]'",
              file=sys.stderr)
        return 1

    stdout = sys.stdout
    plain = args.plain or args.json or not stdout.isatty()
    console: Any = None
    if not plain:
        from rich.console import Console

        console = Console(highlight=False)
        plain = console.is_dumb_terminal or not console.is_terminal
    quit_event = threading.Event()
    limits = _http.limits_from(args)
    with _http.http_client(args) as client:
        source: EndpointSource | PrometheusSource
        if args.prometheus is not None:
            source = PrometheusSource(client, target, selector, window, limits)
        else:
            source = EndpointSource(client, target, limits)
        view: PlainView | LiveView = (
            JsonView(stdout) if args.json else PlainView(stdout) if plain
            else LiveView(source.description, args.interval, console)
        )
        try:
            with (
                KeyReader(sys.stdin, quit_event) if not plain else _nothing(),
                _ctrl_c_interrupts() if not plain else _nothing(),
                view,
            ):
                return _loop(source, view, args.interval, count, quit_event)
        except KeyboardInterrupt:
            return 130  # the shell's convention for a command ended by SIGINT ('q' is 0)
        except BrokenPipeError:
            # `specobs top ... | head`: the reader left; quietly stop.
            try:
                # Python flushes stdout at exit; point it somewhere that cannot raise.
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            return 0


@contextlib.contextmanager
def _ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C quits the live view even when SIGINT came in ignored.

    A process started with SIGINT ignored (by a script's ``trap '' INT``, a CI runner, a
    background job of a shell without job control) keeps it ignored, and Python then installs no
    KeyboardInterrupt handler: the terminal's Ctrl-C would do nothing. The live view owns the
    terminal and promises that Ctrl-C quits, so it takes SIGINT back for its lifetime.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _loop(
    source: EndpointSource | PrometheusSource,
    view: PlainView | LiveView,
    interval: float,
    count: int | None,
    quit_event: threading.Event,
) -> int:
    # With --count, a direct endpoint needs one extra poll (the first only sets the baseline);
    # failed polls count too, so a script against a dead server ends instead of waiting forever.
    polls_left = None if count is None else count + (1 if isinstance(source, EndpointSource)
                                                     else 0)
    frames = 0
    last: Frame | None = None
    while True:
        started = time.monotonic()
        frame = source.poll()
        view.show(frame, last)
        if frame.breakdown is not None:
            last = frame
            frames += 1
        if polls_left is not None:
            polls_left -= 1
            if frames >= (count or 0) or polls_left <= 0:
                return 0 if frame.kind == "data" else 1
        wait = max(0.0, interval - (time.monotonic() - started))
        if quit_event.wait(wait):
            return 0
