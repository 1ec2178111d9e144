"""The batch threshold (``SPEC-ADVICE-BATCH``) from a real Prometheus scraping a real specobs
exporter whose engine serves one batch size, then another: ``doctor --prometheus`` splits the
history into windows and fits over the batch sizes they served, ``report --prometheus`` fits
over its windows, and a server that served one batch size is told that no threshold can be
read from it.

The engine is synthetic, on the host clock: each phase sleeps its cost at the batch served and,
like the demo's baseline probe, every few cycles a plain decode step (a sleep of its own cost)
is timed and exported as the baseline measured on the served batch. Speculation pays about 2x
at batches 2 and 4 and 0.6x at 16, so the threshold is between 4 and 16 on any machine: a
loaded one lengthens every sleep, which lowers the speedups without moving where they cross
out of that bracket. Every wait is on what Prometheus holds."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import specobs
from specobs import catalog
from tests.test_top import cli_here

pytestmark = pytest.mark.slow

K = 4
#: Accepted draft tokens per pair of sequences: 3 on average, E = 4 tokens per sequence-cycle.
ACCEPTED = (4, 2)
#: A plain step is timed after every this many cycles; the baseline needs this many timed.
PROBE_EVERY, PROBE_MIN = 4, 3
#: Seconds of doctor's recent window, and of each window the history is split into.
WINDOW = 6
SOURCE = "test_measured"


@dataclass(frozen=True)
class Costs:
    """Seconds each phase and the plain decode step take at one batch size."""

    draft: float
    verify: float
    bookkeeping: float
    plain: float

    @property
    def speedup(self) -> float:
        return (1 + sum(ACCEPTED) / len(ACCEPTED)) * self.plain / (
            self.draft + self.verify + self.bookkeeping)


COSTS = {
    2: Costs(2e-3, 4e-3, 0.5e-3, 3.5e-3),    # 2.15x
    4: Costs(2e-3, 5e-3, 0.5e-3, 4e-3),      # 2.13x
    16: Costs(3e-3, 30e-3, 0.5e-3, 5e-3),    # 0.60x: verify grows with the tokens verified
}


class BatchServer:
    """A real observer and PrometheusSink on the host clock serving ``batch`` sequences a
    cycle, with the baseline gauge (``source="test_measured"``) of the plain steps timed since
    the batch size last changed (absent until :data:`PROBE_MIN` were)."""

    def __init__(self, batch: int) -> None:
        self.sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
        self.obs = specobs.configure(sinks=[self.sink], clock="host", max_draft_length=K,
                                     labels={"model": "synthetic"}, poll_interval_seconds=0.01)
        self.sink.registry.register(self)
        self._lock = threading.Lock()
        self._batch = batch
        self._plain: deque[float] = deque(maxlen=64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-engine", daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sink.port}"

    def set_batch(self, batch: int) -> None:
        with self._lock:
            self._batch = batch
            self._plain.clear()

    def start(self) -> BatchServer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            with self._lock:
                batch = self._batch
            c = COSTS[batch]
            with self.obs.cycle(batch_size=batch) as cyc:
                time.sleep(c.draft)
                cyc.mark("verify")
                time.sleep(c.verify)
                cyc.mark("bookkeeping")
                time.sleep(c.bookkeeping)
                cyc.accept(list(ACCEPTED) * (batch // 2), draft_length=K)
            n += 1
            if n % PROBE_EVERY == 0:
                t = time.perf_counter()
                time.sleep(c.plain)
                step = time.perf_counter() - t
                with self._lock:
                    if self._batch == batch:
                        self._plain.append(step)

    # a prometheus_client collector, as the demo's BaselineCollector
    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            steps = list(self._plain)
        if len(steps) < PROBE_MIN:
            return
        m = catalog.BASELINE_SEQUENCE_TOKENS
        g = GaugeMetricFamily(m.name, m.help, labels=["source"])
        g.add_metric([SOURCE], len(steps) / math.fsum(steps))
        yield g

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.obs.shutdown(0.05)


class Scraped:
    def __init__(self, server: BatchServer, prometheus: Any) -> None:
        self.server, self.prometheus = server, prometheus
        self.started = time.time()

    def wait_scraped_after(self, moment: float, timeout_seconds: float = 120) -> None:
        """Wait until Prometheus holds a scrape with cycles taken at ``moment`` or later."""
        deadline = time.monotonic() + timeout_seconds
        query = f'timestamp({catalog.CYCLES.name}{{instance="{self.server.target}"}})'
        while time.monotonic() < deadline:
            result = self.prometheus.query(query)
            if result and float(result[0]["value"][1]) >= moment:
                return
            time.sleep(0.25)
        raise TimeoutError(f"no scrape after {moment} within {timeout_seconds} s")

    def serve(self, batch: int) -> None:
        """Serve ``batch`` until Prometheus has held it for two windows and more: at least one
        whole window of the split falls inside."""
        self.server.set_batch(batch)
        self.wait_scraped_after(time.time() + 2 * WINDOW + 2)

    def history(self) -> int:
        """Seconds of history that reach back to the server's start, in whole windows."""
        return WINDOW * math.ceil((time.time() - self.started) / WINDOW + 1)


@pytest.fixture
def scraped(prometheus_server: Callable[..., Any]) -> Iterator[Callable[[int], Scraped]]:
    made: list[BatchServer] = []

    def make(batch: int) -> Scraped:
        server = BatchServer(batch).start()
        made.append(server)
        prometheus = prometheus_server([server.target])
        prometheus.wait_for_target_up(timeout_seconds=30)
        return Scraped(server, prometheus)

    try:
        yield make
    finally:
        for s in made:
            s.close()


def doctor(capsys: pytest.CaptureFixture[str], s: Scraped) -> tuple[int, dict[str, Any]]:
    rc, out, err = cli_here(capsys, "doctor", "--prometheus", s.prometheus.url, "--instance",
                            s.server.target, "--window", f"{WINDOW}s", "--history",
                            f"{s.history()}s", "--json")
    assert err == "", err
    return rc, json.loads(out)


def test_a_server_that_served_several_batch_sizes_is_told_where_speculation_stops_paying(
    scraped: Callable[[int], Scraped], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert COSTS[4].speedup > 2.0 > 1.0 > COSTS[16].speedup
    s = scraped(2)
    for batch in (2, 4, 16):
        s.serve(batch)

    rc, report = doctor(capsys, s)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["history"]["verdict"] == "OK", checks
    split = checks["batch sizes"]
    assert split["verdict"] == "OK", split
    assert split["data"]["batches"][0] == pytest.approx(2.0, abs=0.3), split
    found = {f["code"]: f for f in report["findings"]}
    batch = found["SPEC-ADVICE-BATCH"]
    ev = batch["evidence"]
    assert (batch["severity"], ev["confidence"]) == ("info", "measured"), batch
    assert 4.0 < ev["threshold_batch"] < 16.0, batch
    assert ev["batches_observed"] >= 3 and ev["min_batch"] < 2.5 and ev["max_batch"] > 12, ev
    assert batch["sentence"].startswith("speculation stops paying between batch "), batch
    assert "num_speculative_tokens_per_batch_size" in batch["advice"]
    # The recent window is at batch 16, where speculation is slower than the plain steps.
    assert rc == 1 and found["SPEC-SPEEDUP-LOSS"]["severity"] == "fail", found

    # The report over the same range fits over its windows alike.
    pytest.importorskip("plotly")
    end = time.time()
    rc, out, err = cli_here(capsys, "report", "--prometheus", s.prometheus.url, "--selector",
                            f'{{instance="{s.server.target}"}}', "--start", f"{s.started:.3f}",
                            "--end", f"{end:.3f}", "--step", f"{WINDOW}s", "--json",
                            "-o", str(tmp_path / "run.html"))
    assert rc == 0, err
    got = {f["code"]: f for f in json.loads(out)["findings"]}["SPEC-ADVICE-BATCH"]
    assert got["evidence"]["confidence"] == "measured", got
    assert 4.0 < got["evidence"]["threshold_batch"] < 16.0, got
    page = (tmp_path / "run.html").read_text()
    assert 'data-code="SPEC-ADVICE-BATCH"' in page and "speculation stops paying between" in page


def test_a_server_that_served_one_batch_size_names_no_threshold(
    scraped: Callable[[int], Scraped], capsys: pytest.CaptureFixture[str]
) -> None:
    s = scraped(4)
    s.wait_scraped_after(s.started + 3 * WINDOW + 2)

    rc, report = doctor(capsys, s)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["batch sizes"]["verdict"] == "OK", checks
    assert checks["batch sizes"]["data"]["batches"] == [pytest.approx(4.0)], checks
    batch = {f["code"]: f for f in report["findings"]}["SPEC-ADVICE-BATCH"]
    assert batch["severity"] == "ok", batch
    assert batch["evidence"]["threshold_batch"] is None, batch
    assert batch["evidence"]["batches_observed"] == 1.0, batch
    assert batch["sentence"].startswith("speculation pays at the one batch size observed"), batch
