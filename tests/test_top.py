"""``specobs top`` against real parts: a real recorder behind a real PrometheusSink (fake GPU clock,
so every GPU number is exact), a real Prometheus 2.42 scraping it, the command driven in a
pseudo-terminal (tmux and pexpect) with its screen read back, and every kind of bad input.

The engine and bad-server helpers here are shared with tests/test_doctor.py.
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import specobs
from specobs import catalog
from specobs.timing import FakeEventClock, FakeGpu
from specobs.tools import _breakdown as bd
from specobs.tools import _client as bounded
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools import _top
from tests import _hostile_server as _hostile
from tests._hostile_server import hostile_server

__all__ = ["hostile_server"]

ROOT = Path(__file__).resolve().parents[1]
K = 4  # draft length
ACCEPTED = (3, 1)  # accepted draft tokens per sequence: 4 of 8 drafted, 6 emitted per cycle
DRAFT_NS, VERIFY_NS, BOOK_NS = 200_000, 600_000, 100_000


# -- shared helpers -------------------------------------------------------------------------------


class Engine:
    """A real observer and PrometheusSink on a fake GPU, driven step by step (``run``) or by a
    background thread (``start``). GPU phase times are exactly the nanoseconds given."""

    def __init__(
        self,
        port: int = 0,
        *,
        baseline: float | None = None,
        traces: bool = False,
        clock: Any = "fake",
        pool_size: int = 4096,
        **configure: Any,
    ) -> None:
        self.gpu = FakeGpu()
        self.sink = specobs.PrometheusSink(port=port, addr="127.0.0.1")
        sinks: list[specobs.Sink] = [self.sink]
        if traces:
            sinks.append(specobs.MemorySink(traces=True))
            configure.setdefault("trace_head_rate", 1.0)
        self.obs = specobs.configure(
            sinks=sinks,
            clock=FakeEventClock(self.gpu, pool_size=pool_size) if clock == "fake" else clock,
            sample_every=configure.pop("sample_every", 1),
            max_draft_length=K,
            labels={"model": "tiny"},
            baseline_tokens_per_second=baseline,
            poll_interval_seconds=0.01,
            **configure,
        )
        self.draft_ns, self.verify_ns, self.book_ns = DRAFT_NS, VERIFY_NS, BOOK_NS
        self.complete = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.sink.url is not None
        return self.sink.url

    @property
    def port(self) -> int:
        assert self.sink.port is not None
        return self.sink.port

    def cycle(self) -> None:
        gpu = self.gpu
        with self.obs.cycle(batch_size=len(ACCEPTED)) as c:
            gpu.run(self.draft_ns)
            c.mark("verify")
            gpu.run(self.verify_ns)
            c.mark("bookkeeping")
            gpu.run(self.book_ns)
            c.accept(list(ACCEPTED), draft_length=K)
        if self.complete:
            gpu.complete()

    def run(self, n: int) -> None:
        for _ in range(n):
            self.cycle()
        assert self.obs.force_flush(5)

    def start(self, period_seconds: float = 0.004) -> Engine:
        def loop() -> None:
            while not self._stop.is_set():
                self.cycle()
                self._stop.wait(period_seconds)

        self._thread = threading.Thread(target=loop, name="test-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.obs.shutdown(timeout_seconds)


@pytest.fixture
def engines() -> Iterator[Callable[..., Engine]]:
    """Factory of :class:`Engine`; all are shut down at teardown."""
    made: list[Engine] = []

    def make(*args: Any, **kwargs: Any) -> Engine:
        eng = Engine(*args, **kwargs)
        made.append(eng)
        return eng

    try:
        yield make
    finally:
        for eng in made:
            # Short: the HTTP server's own shutdown polls every 0.5 s and finishes on its own
            # thread; nothing here needs the port back.
            eng.stop(timeout_seconds=0.05)


NOT_SPECOBS = (
    "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\n"
    "go_goroutines 12\n# TYPE http_requests_total counter\nhttp_requests_total{code=\"200\"} 7\n"
)
HTML = "<!doctype html>\n<html><head><title>Grafana</title></head><body>hi</body></html>\n"
GARBAGE = "this is { not metrics ]] at all\n\x01\x02 42 forty-two\n"


class BadServer:
    """A stdlib HTTP server answering per path: /html, /garbage, /binary, /500, /other (some
    other exporter's metrics), /empty, and /seq: the text bodies in ``bodies`` one per request
    (the last one repeats), or ``openmetrics`` when the client asks for OpenMetrics. ``hits``
    counts requests per path."""

    def __init__(self) -> None:
        owner = self
        self.bodies: list[str] = [""]
        self.openmetrics: str | None = None
        self.hits: collections.Counter[str] = collections.Counter()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                owner.hits[path] += 1
                status, ctype, data = 200, "text/plain; version=0.0.4", b""
                if path == "/html":
                    ctype, data = "text/html", HTML.encode()
                elif path == "/garbage":
                    data = GARBAGE.encode()
                elif path == "/binary":
                    data = bytes(range(256)) * 4
                elif path == "/500":
                    status, data = 500, b"Internal Server Error: upstream exploded\n"
                elif path == "/other":
                    data = NOT_SPECOBS.encode()
                elif path == "/seq":
                    accept = self.headers.get("Accept", "")
                    if "openmetrics" in accept and owner.openmetrics is not None:
                        ctype = "application/openmetrics-text; version=1.0.0; charset=utf-8"
                        data = owner.openmetrics.encode()
                    else:
                        body = owner.bodies.pop(0) if len(owner.bodies) > 1 else owner.bodies[0]
                        data = body.encode()
                elif path != "/empty":
                    status, data = 404, b"not found\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def bad_server() -> Iterator[BadServer]:
    with contextlib.closing(BadServer()) as server:
        yield server


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("LANG", "C.UTF-8")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Run ``python -m specobs.cli ARGS`` (stdout a pipe, so never a TTY)."""
    return subprocess.run(
        [sys.executable, "-m", "specobs.cli", *args], capture_output=True, text=True,
        timeout=timeout, env=cli_env(), cwd=ROOT, check=False,
    )


def cli_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``specobs ARGS`` in this process (stdout captured, so not a TTY): the same code path
    as the command, without paying an interpreter start per case."""
    from specobs.cli import main

    capsys.readouterr()
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


class LineReader:
    """A long-running ``specobs`` subprocess whose stdout lines are collected by a thread."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specobs.cli", *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=ROOT,
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.lines):
                line = self.lines[seen]
                seen += 1
                if predicate(line):
                    return line
            time.sleep(0.02)
        raise AssertionError("no matching line within {timeout}s; got:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self._thread.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the arithmetic, from a real endpoint ---------------------------------------------------------


def _client() -> httpx.Client:
    return httpx.Client(timeout=5)


def test_breakdown_is_computed_from_deltas_not_lifetime_totals(engines: Callable[..., Engine]):
    eng = engines()
    eng.draft_ns = 100_000
    eng.run(7)
    with _client() as client:
        first = scr.scrape(client, eng.url)
        eng.draft_ns = 300_000  # lifetime mean would be (7*100 + 5*300) / 12 = 183.3 µs
        eng.run(5)
        second = scr.scrape(client, eng.url)
    delta = scr.difference(first, second)
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    assert b.phases == ("draft", "verify", "bookkeeping")
    assert b.cycles == 5
    assert b.cycle_counts == {"gpu": 5, "host": 5}
    draft = b.stats[("draft", "gpu")]
    assert draft.count == 5
    assert draft.mean_seconds == pytest.approx(300e-6)
    assert b.stats[("verify", "gpu")].mean_seconds == pytest.approx(600e-6)
    assert b.stats[("bookkeeping", "gpu")].mean_seconds == pytest.approx(100e-6)
    assert b.cycle_mean_seconds["gpu"] == pytest.approx(1000e-6)
    assert draft.share == pytest.approx(0.3)
    # 300 µs lies in the (250 µs, 500 µs] bucket: interpolated like histogram_quantile.
    assert draft.p50_seconds == pytest.approx(250e-6 + 250e-6 * 0.5)
    assert draft.p99_seconds == pytest.approx(250e-6 + 250e-6 * 0.99)
    assert b.acceptance_rate == pytest.approx(0.5)
    assert b.mean_accept_length == pytest.approx(2.0)
    assert b.position_acceptance == (("0", 1.0), ("1", 0.5), ("2", 0.5), ("3", 0.0))
    assert b.mean_batch_size == pytest.approx(2.0)
    assert b.emitted_tokens_per_second == pytest.approx(30 / delta.elapsed_seconds)
    assert b.cycles_per_second == pytest.approx(5 / delta.elapsed_seconds)
    assert b.sampled_cycles == 5
    assert b.sampling_interval == 1
    assert b.drops == {} and b.dropped_total == 0
    assert b.info["gpu_clock"] == "fake" and b.info["model"] == "tiny"
    # Per-sequence tokens/s: 3 tokens per sequence per cycle over the host cycle time.
    assert b.sequence_tokens_per_second == pytest.approx(3 / b.cycle_mean_seconds["host"])


def test_zero_deltas_give_dashes_not_division_by_zero(engines: Callable[..., Engine]):
    eng = engines()
    eng.run(3)
    with _client() as client:
        first = scr.scrape(client, eng.url)
        second = scr.scrape(client, eng.url)
    delta = scr.difference(first, second)
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    assert b.cycles == 0
    assert b.acceptance_rate is None and b.mean_accept_length is None
    assert b.stats[("draft", "gpu")].mean_seconds is None
    assert b.stats[("draft", "gpu")].p99_seconds is None
    assert b.sequence_tokens_per_second is None
    assert all(v is None for _, v in b.position_acceptance)
    frame = _top._data_frame(b)
    assert "no cycles in the last" in _top.plain_line(frame)
    # The terminal view renders dashes.
    from rich.console import Console

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    view = _top.LiveView("x", 1.0, console)
    console.print(view.render(frame, None))
    console.file.close()
    text = console.export_text()
    assert scr.DASH in text and "no cycles in the last" in text


def test_histogram_quantile_matches_prometheus_rules():
    inf = float("inf")
    cum = {0.1: 0.0, 0.25: 10.0, 0.5: 10.0, inf: 10.0}
    assert bd.histogram_quantile(0.5, cum) == pytest.approx(0.175)
    assert bd.histogram_quantile(0.99, {1.0: 1.0, 2.0: 2.0, inf: 4.0}) == 2.0  # +Inf bucket
    assert bd.histogram_quantile(0.5, {1.0: 2.0, inf: 2.0}) == pytest.approx(0.5)  # from 0
    assert bd.histogram_quantile(0.5, {1.0: 0.0, inf: 0.0}) is None
    assert bd.histogram_quantile(0.5, {}) is None
    assert bd.histogram_quantile(0.5, {1.0: 3.0}) is None  # no +Inf: not a histogram


def test_counter_reset_is_detected_when_the_observer_restarts_on_the_same_port(
    engines: Callable[..., Engine],
):
    eng = engines()
    eng.run(10)
    port = eng.port
    with _client() as client:
        first = scr.scrape(client, eng.url)
        eng.stop()
        again = engines(port=port)
        again.run(2)
        second = scr.scrape(client, again.url)
    result = scr.difference(first, second)
    assert isinstance(result, scr.CounterReset)
    assert "counters reset, rebasing" in str(result)


def test_tools_import_no_heavy_modules():
    code = (
        "import sys, specobs.tools._top, specobs.tools._doctor, specobs.tools._scrape,"
        " specobs.tools._breakdown, specobs.tools._promapi\n"
        "heavy = [m for m in ('httpx', 'rich', 'prometheus_client', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env(), cwd=ROOT, timeout=30)


# -- plain (non-TTY) output -----------------------------------------------------------------------


def test_the_k_in_effect_is_the_draft_length_of_the_interval_s_cycles(
    engines: Callable[..., Engine],
):
    eng = engines()
    eng.run(2)  # k = K from the acceptance, before the interval
    with _client() as client:
        first = scr.scrape(client, eng.url)
        for _ in range(3):  # plain steps: a k = 0 band
            with eng.obs.cycle(batch_size=2, draft_length=0) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept([0, 0], draft_length=0)
        eng.run(1)
        second = scr.scrape(client, eng.url)
    delta = scr.difference(first, second)
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    assert b.mean_draft_length == pytest.approx((3 * 0 + K) / 4)
    assert b.draft_length_shares == (("0", 0.75), (str(K), 0.25))
    line = _top.plain_line(_top._data_frame(b))
    assert f"k=1.00[0:75%,{K}:25%]" in line, line


def test_plain_output_when_stdout_is_not_a_tty(engines: Callable[..., Engine]):
    eng = engines().start()
    result = cli("top", eng.url, "--interval", "0.3", "--count", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    assert "waiting for a second sample" in lines[0]
    for line in lines[1:]:
        assert "clock=gpu" in line
        assert "draft=200.0us(22.2%,p50=175.0us,p99=248.5us)" in line
        assert "verify=600.0us(66.7%,p50=750.0us,p99=995.0us)" in line
        assert "bookkeeping=100.0us(11.1%" in line
        assert "cycle=900.0us" in line
        # vLLM's mean acceptance length (bonus included) first, the accepted drafts beside it.
        assert "accept=50.0%" in line and "accept_len=3.00 accepted_per_draft=2.00" in line
        assert "pos=[100%,50%,50%,0%]" in line
        assert "batch=2.00" in line and "drops=0" in line and "sampling=1/1" in line
    assert result.stderr == ""


def test_json_prints_one_object_per_poll(engines: Callable[..., Engine],
                                         capsys: pytest.CaptureFixture[str]):
    eng = engines().start()
    rc, out, err = cli_here(capsys, "top", eng.url, "--interval", "0.3", "--once", "--json")
    assert rc == 0 and err == "", err
    first, last = (json.loads(line) for line in out.splitlines())
    assert first["kind"] == "waiting" and "breakdown" not in first
    assert last["kind"] == "data"
    b = last["breakdown"]
    assert b["stats"]["draft/gpu"]["mean_seconds"] == pytest.approx(200e-6)
    assert b["stats"]["verify/gpu"]["share"] == pytest.approx(600 / 900)
    assert b["acceptance_rate"] == pytest.approx(0.5)
    assert b["position_acceptance"][0] == ["0", 1.0]
    # The same findings, in doctor --json's shape, and the status line top prints above them.
    assert last["findings"] and all(
        set(f) >= {"code", "severity", "sentence", "evidence", "advice"} for f in last["findings"])
    assert last["status"].split(":")[0].split()[0] in ("OK", "INFO", "WARN", "FAIL")


def test_a_host_clock_only_process_gets_one_line_for_the_gpu_and_its_speedup_in_every_view(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
):
    """On a CPU host (clock=auto, CUDA never initialised) the GPU table of dashes and "GPU
    sampling 1 in 1" said nothing true: one line says why there is no GPU clock. With a
    baseline, the plain line and the JSON carry the speedup as the terminal view does."""
    eng = engines(clock="auto", sample_every=None, baseline=100.0)
    with _client() as client:
        first = scr.scrape(client, eng.url)
        eng.run(20)
        delta = scr.difference(first, scr.scrape(client, eng.url))
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    frame = _top._data_frame(b)
    from rich.console import Console

    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(_top.LiveView("x", 1.0, console).render(frame, None))
    console.file.close()
    text = console.export_text()
    assert ("GPU clock: no sampled cycle in this interval (the process has not initialised "
            "CUDA)") in text
    assert "sampled cycles" not in text and "GPU sampling off (host clock only)" in text
    realized = bd.speedups(b)[0]
    assert realized is not None
    line = _top.plain_line(frame)
    assert "clock=host" in line and "sampling=" not in line
    assert f"baseline=100.0 speedup={realized:.2f}x" in line
    eng.start()
    rc, out, err = cli_here(capsys, "top", eng.url, "--interval", "0.3", "--once", "--json")
    assert rc == 0, err
    last = json.loads(out.splitlines()[-1])["breakdown"]
    assert last["speedup_realized"] == pytest.approx(
        last["sequence_tokens_per_second"] / 100.0)
    assert last["speedup_predicted"]["gpu"] is None and last["speedup_predicted"]["host"] > 0


def test_idle_endpoint_shows_no_cycles(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
):
    eng = engines()
    eng.run(2)
    rc, out, err = cli_here(capsys, "top", eng.url, "--interval", "0.2", "--once")
    assert rc == 0, err
    assert "no cycles in the last" in out.splitlines()[-1]


def _past_a_held_pool(eng: Engine) -> None:
    """Five cycles while the first holds the pool's events (a pool of one cycle's worth): the
    next four are counted without GPU times, ``event_pool_exhausted``."""
    eng.complete = False
    for _ in range(5):
        eng.cycle()
    eng.gpu.complete()
    eng.complete = True
    assert eng.obs.force_flush(5)


def test_drops_are_shown_by_reason(engines: Callable[..., Engine]):
    eng = engines(pool_size=4)  # one cycle's worth of CUDA-like events
    with _client() as client:
        first = scr.scrape(client, eng.url)
        _past_a_held_pool(eng)
        delta = scr.difference(first, scr.scrape(client, eng.url))
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    assert b.drops == {"event_pool_exhausted": 4}
    line = _top.plain_line(_top._data_frame(b))
    assert "drops=4(event_pool_exhausted:4)" in line
    assert b.cycles == 5 and b.cycle_counts == {"gpu": 1, "host": 5}


def test_cycles_the_engine_raised_in_are_shown_apart_from_specobs_drops(
    engines: Callable[..., Engine]
):
    """A cycle the engine raised inside is discarded as ``reason="exception"``: the engine's
    failure. ``top`` does not count it among specobs's drops (what its metrics undercount by,
    as the alert and ``doctor`` read them) and names it on a line of its own."""
    eng = engines(pool_size=4)  # one cycle's worth of CUDA-like events
    with _client() as client:
        first = scr.scrape(client, eng.url)
        for _ in range(3):
            with contextlib.suppress(RuntimeError), eng.obs.cycle(batch_size=2) as c:
                c.mark("verify")
                raise RuntimeError("the engine's step failed")
            eng.gpu.complete()  # a discarded cycle's events return once the GPU passed them
            assert eng.obs.force_flush(5)
        _past_a_held_pool(eng)
        delta = scr.difference(first, scr.scrape(client, eng.url))
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)
    assert b.drops == {"event_pool_exhausted": 4, "exception": 3}
    assert b.dropped_total == 4 and b.engine_raised == 3
    assert b.own_drops() == [("event_pool_exhausted", 4)]
    frame = _top._data_frame(b)
    line = _top.plain_line(frame)
    assert "drops=4(event_pool_exhausted:4) " in line and "engine_raised=3" in line
    from rich.console import Console

    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(_top.LiveView("x", 1.0, console).render(frame, None))
    console.file.close()
    text = console.export_text()
    assert "drops 4 (event_pool_exhausted 4), 80.0% of cycles" in text
    assert "engine raised inside 3 cycles" in text and "the engine's failure" in text
    # The report's summary table reads the same two numbers.
    from specobs.tools.report import _tables

    rows = {key: value for key, _, value in _tables.summary_rows(b)}
    assert rows["drops"] == "4 (event_pool_exhausted 4)" and rows["engine_raised"] == "3"


def test_counter_reset_while_polling_rebases_and_recovers(engines: Callable[..., Engine]):
    eng = engines().start()
    port = eng.port
    top = LineReader(["top", eng.url, "--interval", "0.25"])
    try:
        top.wait_for(lambda line: "draft=200.0us" in line)
        eng.stop()
        fresh = engines(port=port)  # same port, counters from zero, no cycles yet
        top.wait_for(lambda line: "counters reset, rebasing" in line)
        fresh.start()
        top.wait_for(lambda line: "draft=200.0us" in line)
        assert top.proc.poll() is None  # still polling
    finally:
        top.stop()
    assert not any("Traceback" in line for line in top.lines), top.lines


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/html", "the body is HTML, not Prometheus metrics"),
        ("/garbage", "the body is not Prometheus text exposition"),
        ("/binary", "not UTF-8 text"),
        ("/500", "answered HTTP 500 Internal Server Error: Internal Server Error: upstream"),
        ("/other", "is not a specobs endpoint: no specobs_info series among 2 metrics"),
        ("/empty", "is not a specobs endpoint: the body has no metrics at all"),
        ("/missing", "answered HTTP 404"),
    ],
)
def test_bad_bodies_are_one_line_errors_and_polling_goes_on(
    bad_server: BadServer, path: str, expected: str, capsys: pytest.CaptureFixture[str]
):
    rc, out, err = cli_here(capsys, "top", bad_server.url(path), "--interval", "0.05", "--once")
    assert rc == 1
    lines = out.splitlines()
    assert len(lines) == 2, out  # --once: two polls (both failed), then give up
    for line in lines:
        assert "error: " in line and expected in line, line
    assert err == ""


def test_unreachable_url_keeps_polling_with_the_error_shown():
    url = closed_port_url()
    top = LineReader(["top", url, "--interval", "0.1"])
    try:
        for _ in range(3):
            top.wait_for(lambda line: f"error: cannot connect to {url}" in line)
        assert top.proc.poll() is None
    finally:
        top.stop()
    assert not any("Traceback" in line for line in top.lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ftp://127.0.0.1:9477/metrics"], "unsupported URL scheme 'ftp'"),
        (["http://:9477/metrics"], "no host in"),
        (["http://127.0.0.1:99999999/metrics"], "bad port"),
        ([], "give either a specobs /metrics URL or --prometheus URL"),
        (["http://a/metrics", "--prometheus", "http://b"], "exactly one"),
        (["http://a/metrics", "--selector", '{job="x"}'], "--selector only applies"),
        (["--prometheus", "http://b", "--selector", 'job="x"'], "bad selector"),
        (["--prometheus", "http://b", "--window", "soon"], "bad window"),
        (["http://a/metrics", "--interval", "0"], "must be positive"),
        (["http://a/metrics", "--count", "0"], "--count must be at least 1"),
    ],
)
def test_bad_command_lines_exit_2_with_a_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    rc, out, err = cli_here(capsys, "top", *args)
    assert rc == 2, (out, err)
    assert message in err
    assert "Traceback" not in err


def test_bad_url_scheme_exits_2_from_the_command_line():
    result = cli("top", "gopher://127.0.0.1:9477/metrics")
    assert result.returncode == 2
    assert "specobs top: unsupported URL scheme 'gopher'" in result.stderr
    assert "Traceback" not in result.stderr


# -- in a terminal --------------------------------------------------------------------------------


def _tmux(socket_name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", socket_name, "-f", "/dev/null", *args], capture_output=True, text=True,
        timeout=10, check=False,
    )


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_view_in_tmux_reads_back_and_quits_on_q(engines: Callable[..., Engine]):
    eng = engines().start()
    sock = f"specobs-top-{uuid.uuid4().hex[:8]}"
    command = (
        f"env PYTHONPATH={ROOT} LANG=C.UTF-8 {sys.executable} -m specobs.cli top {eng.url} "
        "--interval 0.5; echo EXIT=$? AT=$(date +%s.%N); sleep 60"
    )
    started = _tmux(sock, "new-session", "-d", "-s", "top", "-x", "120", "-y", "45", command)
    assert started.returncode == 0, started.stderr

    def screen() -> str:
        return _tmux(sock, "capture-pane", "-p", "-t", "top").stdout

    expected = ("specobs top", "GPU clock", "host clock", "draft", "verify", "bookkeeping",
                "200.0 µs", "600.0 µs", "100.0 µs", "900.0 µs", "22.2%", "66.7%",
                "acceptance 50.0%", "accept length 3.00 (1 + 2.00)", "mean batch 2.00", "0: 100%",
                "1: 50%", "3: 0%", "GPU sampling 1 in 1", "drops 0", "█")
    try:
        # The view is drawn over several pane updates, so wait for all of it, not its first
        # number; a busy machine can take many seconds to start the interpreter and poll twice.
        deadline = time.monotonic() + 60
        text = screen()
        while not all(word in text for word in expected) and "EXIT=" not in text:
            assert time.monotonic() < deadline, (
                [w for w in expected if w not in text], text)
            time.sleep(0.1)
            text = screen()
        for word in expected:
            assert word in text, (word, text)
        assert "Traceback" not in text
        sent = time.time()
        _tmux(sock, "send-keys", "-t", "top", "q")
        deadline = time.monotonic() + 60
        while (m := re.search(r"EXIT=(\d+) AT=([\d.]+)", screen())) is None:
            assert time.monotonic() < deadline, screen()
            time.sleep(0.05)
        assert m.group(1) == "0", screen()
        # From the key to the shell's echo after top exited (the shell stamps it, so how late
        # this loop reads the pane does not count): q ends the wait for the next poll at once.
        assert float(m.group(2)) - sent < 2.0, (float(m.group(2)) - sent, screen())
    finally:
        _tmux(sock, "kill-server")


@pytest.mark.parametrize("inherited_sigint", ["default", "ignored"])
def test_pty_shows_waiting_first_and_quits_on_ctrl_c(
    engines: Callable[..., Engine], inherited_sigint: str
):
    """Ctrl-C quits whatever SIGINT disposition ``top`` inherits.

    This test used to fail only in some full-suite runs: a suite started where SIGINT is ignored
    (a background job of a shell without job control, a CI runner) hands SIG_IGN down through
    fork and exec, Python then installs no KeyboardInterrupt handler, and the Ctrl-C sent here
    did nothing. The child's disposition is now set explicitly, both ways, and the live view
    takes SIGINT back when it came in ignored.
    """
    pexpect = pytest.importorskip("pexpect")
    eng = engines().start()
    disposition = signal.SIG_IGN if inherited_sigint == "ignored" else signal.SIG_DFL

    def preexec() -> None:
        signal.signal(signal.SIGINT, disposition)

    child = pexpect.spawn(
        sys.executable, ["-m", "specobs.cli", "top", eng.url, "--interval", "0.5"],
        env=cli_env(), cwd=str(ROOT), encoding="utf-8", dimensions=(45, 120), timeout=10,
        preexec_fn=preexec,
    )
    try:
        child.expect("waiting for a second sample")
        child.expect("verify")
        child.expect("600.0 µs")
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=3)
        child.close()
        assert child.exitstatus == 130, child.before  # ended by Ctrl-C; 'q' exits 0
        assert "Traceback" not in (child.before or "")
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_pty_quits_on_q_while_the_endpoint_is_down():
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(
        sys.executable, ["-m", "specobs.cli", "top", closed_port_url(), "--interval", "0.5"],
        env=cli_env(), cwd=str(ROOT), encoding="utf-8", dimensions=(45, 120), timeout=10,
    )
    try:
        child.expect("error: cannot connect to")
        child.send("q")
        child.expect(pexpect.EOF, timeout=3)
        child.close()
        assert child.exitstatus == 0
    finally:
        if child.isalive():
            child.terminate(force=True)


# -- from a real Prometheus -----------------------------------------------------------------------


@pytest.mark.slow
def test_prometheus_mode_against_a_real_prometheus(
    prometheus_server: Callable[..., Any], engines: Callable[..., Engine]
):
    eng = engines(baseline=50.0).start()
    target = f"127.0.0.1:{eng.port}"
    server = prometheus_server([target])
    server.wait_for_target_up(timeout_seconds=20)
    selector = f'{{job="specobs",instance="{target}"}}'
    name = catalog.CYCLES.name
    server.wait_for(f"increase({name}{selector}[5s])",
                    lambda r: bool(r) and float(r[0]["value"][1]) > 0, timeout_seconds=20)

    result = cli("top", "--prometheus", server.url, "--selector", selector, "--window", "5s",
                 "--once")
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.splitlines()[-1]
    assert "clock=gpu" in line
    assert "draft=200.0us(22.2%" in line and "verify=600.0us(66.7%" in line
    assert "cycle=900.0us" in line
    assert "accept=50.0%" in line and "accept_len=3.00" in line and "batch=2.00" in line
    assert "pos=[100%,50%,50%,0%]" in line

    # Our bucket interpolation agrees with Prometheus's own histogram_quantile.
    with httpx.Client(timeout=5) as client:
        delta = pa.prometheus_delta(client, server.url, f'job="specobs",instance="{target}"',
                                     5.0)
    b = bd.breakdown(delta)
    hist = catalog.PHASE_DURATION.name
    for q, ours in ((0.5, b.stats[("verify", "gpu")].p50_seconds),
                    (0.99, b.stats[("verify", "gpu")].p99_seconds)):
        theirs = server.query(
            f'histogram_quantile({q}, sum by (le) (increase({hist}_bucket{{job="specobs",'
            f'phase="verify",clock="gpu"}}[5s])))'
        )
        assert ours == pytest.approx(float(theirs[0]["value"][1]), rel=1e-6)
    assert b.baseline_tokens_per_second == 50.0

    # A selector that matches nothing, and a URL that is no Prometheus: one-line errors.
    bad = cli("top", "--prometheus", server.url, "--selector", '{job="nope"}', "--once",
              "--interval", "0.05")
    assert bad.returncode == 1
    assert 'has no specobs_info{job="nope"}' in bad.stdout
    not_prom = cli("top", "--prometheus", eng.url.removesuffix("/metrics"), "--once",
                   "--interval", "0.05")
    assert not_prom.returncode == 1
    assert "is not a Prometheus server" in not_prom.stdout
    assert "Traceback" not in bad.stdout + bad.stderr + not_prom.stdout + not_prom.stderr


# -- hostile endpoints: bounded time and memory ---------------------------------------------------

HOSTILE_TIMEOUT = 1.0
#: Two polls of at most one deadline each, plus the interpreter's start-up on a loaded machine.
WALL_BOUND_SECONDS = 2 * HOSTILE_TIMEOUT + 8.0
#: The unbounded command reached 5.3 GB in 15 s on the endless body; ~40-75 MB now.
RSS_BOUND_MB = 160.0
OVER_CAP = "sent a body larger than 16 MiB (after decompression)"
TOO_SLOW = f"did not finish answering within {HOSTILE_TIMEOUT:g} s"
TOP_HOSTILE_CASES = [
    ("endless", OVER_CAP),
    ("slowdrip", TOO_SLOW),
    ("slowheaders", TOO_SLOW),
    ("gzipbomb", OVER_CAP),
    ("hugeline", OVER_CAP),
    ("garbage", "sent a body that is not UTF-8 text"),
]


def measured_top(*args: str) -> _hostile.Measured:
    return _hostile.run_measured(
        ["top", *args, "--plain", "--timeout", str(HOSTILE_TIMEOUT)], env=cli_env(),
        cwd=str(ROOT), kill_after=30,
    )


@pytest.mark.parametrize(("mode", "expected"), TOP_HOSTILE_CASES,
                         ids=[c[0] for c in TOP_HOSTILE_CASES])
def test_hostile_endpoint_costs_a_failed_poll_not_a_hang(
    hostile_server: _hostile.HostileServer, mode: str, expected: str
):
    before = hostile_server.hits[mode]
    url = hostile_server.url(f"/{mode}")
    m = measured_top(url, "--once", "--interval", "0.05")
    assert m.returncode == 1, m
    lines = m.output.splitlines()
    assert len(lines) == 2, m  # --once: two polls (both failed), then give up
    for line in lines:
        assert f"error: {url} {expected}" in line, m
        assert len(line) < 300
    assert m.seconds < WALL_BOUND_SECONDS, m
    assert m.peak_rss_mb < RSS_BOUND_MB, m
    assert hostile_server.hits[mode] - before == 2  # one request per poll


@pytest.mark.parametrize(("mode", "expected"), TOP_HOSTILE_CASES[:4],
                         ids=[c[0] for c in TOP_HOSTILE_CASES[:4]])
def test_hostile_prometheus_costs_a_failed_poll_not_a_hang(
    hostile_server: _hostile.HostileServer, mode: str, expected: str
):
    before = hostile_server.hits[mode]
    base = hostile_server.url(f"/{mode}")
    m = measured_top("--prometheus", base, "--once", "--interval", "0.05")
    assert m.returncode == 1, m
    (line,) = m.output.splitlines()
    assert f"error: cannot query Prometheus at {base}: {base}/api/v1/query {expected}" in line, m
    assert m.seconds < HOSTILE_TIMEOUT + 8.0, m
    assert m.peak_rss_mb < RSS_BOUND_MB, m
    assert hostile_server.hits[mode] - before == 1  # the poll's first query fails it


def test_the_gzip_bomb_inflates_no_further_than_the_cap(hostile_server: _hostile.HostileServer):
    """In-process, under tracemalloc: zlib's output is bounded per chunk, so the peak stays near
    the cap (httpx's own decoder inflates each 64 KiB read whole: ~64 MB at a time)."""
    limits = bounded.Limits(timeout_seconds=10, max_bytes=1024 * 1024)
    with httpx.Client(timeout=10) as client:
        tracemalloc.start()
        try:
            with pytest.raises(scr.ScrapeError, match=r"larger than 1 MiB \(after decompression"):
                bounded.get(client, hostile_server.url("/gzipbomb"), limits=limits)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("mode", ["slowdrip", "slowheaders", "silent"])
def test_the_deadline_holds_for_any_client(hostile_server: _hostile.HostileServer, mode: str):
    """A caller's own keep-alive client with a long per-read timeout: the deadline still cuts
    the request at 0.5 s (the timer shuts the socket down), not after 30 s of reads."""
    limits = bounded.Limits(timeout_seconds=0.5)
    with httpx.Client(timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(scr.ScrapeError, match=r"did not finish answering within 0.5 s"):
            bounded.get(client, hostile_server.url(f"/{mode}"), limits=limits)
        elapsed = time.monotonic() - started
    # Cut at the deadline: far below the 30 s a read-by-read timeout would allow, with room
    # for a loaded machine.
    assert 0.5 <= elapsed < 0.5 + 8.0, elapsed


def test_a_small_gzip_body_is_inflated(engines: Callable[..., Engine]):
    eng = engines()
    eng.run(2)
    with httpx.Client(timeout=5) as client:
        got = bounded.get(client, eng.url)
        plain = client.get(eng.url, headers={"Accept-Encoding": "identity"}).content
    assert got.status_code == 200
    assert got.headers.get("content-encoding") == "gzip"  # prometheus_client compressed it
    cycles = catalog.CYCLES.name
    assert scr.parse_exposition(got.body.decode()).total(cycles) == 2
    # Same exposition (the exporter's own CPU counter moves between the two scrapes).
    assert [line.split(" ")[0] for line in got.body.decode().splitlines()] == \
        [line.split(" ")[0] for line in plain.decode().splitlines()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1048576", 1048576), ("16MiB", 16 * 2**20), ("500k", 500 * 1024), ("2 MB", 2_000_000),
     ("1.5KiB", 1536), ("1g", 2**30)],
)
def test_byte_sizes(text: str, expected: int):
    assert bounded.parse_byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1", "0", "12 parsecs"])
def test_bad_byte_sizes(text: str):
    with pytest.raises(ValueError, match="size"):
        bounded.parse_byte_size(text)
