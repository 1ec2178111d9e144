"""``specobs report`` end to end: two REAL ``specobs demo`` processes (healthy and
``--fault wrong-hidden-layers``, run side by side so they share the machine's noise), a real
Prometheus 2.42 scraping both, the report command sampling them live (and saving snapshots),
reading them back from the file, and reading Prometheus over a time range. The HTML files are
opened in headless Chromium (Debian ``chromium``, driven over the DevTools protocol on a pipe):
no console errors, every chart drawn (its title in the DOM, its plot area partly in the
report's trace colours, which the same charts emptied of traces are not), and no request leaves
the file. The summary table must equal ``specobs top``'s numbers for the same window, and
``--compare`` must flag the acceptance drop and nothing else.

Wall time on the 2-core CI machine: about 60 s for the module (both demos start from the shared
weight cache of tests/conftest.py).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("plotly")
pytest.importorskip("torch")
pytest.importorskip("fastapi")

from specobs import cli  # noqa: E402
from specobs.tools import _breakdown as bd  # noqa: E402
from specobs.tools import _promapi as pa  # noqa: E402
from specobs.tools import _scrape as scr  # noqa: E402
from specobs.tools.report import _charts as charts  # noqa: E402
from specobs.tools.report import _stats as stats  # noqa: E402
from tests._prometheus_server import PrometheusServer, free_port  # noqa: E402
from tests.test_diagnosis_report import chart_problems  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLE_SECONDS = 16
#: The charts of a report of these CPU demos: no GPU clock, so no gpu-clock breakdown (a line
#: of text says so instead).
CHART_TITLES = {
    "Cycle breakdown, host clock", "Phase share of cycle time",
    "Phase latency p50 / p99", "Acceptance rate over time", "Acceptance per draft position",
    "Accept-length distribution", "Emitted tokens/s per server", "Tokens/s per sequence",
    "Speedup: realized vs predicted", "Requests running and waiting",
    "Drops and exporter health",
}


# -- headless Chromium over the DevTools protocol -------------------------------------------------


#: Run in every page before its own scripts: when the page's inlined plotly.js defines
#: ``window.Plotly``, keep the promise of every ``Plotly.newPlot`` call in
#: ``window.__specobsPlots``. Plotly resolves it when the figure is drawn; the report sets no
#: signal of its own.
_PLOTLY_HOOK = """
window.__specobsPlots = [];
Object.defineProperty(window, "Plotly", {configurable: true, get() { return undefined; },
  set(plotly) {
    Object.defineProperty(window, "Plotly", {value: plotly, writable: true, configurable: true});
    const newPlot = plotly.newPlot;
    plotly.newPlot = function (...args) {
      const drawn = newPlot.apply(this, args);
      window.__specobsPlots.push(drawn);
      return drawn;
    };
  }});
"""


class Chromium:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated
    JSON): no websocket library and no port."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            pytest.skip("chromium is not on PATH; scripts/install installs Debian's chromium")
        self.width = width
        self.profile = tempfile.mkdtemp(prefix="specobs-chromium-")
        ours_r, theirs_w = os.pipe()
        theirs_r, ours_w = os.pipe()

        def child_fds() -> None:
            os.dup2(theirs_r, 3)
            os.dup2(theirs_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--hide-scrollbars", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(theirs_r)
        os.close(theirs_w)
        self.rfile = os.fdopen(ours_r, "rb", buffering=0)
        self.wfile = os.fdopen(ours_w, "wb", buffering=0)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")
        self.session = self.call("Target.attachToTarget", targetId=target["targetId"],
                                 flatten=True)["sessionId"]
        for method in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
            self.call(method, session=True)
        self.call("Page.addScriptToEvaluateOnNewDocument", session=True, source=_PLOTLY_HOOK)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width,
                  height=height, deviceScaleFactor=1, mobile=False)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self.buf:
            chunk = self.rfile.read(1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        message, self.buf = self.buf.split(b"\0", 1)
        result: dict[str, Any] = json.loads(message)
        return result

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.wfile.write(json.dumps(message).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                result: dict[str, Any] = m.get("result", {})
                return result
            self.events.append(m)

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expression,
                      returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, path: Path, timeout_seconds: float = 60) -> None:
        self.events.clear()
        nav = self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        assert "errorText" not in nav, nav
        deadline = time.monotonic() + timeout_seconds
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert time.monotonic() < deadline, "the page did not load"
            self.events.append(self._read())

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:300])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args"))[:300])
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", "")[:300])
        return out

    def requested(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self) -> Any:
        from PIL import Image

        height = int(self.evaluate("document.documentElement.scrollHeight"))
        shot = self.call("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": self.width, "height": height,
                               "scale": 1})
        return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.rfile.close()
        self.wfile.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    with closing(Chromium()) as b:
        yield b


# -- two real demos, a real Prometheus, the reports -----------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Demo:
    def __init__(self, directory: Path, name: str, *extra: str) -> None:
        self.metrics_port = free_port()
        self.log = directory / f"demo-{name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specobs.cli", "demo", "--plain", "--duration", "300",
                 "--port", str(free_port()), "--metrics-port", str(self.metrics_port),
                 "--baseline-tokens-per-second", "100", *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def wait_cycling(self, timeout_seconds: float = 240) -> None:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                body = httpx.get(self.url, timeout=2).text
                m = re.search(r"^specobs_cycles_total(?:\{[^}]*\})? (\S+)", body, re.M)
                if m and float(m.group(1)) > 50:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the demo did not cycle: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Reports:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.healthy = Demo(directory, "healthy")
        self.faulty = Demo(directory, "faulty", "--fault", "wrong-hidden-layers")
        self.prometheus: PrometheusServer | None = None
        try:
            self.healthy.wait_cycling()
            self.faulty.wait_cycling()
            self.prometheus = PrometheusServer(
                [self.healthy.target, self.faulty.target], directory=directory / "prometheus")
            self.prometheus.wait_for_target_up(timeout_seconds=20)
            # The real command line, both endpoints sampled at once, snapshots saved.
            self.compare_html = directory / "ab.html"
            self.sampled = subprocess.run(
                [sys.executable, "-m", "specobs.cli", "report", "--compare", self.healthy.url,
                 self.faulty.url, "--duration", str(SAMPLE_SECONDS), "--interval", "2",
                 "--save", str(directory / "run.jsonl"), "--names", "healthy",
                 "wrong-hidden-layers", "-o", str(self.compare_html)],
                capture_output=True, text=True, env=_env(), timeout=120,
            )
            # Written, and B's acceptance drop is a regression: exit 3, named on stderr.
            assert self.sampled.returncode == 3, self.sampled.stderr
            assert self.compare_html.exists()
            assert self.sampled.stderr.splitlines()[-1].startswith(
                "specobs report: wrong-hidden-layers regressed against healthy: acceptance rate "
            ), self.sampled.stderr
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        self.healthy.stop()
        self.faulty.stop()


@pytest.fixture(scope="module")
def reports() -> Iterator[Reports]:
    shutil.which("prometheus") or pytest.skip("Debian's prometheus is not installed")
    with tempfile.TemporaryDirectory(prefix="specobs-report-") as d:
        r = Reports(Path(d))
        try:
            yield r
        finally:
            r.close()


def report(*args: str) -> tuple[int, str, str]:
    """``specobs report ARGS`` in this process; returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        status = cli.main(["report", *args])
    finally:
        sys.stdout, sys.stderr = old
    return status, out.getvalue(), err.getvalue()


def cells(text: str) -> dict[str, str]:
    """``data-key`` → cell text of a report."""
    return {k: html.unescape(v) for k, v in re.findall(r'<td data-key="([^"]+)"[^>]*>(.*?)</td>',
                                                        text)}


def _norm(text: str) -> str:
    return text.replace(" ", "").replace("µs", "us")


# -- the tests ------------------------------------------------------------------------------------


def _hex_rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


#: The colours the report draws its traces in (lines, stacked areas, bars). Everything else in a
#: plot area is grey or nearly so: the white background, grid and zero lines, the dotted
#: reference lines and the annotations ("no baseline", #888).
TRACE_COLOURS = frozenset(_hex_rgb(c) for c in (*charts.PHASE_COLORS, *charts.RUN_COLORS))
#: The least share of a chart's plot area in trace colours for the chart to count as drawn. The
#: sparsest real chart, one 2 px line across the plot, covers about 0.8 %; the same charts with
#: their traces removed cover 0 % (checked on every page, _check_page).
MIN_TRACE_SHARE = 0.002


def _is_trace_colour(pixel: tuple[int, int, int]) -> bool:
    """``pixel`` is a trace colour drawn over the white background at an opacity from 0.4 to 1:
    the solid colour, an area fill or the p50 bars (opacity 0.5 and 0.55), an anti-aliased edge.
    Measured as ink (255 minus the channel) along the colour's ink direction."""
    ink = [255 - v for v in pixel]
    for colour in TRACE_COLOURS:
        full = [255 - v for v in colour]
        opacity = sum(i * f for i, f in zip(ink, full, strict=True)) / sum(f * f for f in full)
        off = sum((i - opacity * f) ** 2 for i, f in zip(ink, full, strict=True)) ** 0.5
        if 0.4 <= opacity <= 1.05 and off < 10:
            return True
    return False


def _trace_shares(image: Any, charts: list[dict[str, Any]]) -> dict[str, float]:
    """Chart title → the share of its plot areas' pixels (every subplot's) in trace colours."""
    shares = {}
    for c in charts:
        hits = pixels = 0
        for x, y, w, h in c["plots"]:
            region = image.crop((round(x), round(y), round(x + w), round(y + h)))
            n = region.width * region.height
            pixels += n
            hits += sum(k for k, rgb in region.getcolors(n) if _is_trace_colour(rgb))
        shares[c["title"]] = hits / pixels
    return shares


#: Resolves once every chart of the page is drawn and painted: each ``Plotly.newPlot`` promise
#: (kept by _PLOTLY_HOOK), the fonts, then two animation frames, so the screenshot is of a frame
#: laid out after the last draw.
_DRAWN = ("Promise.all(window.__specobsPlots).then(() => document.fonts.ready).then(() => new "
          "Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(window."
          "__specobsPlots.length)))))")
#: Every chart: its title as plotly drew it and its subplots' plot areas in page pixels.
_CHARTS = (
    "[...document.querySelectorAll('.chart')].map(c => {const r = c.getBoundingClientRect(); "
    "const t = c.querySelector('.gtitle'); return {title: c.dataset.title, drawn: t ? "
    "t.textContent : null, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height, "
    "svg: c.querySelectorAll('svg.main-svg').length, plots: [...c.querySelectorAll("
    "'.draglayer .nsewdrag')].map(d => {const b = d.getBoundingClientRect(); return [b.left + "
    "scrollX, b.top + scrollY, b.width, b.height]})}})"
)


def _check_page(browser: Chromium, path: Path, expected_titles: set[str]) -> list[str]:
    browser.open(path)
    drawn = browser.evaluate(_DRAWN)
    charts: list[dict[str, Any]] = browser.evaluate(_CHARTS)
    assert drawn == len(charts) > 0, (drawn, len(charts))  # every chart went through newPlot
    assert browser.errors() == []
    # Nothing but the file itself is requested: the report needs no network.
    assert [u for u in browser.requested() if not u.startswith(("file:", "data:"))] == []
    titles = [c["drawn"] for c in charts]
    for c in charts:
        assert c["drawn"] == c["title"], c  # plotly rendered the title into the DOM
        assert c["svg"] >= 1 and c["w"] > 300 and c["h"] > 250, c
        assert c["plots"] and all(w > 100 and h > 50 for _, _, w, h in c["plots"]), c
    assert {re.sub(r" — .*$", "", t) for t in titles} == expected_titles
    # The figures the page embeds: none empty, none flattened by a shared axis, the
    # accept-length axis 0..k, the baseline beside the per-sequence speed.
    assert chart_problems(path.read_text()) == []
    assert re.search(r'data-no-clock="gpu-(0|all)"', path.read_text())  # CPU: a line, no chart
    # Each chart drew its data: lines, areas or bars in the trace colours cover a share of its
    # plot area.
    shares = _trace_shares(browser.screenshot(), charts)
    assert all(s > MIN_TRACE_SHARE for s in shares.values()), shares
    # The criterion tells an empty chart: the same charts, layout and annotations kept, with
    # their traces removed, have no trace colour anywhere in their plot areas.
    assert browser.evaluate(
        "Promise.all([...document.querySelectorAll('.js-plotly-plot')].map(gd => "
        "Plotly.react(gd, [], gd.layout))).then(ps => new Promise(r => requestAnimationFrame("
        "() => requestAnimationFrame(() => r(ps.length)))))") == len(charts)
    empty = _trace_shares(browser.screenshot(), browser.evaluate(_CHARTS))
    assert all(s < MIN_TRACE_SHARE / 10 for s in empty.values()), empty
    # The summary table is on the first screen, above every chart.
    table_y = browser.evaluate("document.querySelector('table').getBoundingClientRect().top")
    assert table_y < 900 and all(c["y"] > table_y for c in charts)
    return titles


def test_live_sampling_shows_progress_and_saves_snapshots(reports: Reports) -> None:
    err = reports.sampled.stderr
    assert f"sampling {reports.healthy.url}" in err and f"sampling {reports.faulty.url}" in err
    assert "samples" in err
    for suffix in ("a", "b"):
        lines = (reports.dir / f"run-{suffix}.jsonl").read_text().splitlines()
        assert json.loads(lines[0])["format"] == "specobs-snapshots"
        # One scrape every 2 s over the duration, plus the first.
        assert len(lines) - 1 == SAMPLE_SECONDS // 2 + 1
        rows = [json.loads(line) for line in lines[1:]]
        assert all("samples" in r for r in rows)
        assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
        # The terminal says where each run's snapshots went, and how to report from them.
        path = reports.dir / f"run-{suffix}.jsonl"
        assert f"  snapshots saved to {path} (specobs report --from {path})" in (
            reports.sampled.stdout.splitlines())


def test_report_from_a_file_of_a_real_demo_renders_in_chromium(
    reports: Reports, browser: Chromium
) -> None:
    out = reports.dir / "healthy.html"
    status, stdout, stderr = report("--from", str(reports.dir / "run-a.jsonl"), "-o", str(out))
    assert status == 0, stderr
    text = out.read_text()
    # plotly.js is inlined (megabytes); that nothing else is fetched is checked in the browser.
    assert len(text) > 2_000_000 and text.count("Plotly.newPlot(") >= len(CHART_TITLES)
    titles = _check_page(browser, out, CHART_TITLES)
    assert len(titles) == len(CHART_TITLES)
    # The same snapshots give the same summary as the healthy side of the comparison.
    single, both = cells(text), cells(reports.compare_html.read_text())
    for key in ("acceptance", "accept_length", "tokens_per_second", "verify.host.mean",
                "cycle.host.p99", "speedup_realized"):
        assert single[key] == both[f"a.{key}"], key
    assert float(single["acceptance"].rstrip("%")) > 40


def test_compare_flags_the_acceptance_drop_and_nothing_else(
    reports: Reports, browser: Chromium
) -> None:
    text = reports.compare_html.read_text()
    verdicts = dict(re.findall(r'data-metric="([^"]+)" data-verdict="([^"]+)"', text))
    groups = {m.key: m.group for m in stats.metric_defs(
        ["draft", "verify", "bookkeeping"], ["0", "1", "2", "3"])}
    findings = re.findall(r'data-finding="([^"]+)"', text)
    assert "acceptance" in findings and "position_0" in findings
    assert {groups[k] for k in findings} == {"acceptance"}, verdicts
    for key, verdict in verdicts.items():
        if groups[key] in ("timing", "health"):
            assert verdict in ("no change", "n/a"), (key, verdict)
        if groups[key] == "throughput":
            assert verdict in ("consequence", "no change", "n/a"), (key, verdict)
    assert verdicts["acceptance"] == "significant"
    assert verdicts["sequence_tokens_per_second"] in ("consequence", "no change")
    c = cells(text)
    assert float(c["b.acceptance"].rstrip("%")) < 0.7 * float(c["a.acceptance"].rstrip("%"))
    titles = _check_page(browser, reports.compare_html, CHART_TITLES)
    # Both runs get their own breakdown chart (the host clock's: these are CPU runs).
    assert sum(t.startswith("Cycle breakdown") for t in titles) == 2


def test_json_carries_the_summary_findings_and_verdicts_with_the_same_exit(
    reports: Reports, tmp_path: Path
) -> None:
    a, b = str(reports.dir / "run-a.jsonl"), str(reports.dir / "run-b.jsonl")
    status, stdout, stderr = report("--from", a, "--json", "-o", str(tmp_path / "a.html"))
    assert status == 0, stderr
    one = json.loads(stdout)  # nothing else on stdout
    assert one["output"] == str(tmp_path / "a.html") and (tmp_path / "a.html").exists()
    (run,) = one["runs"]
    assert run["breakdown"]["cycles"] > 0 and run["windows"] >= 2
    assert 0.4 < run["breakdown"]["acceptance_rate"] <= 1
    assert "verify/host" in run["breakdown"]["stats"]
    assert {f["severity"] for f in one["findings"]} <= {"ok", "info", "warn", "fail"}
    assert one["findings"] and all(f["code"].startswith("SPEC-") for f in one["findings"])

    status, stdout, stderr = report("--compare", a, b, "--json", "-o", str(tmp_path / "ab.html"))
    assert status == 3, stderr  # REGRESSION_EXIT, as without --json
    both = json.loads(stdout)
    assert len(both["runs"]) == 2 and "acceptance" in both["regressions"]
    verdicts = {c["key"]: c["verdict"] for c in both["changes"]}
    assert verdicts["acceptance"] == "significant"
    accept = next(c for c in both["changes"] if c["key"] == "acceptance")
    assert accept["b"] < 0.7 * accept["a"]


#: The Prometheus window the report's summary and ``specobs top`` are compared over, and the
#: report's step (one chart point per step).
WINDOW_SECONDS = 12
STEP_SECONDS = 3


def _complete_window_end(
    prometheus: PrometheusServer, target: str, timeout_seconds: float = 60.0
) -> float:
    """A recent moment ``end`` such that Prometheus holds every scrape of ``target`` up to
    ``end`` (a later one has landed, and a target's samples land in order) and at least two in
    each step of the window before it.

    The report and ``specobs top`` query Prometheus one after the other: a scrape from before
    ``end`` still landing in between would give them different numbers. And a step with fewer
    than two scrapes (late or skipped on a busy machine) has no ``increase()``, so its chart
    point is missing. If a step is short, the window moves on to a later ``end``.
    """
    series = f'specobs_cycles_total{{instance="{target}"}}'
    deadline = time.monotonic() + timeout_seconds
    while True:
        end = time.time() - 1.0
        prometheus.wait_for(f"timestamp({series}) > {end:.3f}",
                            timeout_seconds=max(1.0, deadline - time.monotonic()))
        counts = []
        for k in range(WINDOW_SECONDS // STEP_SECONDS):
            result = prometheus.query(f"count_over_time({series}[{STEP_SECONDS}s])",
                                      time=f"{end - k * STEP_SECONDS:.3f}")
            counts.append(float(result[0]["value"][1]) if result else 0.0)
        if min(counts) >= 2:
            return end
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {WINDOW_SECONDS} s window with two scrapes of {target} in "
                               f"every {STEP_SECONDS} s step within {timeout_seconds} s; last "
                               f"window ending {end:.3f}: {counts[::-1]}")
        time.sleep(STEP_SECONDS / 3)


def _top_fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+?)=(\[[^\]]*\]|\S+)", line))


def test_summary_equals_top_for_the_same_prometheus_window(
    reports: Reports, browser: Chromium, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert reports.prometheus is not None
    end = _complete_window_end(reports.prometheus, reports.healthy.target)
    selector = f'{{instance="{reports.healthy.target}"}}'
    out = reports.dir / "prometheus.html"
    status, stdout, stderr = report(
        "--prometheus", reports.prometheus.url, "--selector", selector, "--start",
        f"{end - WINDOW_SECONDS:.3f}", "--end", f"{end:.3f}", "--step", f"{STEP_SECONDS}s",
        "-o", str(out))
    assert status == 0, stderr
    # `specobs top` over the same window ending at the same instant (top reads "now").
    monkeypatch.setattr(pa.time, "time", lambda: end)
    got = io.StringIO()
    monkeypatch.setattr(sys, "stdout", got)
    assert cli.main(["top", "--prometheus", reports.prometheus.url, "--selector", selector,
                     "--window", f"{WINDOW_SECONDS}s", "--once", "--plain"]) == 0
    monkeypatch.undo()
    top = _top_fields(got.getvalue().strip().splitlines()[-1])
    c = cells(out.read_text())
    assert top["clock"] == "host"
    assert top["accept"] == c["acceptance"]
    assert top["accept_len"] == c["accept_length"]
    assert top["tok/s"] == c["tokens_per_second"]
    assert top["cycles/s"] == c["cycles_per_second"]
    assert top["batch"] == c["batch"]
    assert top["drops"] == c["drops"]
    assert top["cycle"] == _norm(c["cycle.host.mean"])
    assert top["pos"] == "[" + ",".join(
        p.split(": ")[1] for p in c["positions"].split(", ")) + "]"
    for phase in ("draft", "verify", "bookkeeping"):
        m = re.fullmatch(r"(.+)\((.+),p50=(.+),p99=(.+)\)", top[phase])
        assert m is not None, top[phase]
        assert m.groups() == tuple(_norm(c[f"{phase}.host.{q}"])
                                   for q in ("mean", "share", "p50", "p99")), phase
    assert float(c["acceptance"].rstrip("%")) > 40  # the healthy server, not the faulty one
    _check_page(browser, out, CHART_TITLES)


def test_errors_are_one_line_and_exit_non_zero(reports: Reports, tmp_path: Path) -> None:
    assert reports.prometheus is not None
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    status, _, err = report("--from", dead, "--duration", "4", "--interval", "1",
                            "-o", str(tmp_path / "x.html"))
    assert status == 1 and "connection refused" in err.lower() and err.count("\n") == 1, err
    assert not (tmp_path / "x.html").exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "specobs-snapshots", "version": 1}\n{"t": "soon"}\n')
    status, _, err = report("--from", str(bad), "-o", str(tmp_path / "x.html"))
    assert status == 1 and f"{bad}: line 2" in err and err.count("\n") == 1, err
    (tmp_path / "html.jsonl").write_text("<html>\n")
    status, _, err = report("--from", str(tmp_path / "html.jsonl"))
    assert status == 1 and "not a specobs snapshot file" in err, err
    status, _, err = report("--from", str(tmp_path / "missing.jsonl"))
    assert status == 1 and "no such file" in err, err

    # A range before anything was scraped is empty.
    start = time.time() - 7200
    status, _, err = report("--prometheus", reports.prometheus.url, "--start", f"{start:.0f}",
                            "--end", f"{start + 600:.0f}", "-o", str(tmp_path / "x.html"))
    assert status == 1 and "no specobs_cycles_total" in err and err.count("\n") == 1, err
    status, _, err = report("--prometheus", reports.prometheus.url, "--selector",
                            '{job="nothing"}', "--last", "1m")
    assert status == 1 and 'job="nothing"' in err, err
    status, _, err = report("--prometheus", f"http://127.0.0.1:{free_port()}", "--last", "1m")
    assert status == 1 and "cannot query Prometheus" in err, err

    for args in (["--from", "x", "--compare", "a", "b"], [], ["--from", dead, "--interval", "0"],
                 ["--prometheus", "ftp://x", "--last", "1m"],
                 ["--prometheus", "http://x:9090", "--start", "yesterday"]):
        status, _, err = report(*args)
        assert status == 2 and err.startswith("specobs report: "), (args, err)


# -- the statistics, without servers --------------------------------------------------------------


def test_welch_t_and_degrees_of_freedom() -> None:
    t, df = stats.welch([1, 2, 3, 4, 5], [3, 4, 5, 6, 7])
    assert t == pytest.approx(2.0) and df == pytest.approx(8.0)
    assert stats.t_critical(8) == pytest.approx(3.355)
    assert stats.t_critical(8, 0.05) == pytest.approx(2.306)
    # Between tabled rows the lower df's (larger, conservative) value is used.
    assert stats.t_critical(8.9) == pytest.approx(3.355)
    assert stats.t_critical(1000) == pytest.approx(2.617)
    assert stats.t_critical(float("inf")) == pytest.approx(2.576)
    assert stats.welch([1, 1, 1], [1, 1, 1]) == (0.0, float("inf"))


def _bd(acceptance: float, cycle: float) -> Any:
    """A breakdown with the given acceptance rate and host cycle time."""
    series = scr.Series()
    series.add("specobs_draft_tokens_total", {}, 1000)
    series.add("specobs_accepted_tokens_total", {}, 1000 * acceptance)
    series.add("specobs_cycles_total", {}, 100)
    series.add("specobs_cycle_duration_seconds_sum", {"clock": "host"}, 100 * cycle)
    series.add("specobs_cycle_duration_seconds_count", {"clock": "host"}, 100)
    return bd.breakdown(scr.Delta(series, scr.Series(), 1.0))


def test_significance_needs_both_the_noise_test_and_the_minimum_change() -> None:
    defs = [d for d in stats.metric_defs([], []) if d.key in ("acceptance", "cycle_host")]
    a = [_bd(0.6 + 0.01 * (i % 3), 0.010 + 0.0001 * (i % 2)) for i in range(8)]
    # Acceptance halves (beyond noise and large); the cycle is 3 % slower with tiny noise: a
    # t-test alone would flag it, the minimum change does not.
    b = [_bd(0.3 + 0.01 * (i % 3), 0.0103 + 0.0001 * (i % 2)) for i in range(8)]
    changes = {c.metric.key: c for c in stats.compare(defs, a[0], b[0], a, b)}
    assert changes["acceptance"].verdict == "significant"
    assert changes["cycle_host"].beyond_noise and not changes["cycle_host"].large_enough
    assert changes["cycle_host"].verdict == "no change"
    # A large change drowned in per-window noise is not flagged either.
    noisy = [_bd(0.6, 0.010 * (1 + (i % 2) * 1.5)) for i in range(8)]
    slower = [_bd(0.6, 0.012 * (1 + (i % 2) * 1.5)) for i in range(8)]
    c = {c.metric.key: c for c in stats.compare(defs, noisy[0], slower[0], noisy, slower)}
    assert c["cycle_host"].large_enough and not c["cycle_host"].beyond_noise
    assert c["cycle_host"].verdict == "no change"
    # Too few windows: no verdict.
    c = {c.metric.key: c for c in stats.compare(defs, a[0], b[0], a[:3], b[:3])}
    assert c["acceptance"].verdict == "too few windows"


def test_regressions_are_the_significant_changes_for_the_worse() -> None:
    defs = [d for d in stats.metric_defs([], []) if d.key in ("acceptance", "cycle_host")]
    good = [_bd(0.6 + 0.01 * (i % 3), 0.010 + 0.0001 * (i % 2)) for i in range(8)]
    # B: acceptance halved and the cycle 50 % slower: both worse.
    bad = [_bd(0.3 + 0.01 * (i % 3), 0.015 + 0.0001 * (i % 2)) for i in range(8)]
    worse = stats.regressions(stats.compare(defs, good[0], bad[0], good, bad))
    assert sorted(c.metric.key for c in worse) == ["acceptance", "cycle_host"]
    # The same changes the other way round are improvements: significant, not regressions.
    changes = stats.compare(defs, bad[0], good[0], bad, good)
    assert {c.metric.key for c in stats.findings(changes)} == {"acceptance", "cycle_host"}
    assert stats.regressions(changes) == []


def test_help_and_a_light_import() -> None:
    code = (
        "import sys, specobs.tools.report\n"
        "heavy = [m for m in ('httpx', 'plotly', 'prometheus_client', 'torch') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(), timeout=30)
    done = subprocess.run([sys.executable, "-m", "specobs.cli", "report", "--help"],
                          capture_output=True, text=True, env=_env(), timeout=30)
    assert done.returncode == 0
    for flag in ("--from", "--compare", "--duration", "--save", "--prometheus", "--min-change"):
        assert flag in done.stdout
    top = subprocess.run([sys.executable, "-m", "specobs.cli", "--help"], capture_output=True,
                         text=True, env=_env(), timeout=30)
    assert re.search(r"^\s+report\s", top.stdout, re.M), top.stdout


def test_the_terminal_says_what_the_report_found_and_the_page_names_its_source_once(
    tmp_path: Path,
) -> None:
    """Under ``wrote FILE``, the run's cycles, acceptance and speedup and its findings in a line
    (a user who does not open the file still learns the verdict); the page's header names the
    source once, not ``source: source``."""
    data = Path(__file__).parent / "data"
    for name, verdict in (("healthy", "findings OK: no problem found"),
                          ("wrong-hidden-layers", "findings FAIL: SPEC-ACCEPT-COLLAPSE")):
        source = str(data / f"report-demo-{name}.jsonl.gz")
        out = tmp_path / f"{name}.html"
        status, stdout, stderr = report("--from", source, "-o", str(out))
        assert status == 0, stderr
        lines = stdout.splitlines()
        assert lines[0].startswith(f"wrote {out} (")
        assert re.fullmatch(r"  [\d,]+ cycles over \d+ s, acceptance [\d.]+%, speedup [\d.]+x",
                            lines[1]), lines
        assert lines[2].startswith("  " + verdict), lines
        meta = re.search(r'<div class="meta">(.*?)</div>', out.read_text()).group(1)
        assert meta.count(html.escape(source)) <= 1, meta
