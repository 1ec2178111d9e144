"""``specobs doctor --prometheus URL --instance X``: one server diagnosed from a real Prometheus
(Debian's 2.42) scraping a live demo every second: the recent window against the history before
it, the same findings as from the endpoint. Every wait is on what Prometheus holds."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from tests._prometheus_server import PrometheusServer
from tests.test_diagnosis_demo import Load, Served
from tests.test_top import cli_here

pytestmark = pytest.mark.slow

WINDOW_SECONDS = 15
HISTORY_SECONDS = 30


class Setup:
    def __init__(self, served: Served, prometheus: PrometheusServer, target: str) -> None:
        self.served, self.prometheus, self.target = served, prometheus, target

    def scraped_span(self, since: float) -> float:
        """Seconds between the first and last scrape with cycles since ``since``."""
        result = self.prometheus.query_range(
            f'specobs_cycles_total{{instance="{self.target}"}} > 0', since, time.time(), 0.5)
        if not result:
            return 0.0
        values = result[0]["values"]
        return float(values[-1][0]) - float(values[0][0])

    def wait_scraped_after(self, moment: float, timeout_seconds: float) -> None:
        """Wait until Prometheus holds a scrape taken at least ``moment``."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            result = self.prometheus.query(f'timestamp(up{{instance="{self.target}"}})')
            if result and float(result[0]["value"][1]) >= moment:
                return
            time.sleep(0.25)
        raise TimeoutError(f"no scrape after {moment} within {timeout_seconds} s")


@pytest.fixture
def setup() -> Iterator[Setup]:
    shutil.which("prometheus") or pytest.skip("Debian's prometheus is not installed")
    served = Served()
    load = Load(served)
    port = served.sink.port
    assert port is not None
    target = f"127.0.0.1:{port}"
    prometheus = PrometheusServer([target])
    try:
        prometheus.wait_for_target_up(timeout_seconds=30)
        yield Setup(served, prometheus, target)
    finally:
        prometheus.stop()
        load.close()
        served.engine.fault = None
        served.close()


def doctor(capsys: pytest.CaptureFixture[str], s: Setup) -> tuple[int, dict[str, Any]]:
    rc, out, err = cli_here(capsys, "doctor", "--prometheus", s.prometheus.url, "--instance",
                            s.target, "--window", f"{WINDOW_SECONDS}s", "--history",
                            f"{HISTORY_SECONDS}s", "--json")
    assert err == "", err
    return rc, json.loads(out)


def test_a_collapse_switched_on_is_named_from_prometheus(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.time()
    # History: healthy cycles over more than the history span, then the fault for a window.
    deadline = time.monotonic() + 240
    while setup.scraped_span(started) < HISTORY_SECONDS + 3:
        assert time.monotonic() < deadline, "the demo was not scraped long enough"
        time.sleep(0.5)
    switched = time.time()
    setup.served.engine.fault = "wrong-hidden-layers"
    setup.wait_scraped_after(switched + WINDOW_SECONDS + 2, timeout_seconds=120)

    rc, report = doctor(capsys, setup)
    assert rc == 1, report
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["prometheus"]["verdict"] == "OK"
    assert checks["prometheus"]["data"]["instances"] == [setup.target]
    assert checks["history"]["verdict"] == "OK"
    found = {f["code"]: f for f in report["findings"]}
    assert found["SPEC-ACCEPT-COLLAPSE"]["severity"] == "fail", found
    assert found["SPEC-RECENT-ACCEPT-DOWN"]["severity"] == "warn", found


def test_an_unknown_instance_is_an_unusable_source(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli_here(capsys, "doctor", "--prometheus", setup.prometheus.url,
                            "--instance", "nowhere:1")
    assert rc == 2 and err == ""
    assert "FAIL  prometheus" in out and 'has no specobs_info{instance="nowhere:1"}' in out


def test_prometheus_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli_here(capsys, "doctor")
    assert rc == 2 and "exactly one" in err
    rc, _, err = cli_here(capsys, "doctor", "http://127.0.0.1:1/metrics", "--instance", "x")
    assert rc == 2 and "only apply with --prometheus" in err
    rc, _, err = cli_here(capsys, "doctor", "--prometheus", "http://127.0.0.1:1",
                          "--window", "soon")
    assert rc == 2 and "bad window 'soon'" in err
