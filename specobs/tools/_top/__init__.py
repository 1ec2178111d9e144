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
:mod:`specobs.tools._client`).

The parts: :mod:`._sources` (the endpoint and Prometheus sources, the :class:`Frame`),
:mod:`._views` (the plain, JSON and live views); here the command line, the keys and the loop.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from specobs.tools import _client
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._top._sources import EndpointSource, Frame, PrometheusSource
from specobs.tools._top._sources import _data_frame as _data_frame  # tests build frames
from specobs.tools._top._views import JsonView, LiveView, PlainView, plain_line

__all__ = ["Frame", "LiveView", "add_arguments", "plain_line", "run"]

_PROG = "specobs top"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs top``."""
    _client.add_source_arguments(
        parser, prometheus_help="read from a Prometheus server instead (increase() over --window)")
    parser.add_argument("--selector", default="",
                        help="label matchers for --prometheus, e.g. "
                             "'{job=\"specobs\",instance=\"10.0.0.7:9477\"}'")
    parser.add_argument("--window", default="30s",
                        help="range of increase() with --prometheus (default: 30s)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between polls (default: 2)")
    _client.add_limit_arguments(parser)
    parser.add_argument("--plain", action="store_true",
                        help="one line of text per poll even on a terminal")
    parser.add_argument("--once", action="store_true",
                        help="print one computed frame and exit (same as --count 1)")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="exit after N computed frames (exit 1 if the last poll failed)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per poll, one per line (the breakdown and the "
                             "findings); with --once, one object")


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
        # Not 1, a problem found: a script must tell a missing dependency from a sick server.
        return 2

    stdout = sys.stdout
    plain = args.plain or args.json or not stdout.isatty()
    console: Any = None
    if not plain:
        from rich.console import Console

        console = Console(highlight=False)
        plain = console.is_dumb_terminal or not console.is_terminal
    quit_event = threading.Event()
    limits = _client.limits_from(args)
    with _client.http_client(args) as client:
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
        if _quit_within(quit_event, wait):
            return 0


#: How often the loop looks at the quit flag between polls ('q' quits within this).
_QUIT_CHECK_SECONDS = 0.05


def _quit_within(quit_event: threading.Event, seconds: float) -> bool:
    """Whether 'q' was pressed within ``seconds``. Sleeps in short steps instead of
    ``Event.wait``: a Ctrl-C that lands inside the condition's lock handling there raises
    ``RuntimeError: release unlocked lock`` in place of ``KeyboardInterrupt`` (seen in CI:
    ``top`` then exited 1 with a traceback instead of 130), where ``time.sleep`` is interrupted
    cleanly; ``is_set`` takes no lock."""
    deadline = time.monotonic() + seconds
    while not quit_event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, _QUIT_CHECK_SECONDS))
    return True
