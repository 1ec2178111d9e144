"""``specobs doctor`` against a real specobs endpoint fed by a real recorder (fake GPU clock), real
expositions replayed by a stdlib server for exact arithmetic, and every kind of bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from specobs import catalog
from specobs.tools import _doctor
from tests import test_top
from tests.test_top import BadServer, Engine, cli, cli_here, closed_port_url

# The shared fixtures: a factory of real engines and the stdlib bad server.
engines = test_top.engines
bad_server = test_top.bad_server

WAIT = "0.3"


def doctor_json(capsys: pytest.CaptureFixture[str], url: str, *extra: str
                ) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
    rc, out, err = cli_here(capsys, "doctor", url, "--wait", WAIT, "--json", *extra)
    assert err == "", err
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == list(_doctor.CHECK_NAMES)
    return rc, report, checks


def verdicts(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: c["verdict"] for name, c in checks.items()}


def test_healthy_endpoint(engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]):
    eng = engines(baseline=50.0, traces=True).start()
    rc, report, checks = doctor_json(capsys, eng.url)
    assert rc == 0 and report["ok"] is True
    assert verdicts(checks) == {
        "reachable": "OK",
        "specobs endpoint": "OK",
        "contract series": "OK",
        "cycles advancing": "OK",
        "gpu clock": "OK",
        "dropped records": "OK",
        "exporter errors": "OK",
        # sample_every=1 on microsecond fake cycles: far over budget, and the check says why.
        "overhead": "WARN",
        "exporter cpu": checks["exporter cpu"]["verdict"],
        "exemplars": "OK",
        "baseline": "OK",
    }
    assert "phases draft,verify,bookkeeping, gpu_clock=fake, sampling every_1" in \
        checks["specobs endpoint"]["reason"]
    assert checks["contract series"]["data"]["absent_optional"] == [
        catalog.REQUESTS_RUNNING.name, catalog.REQUESTS_WAITING.name,
    ]
    assert checks["cycles advancing"]["data"]["cycles"] > 0
    assert "sampling is fixed (every_1)" in checks["overhead"]["reason"]
    assert checks["exemplars"]["data"]["exemplars"] > 0
    assert "speculation is faster" in checks["baseline"]["reason"]
    assert checks["baseline"]["data"]["baseline"] == 50.0
    assert checks["baseline"]["data"]["realized"] > 50.0


def test_text_report_one_line_per_check(engines: Callable[..., Engine]):
    eng = engines(baseline=50.0).start()
    result = cli("doctor", eng.url, "--wait", WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"specobs doctor {eng.url}"
    body = lines[1:-1]
    assert len(body) == len(_doctor.CHECK_NAMES)
    for line, name in zip(body, _doctor.CHECK_NAMES, strict=True):
        verdict, rest = line.split(None, 1)
        assert verdict in ("OK", "WARN", "FAIL", "SKIP")
        assert rest.startswith(name), line
    assert "WARN  exemplars" in result.stdout and "tracing may be off" in result.stdout
    assert lines[-1].startswith(("WARN", "OK"))
    assert result.stderr == ""


def test_exact_numbers_from_replayed_expositions(
    engines: Callable[..., Engine], bad_server: BadServer, capsys: pytest.CaptureFixture[str]
):
    eng = engines(baseline=50.0, traces=True)
    with httpx.Client(timeout=5) as client:
        eng.run(7)
        a, snap_a = client.get(eng.url).text, eng.obs.snapshot()
        eng.run(5)
        b, snap_b = client.get(eng.url).text, eng.obs.snapshot()
        om = client.get(eng.url, headers={"Accept": "application/openmetrics-text"}).text
    bad_server.bodies, bad_server.openmetrics = [a, b], om
    rc, _, checks = doctor_json(capsys, bad_server.url("/seq"))
    assert rc == 0
    assert checks["cycles advancing"]["data"]["cycles"] == 5
    assert checks["cycles advancing"]["reason"].startswith("5 cycles in 0.")
    assert checks["gpu clock"]["reason"].startswith("12 cycles timed on the GPU clock (fake")
    assert checks["exemplars"]["data"]["exemplars"] == len(_doctor.EXEMPLAR_PATTERN.findall(om)) > 0
    assert 'trace_id="' in om
    # realized = (Δemitted / Δbatch_sum) / (Δhost cycle seconds / Δcycles)
    emitted = snap_b.emitted_tokens_total - snap_a.emitted_tokens_total
    batch = snap_b.batch_size.sum - snap_a.batch_size.sum
    host = snap_b.cycle_seconds_sum("host") - snap_a.cycle_seconds_sum("host")
    assert (emitted, batch) == (30, 10)
    expected = (emitted / batch) / (host / 5)
    assert checks["baseline"]["data"]["realized"] == pytest.approx(expected, rel=1e-9)


def test_speculation_slower_than_baseline_fails(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
):
    eng = engines(baseline=1e8).start()
    rc, report, checks = doctor_json(capsys, eng.url)
    assert rc == 1 and report["ok"] is False
    assert checks["baseline"]["verdict"] == "FAIL"
    assert "speculation is slower than the baseline" in checks["baseline"]["reason"]
    assert [n for n, v in verdicts(checks).items() if v == "FAIL"] == ["baseline"]


def test_idle_host_clock_endpoint_without_baseline(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
):
    eng = engines(clock="host")
    eng.run(3)
    rc, _, checks = doctor_json(capsys, eng.url)
    assert rc == 0
    assert checks["cycles advancing"]["verdict"] == "WARN"
    assert "no cycles in 0.3 s: the engine is idle or stalled; last cycle" in \
        checks["cycles advancing"]["reason"]
    assert checks["gpu clock"]["verdict"] == "WARN"
    assert "host clock only: CUDA not initialised or clock=host" in checks["gpu clock"]["reason"]
    assert 'gpu_clock="none"' in checks["gpu clock"]["reason"]
    assert checks["baseline"]["verdict"] == "SKIP"
    assert "no baseline configured" in checks["baseline"]["reason"]
    assert checks["exporter cpu"]["verdict"] == "SKIP"
    assert checks["exemplars"]["verdict"] == "WARN"


def test_clock_auto_without_cuda(engines: Callable[..., Engine],
                                 capsys: pytest.CaptureFixture[str]):
    eng = engines(clock="auto", sample_every=None)
    eng.run(2)
    _, _, checks = doctor_json(capsys, eng.url)
    assert checks["gpu clock"]["verdict"] == "WARN"
    assert "host clock only: CUDA not initialised or clock=host" in checks["gpu clock"]["reason"]
    assert "clock=auto" in checks["gpu clock"]["reason"]


def test_no_cycles_at_all(engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]):
    eng = engines(baseline=50.0)
    rc, _, checks = doctor_json(capsys, eng.url)
    assert rc == 0
    assert "no cycle yet" in checks["cycles advancing"]["reason"]
    assert checks["gpu clock"]["reason"].startswith("no cycles yet")
    assert checks["baseline"]["verdict"] == "SKIP"
    assert "cannot measure" in checks["baseline"]["reason"]


def test_drops_and_misuse(engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]):
    eng = engines(pool_size=4)  # events for one cycle: the next nine run untimed
    eng.complete = False
    for _ in range(10):
        eng.cycle()
    eng.obs.mark("verify")  # no open cycle: counted as misuse
    eng.gpu.complete()
    assert eng.obs.force_flush(5)
    rc, _, checks = doctor_json(capsys, eng.url)
    assert rc == 1
    drops = checks["dropped records"]
    assert drops["verdict"] == "FAIL"
    assert drops["reason"] == "9 dropped (event_pool_exhausted 9), 90.00% of 10 cycles"
    assert checks["exporter errors"]["verdict"] == "WARN"
    assert checks["exporter errors"]["reason"].startswith("mark_without_begin 1")
    assert checks["gpu clock"]["reason"].startswith("1 cycles timed on the GPU clock")


def test_missing_contract_series_are_listed(
    engines: Callable[..., Engine], bad_server: BadServer, capsys: pytest.CaptureFixture[str]
):
    eng = engines()
    eng.run(2)
    text = httpx.get(eng.url, timeout=5).text
    gone = catalog.ACCEPT_LENGTH.name
    bad_server.bodies = ["\n".join(
        line for line in text.splitlines() if not line.startswith(gone)
    ) + "\n"]
    bad_server.openmetrics = None
    rc, _, checks = doctor_json(capsys, bad_server.url("/seq"))
    assert rc == 1
    contract = checks["contract series"]
    assert contract["verdict"] == "FAIL"
    assert contract["data"]["missing"] == [f"{gone}_bucket", f"{gone}_sum", f"{gone}_count"]
    assert contract["reason"].startswith("3 catalog series missing: specobs_accept_length_bucket")
    assert checks["exemplars"]["verdict"] == "WARN"
    assert "ignores Accept: application/openmetrics-text" in checks["exemplars"]["reason"]


def test_counter_reset_between_the_two_scrapes(
    engines: Callable[..., Engine], bad_server: BadServer, capsys: pytest.CaptureFixture[str]
):
    eng = engines(baseline=50.0)
    eng.run(6)
    before = httpx.get(eng.url, timeout=5).text
    port = eng.port
    eng.stop()
    again = engines(port=port, baseline=50.0)
    again.run(1)
    after = httpx.get(again.url, timeout=5).text
    bad_server.bodies, bad_server.openmetrics = [before, after], None
    rc, _, checks = doctor_json(capsys, bad_server.url("/seq"))
    assert rc == 0
    assert checks["cycles advancing"]["verdict"] == "WARN"
    assert "counters reset, rebasing" in checks["cycles advancing"]["reason"]
    assert checks["baseline"]["verdict"] == "SKIP"
    assert checks["exporter cpu"]["verdict"] == "SKIP"


@pytest.mark.parametrize(
    ("path", "failing", "expected"),
    [
        ("/html", "specobs endpoint", "the body is HTML, not Prometheus metrics"),
        ("/garbage", "specobs endpoint", "the body is not Prometheus text exposition"),
        ("/binary", "reachable", "not UTF-8 text"),
        ("/500", "reachable", "answered HTTP 500 Internal Server Error"),
        ("/other", "specobs endpoint", "is not a specobs endpoint: no specobs_info series"),
        ("/empty", "specobs endpoint", "the body has no metrics at all"),
    ],
)
def test_bad_endpoints_fail_with_one_line_and_exit_1(
    bad_server: BadServer, capsys: pytest.CaptureFixture[str], path: str, failing: str,
    expected: str,
):
    rc, out, err = cli_here(capsys, "doctor", bad_server.url(path), "--wait", "0")
    assert rc == 1 and err == ""
    lines = out.splitlines()
    assert len(lines) == 2 + len(_doctor.CHECK_NAMES)
    fail = next(line for line in lines if line.startswith("FAIL"))
    assert failing in fail and expected in fail, fail
    assert "Traceback" not in out
    after = _doctor.CHECK_NAMES[_doctor.CHECK_NAMES.index(failing) + 1:]
    for name in after:
        assert any(line.startswith("SKIP") and name in line for line in lines), (name, out)


def test_unreachable_url(capsys: pytest.CaptureFixture[str]):
    url = closed_port_url()
    rc, report, checks = doctor_json(capsys, url)
    assert rc == 1 and report["ok"] is False
    assert checks["reachable"]["verdict"] == "FAIL"
    assert checks["reachable"]["reason"].startswith(f"cannot connect to {url}")
    assert all(c["verdict"] == "SKIP" for n, c in checks.items() if n != "reachable")


def test_command_line_from_a_shell():
    url = closed_port_url()
    result = cli("doctor", url)
    assert result.returncode == 1
    assert f"FAIL  reachable         cannot connect to {url}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    bad = cli("doctor", "file:///etc/passwd")
    assert bad.returncode == 2
    assert "specobs doctor: unsupported URL scheme 'file'" in bad.stderr
