"""``specobs doctor --against FILE``: the window against a run saved earlier by ``specobs report
--save`` (the ``SPEC-SAVED-*`` findings), from the two saved CPU demo runs in tests/data and from
a live endpoint whose verify got slower than in the run saved from it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from specobs.tools import _diagnosis as dg
from specobs.tools import _doctor
from specobs.tools import _scrape as scr
from specobs.tools.report import _data as rd
from tests import test_top
from tests.test_top import Engine, cli_here

engines = test_top.engines
__all__ = ["engines"]

DATA = Path(__file__).parent / "data"
HEALTHY = str(DATA / "report-demo-healthy.jsonl.gz")
COLLAPSED = str(DATA / "report-demo-wrong-hidden-layers.jsonl.gz")


def codes(findings: list[dg.Finding]) -> dict[str, dg.Finding]:
    return {f.code: f for f in findings}


def test_a_saved_run_is_its_whole_span_as_one_window() -> None:
    saved = _doctor.load_saved_run(HEALTHY)
    assert saved.name.startswith(HEALTHY)
    assert saved.seconds == pytest.approx(40.0, abs=0.01)
    assert saved.window.breakdown.cycles == 1463
    assert saved.window.breakdown.acceptance_rate == pytest.approx(0.801, abs=0.001)


def test_a_collapsed_draft_against_the_healthy_run_saved_earlier() -> None:
    healthy = _doctor.load_saved_run(HEALTHY)
    collapsed = _doctor.load_saved_run(COLLAPSED)
    report = _doctor.Report([], [], collapsed.window)
    _doctor.against_saved(report, healthy)
    found = codes(report.findings)
    down = found["SPEC-SAVED-ACCEPT-DOWN"]
    assert down.severity == "warn"
    assert "from 80% in the saved run (" in down.sentence and "to 18%" in down.sentence
    assert "-62 points" in down.sentence
    assert down.evidence["z"] is not None and float(down.evidence["z"]) > 50  # type: ignore[arg-type]
    slower = found["SPEC-SAVED-THROUGHPUT-DOWN"]
    assert "from 179.7 in the saved run" in slower.sentence and "to 76.6" in slower.sentence
    assert slower.severity == "warn"
    assert not any(f.code.startswith("SPEC-RECENT-") for f in report.findings)
    assert report.checks[-1].name == "saved run" and report.checks[-1].verdict == "OK"
    assert _doctor.exit_code(report) == 1


def test_the_same_run_against_itself_is_steady() -> None:
    healthy = _doctor.load_saved_run(HEALTHY)
    report = _doctor.Report([], [], healthy.window)
    _doctor.against_saved(report, healthy)
    assert [f.code for f in report.findings] == ["SPEC-SAVED-STEADY"]
    assert _doctor.exit_code(report) == 0


def test_too_short_a_saved_run_is_said_not_guessed(tmp_path: Path) -> None:
    source, snapshots = rd.load_snapshots(HEALTHY)
    short = tmp_path / "short.jsonl"
    rd.save_snapshots(str(short), source, snapshots[:2])  # one window: a few dozen cycles
    saved = _doctor.load_saved_run(str(short))
    assert saved.window.breakdown.cycles < dg.MIN_PAST_CYCLES
    report = _doctor.Report([], [], _doctor.load_saved_run(COLLAPSED).window)
    _doctor.against_saved(report, saved)
    assert report.findings == []
    assert report.checks[-1].verdict == "INFO" and "too few cycles" in report.checks[-1].reason


def test_a_slower_verify_than_in_the_saved_run_from_a_live_endpoint(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    eng = engines(baseline=50.0)
    saved = tmp_path / "before.jsonl"
    snaps = []
    with httpx.Client(timeout=5) as client:
        for n in (5, 150):
            eng.run(n)
            snaps.append(rd.Snapshot(time.time(), scr.parse_exposition(client.get(eng.url).text)))
    rd.save_snapshots(str(saved), eng.url, snaps)
    eng.verify_ns *= 4  # the GPU clock's times are exactly these nanoseconds
    eng.start()
    rc, out, err = cli_here(capsys, "doctor", eng.url, "--json", "--wait", "0.3", "--against",
                            str(saved), "--min-cycles", "30", "--max-wait", "120")
    assert err == "", err
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == [*_doctor.CHECK_NAMES, "saved run"]
    assert rc == 1 and report["exit_code"] == 1
    found = {f["code"]: f for f in report["findings"]}
    assert "SPEC-SAVED-PHASE-SLOWER" in found, report["findings"]
    slower = found["SPEC-SAVED-PHASE-SLOWER"]
    assert slower["evidence"]["phase"] == "verify"
    assert slower["evidence"]["clock"] == "gpu"
    assert slower["evidence"]["ratio"] == pytest.approx(4.0, rel=1e-6)
    assert "verify is 4.0x slower than in the saved run (" in slower["sentence"]
    assert "0.60 ms → 2.40 ms" in slower["sentence"]
    assert checks["saved run"]["verdict"] == "OK"
    assert ": 150 cycles over " in checks["saved run"]["reason"]  # between the two samples


def test_a_file_that_is_no_saved_run_exits_2_with_one_line(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    eng = engines()
    bad = tmp_path / "nope.jsonl"
    bad.write_text("hello\n")
    for path in (str(bad), str(tmp_path / "missing.jsonl")):
        rc, out, err = cli_here(capsys, "doctor", eng.url, "--against", path)
        assert rc == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("specobs doctor: --against: ")
        assert path in err
