"""``specobs doctor --prometheus`` and ``specobs top --prometheus`` on servers without specobs's
plugin: a real Prometheus (Debian's 2.42) scrapes engine endpoints that serve each engine's own
exposition (tests/_engine_exposition.py), one server with the plugin, and a vLLM endpoint on the
plugin's own host. Acceptance, its per-position profile and tokens/s are judged from the
engines' series; what needs the plugin is said so, never shown as zero or as a failure."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from specobs.tools import _engine_series as es
from tests._engine_exposition import EngineExposition, Workload, engine_hosts
from tests._prometheus_server import PrometheusServer, prometheus_path
from tests.test_engine_fleet_prometheus import PluginServer
from tests.test_top import cli_here

pytestmark = pytest.mark.slow

WORKLOADS = {
    "vllm": Workload(drafts_per_second=60, k=3, position_acceptance=(0.8, 0.6, 0.4)),
    "sglang": Workload(drafts_per_second=40, k=4, position_acceptance=(0.7, 0.5, 0.3, 0.2)),
    "trtllm": Workload(drafts_per_second=60, k=2, position_acceptance=(0.9, 0.72)),
}
WINDOW = "5s"


class Setup:
    def __init__(self, prometheus: PrometheusServer, engines: dict[str, EngineExposition],
                 plugin: PluginServer, hidden: EngineExposition) -> None:
        self.prometheus, self.engines, self.plugin, self.hidden = (
            prometheus, engines, plugin, hidden)

    def doctor(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
        rc, out, err = cli_here(capsys, "doctor", "--prometheus", self.prometheus.url,
                                "--window", WINDOW, "--history", "10s", "--json", *args)
        assert err == "", err
        return rc, json.loads(out)

    def top(self, capsys: pytest.CaptureFixture[str], selector: str, *args: str
            ) -> tuple[int, str, str]:
        return cli_here(capsys, "top", "--prometheus", self.prometheus.url, "--selector",
                        selector, "--window", WINDOW, "--once", "--interval", "0.05", *args)


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    prometheus_path()
    plugin = PluginServer()
    engines: dict[str, EngineExposition] = {}
    hidden: EngineExposition | None = None
    prometheus: PrometheusServer | None = None
    try:
        for (name, workload), host in zip(WORKLOADS.items(), engine_hosts(len(WORKLOADS)),
                                          strict=True):
            engines[name] = EngineExposition(name, workload, host=host)
        # vLLM's own endpoint on the plugin's host, with other figures: the plugin wins there.
        hidden = EngineExposition("vllm", replace(WORKLOADS["vllm"], drafts_per_second=500),
                                  host="127.0.0.1")
        prometheus = PrometheusServer(
            [plugin.target],
            extra_jobs={**{n: [s.target] for n, s in engines.items()},
                        "vllm-on-plugin-host": [hidden.target]})
        prometheus.wait_for_target_up(timeout_seconds=30)
        # Every engine's rates: two scrapes in the window, and a history before it.
        prometheus.wait_for_history("vllm:spec_decode_num_drafts_total", seconds=12,
                                    step_seconds=1, timeout_seconds=60)
        prometheus.wait_for_history("sglang:spec_verify_calls_total", seconds=12,
                                    step_seconds=1, timeout_seconds=60)
        yield Setup(prometheus, engines, plugin, hidden)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for server in engines.values():
            server.stop()
        if hidden is not None:
            hidden.stop()
        plugin.stop()


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_doctor_judges_one_engine_server_and_says_what_needs_the_plugin(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm = setup.engines["vllm"]
    rc, report = setup.doctor(capsys, "--instance", vllm.target)
    checks = _checks(report)
    assert rc == 0, report
    assert checks["prometheus"]["verdict"] == "OK"
    assert checks["prometheus"]["data"][es.ENGINE_LABEL] == "vllm"
    assert "vLLM's own series" in checks["prometheus"]["reason"]
    assert checks["history"]["verdict"] == "OK"
    # Each figure only the plugin measures: its own SKIP line saying so, nothing judged.
    for name, _ in es.NEEDS_PLUGIN:
        assert checks[name]["verdict"] == "SKIP", checks[name]
        assert checks[name]["reason"].startswith(es.NEEDS_PLUGIN_TEXT), checks[name]
    codes = {f["code"]: f for f in report["findings"]}
    assert set(codes) == {"SPEC-ACCEPT-HEALTHY", "SPEC-RECENT-STEADY"}, codes
    profile = codes["SPEC-ACCEPT-HEALTHY"]["evidence"]
    # The conditional profile from vLLM's per-position counters over its drafts: 0.8, then
    # 0.6 / 0.8 and 0.4 / 0.6.
    assert profile["conditional_0"] == pytest.approx(0.8, rel=0.01)
    assert profile["conditional_1"] == pytest.approx(0.75, rel=0.01)
    assert profile["conditional_2"] == pytest.approx(2 / 3, rel=0.01)
    assert profile["acceptance_rate"] == pytest.approx(0.6, rel=0.01)
    length = re.search(r"accept length ([0-9.]+)", checks["engine series"]["reason"])
    assert length is not None and float(length.group(1)) == pytest.approx(2.8, abs=0.02)
    # Nothing of the plugin's findings (a stall, no cycles, phases, speedup) is made up.
    assert not any(c.startswith(("SPEC-STALL", "SPEC-NO-CYCLES", "SPEC-IDLE", "SPEC-CYCLE",
                                 "SPEC-HOST", "SPEC-SPEEDUP")) for c in codes)


def test_doctor_without_a_per_position_profile_says_so(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report = setup.doctor(capsys, "--instance", setup.engines["sglang"].target)
    assert rc == 0, report
    unknown = next(f for f in report["findings"] if f["code"] == "SPEC-ACCEPT-UNKNOWN")
    assert unknown["severity"] == "info"
    assert "SGLang exports no acceptance by draft position" in unknown["sentence"]
    # SGLang's acceptance is its own gauge: accepted drafts over steps x configured k.
    assert unknown["evidence"]["acceptance_rate"] == pytest.approx(WORKLOADS["sglang"].acceptance,
                                                                   rel=0.01)


def test_doctor_over_the_fleet_lists_every_server_the_plugin_winning_on_its_host(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report = setup.doctor(capsys)
    checks = _checks(report)
    servers = [setup.plugin.target, *(s.target for s in setup.engines.values())]
    assert checks["prometheus"]["data"]["instances"] == servers
    # The vLLM endpoint on the plugin's host is not a server of its own.
    assert setup.hidden.target not in checks
    assert "plugin" in checks[setup.plugin.target]["reason"]
    for name, server in setup.engines.items():
        line = checks[server.target]
        assert line["verdict"] in ("OK", "INFO"), line
        shown = re.search(r"acceptance ([0-9.]+)%", line["reason"])
        assert shown is not None, line
        assert float(shown.group(1)) == pytest.approx(WORKLOADS[name].acceptance * 100,
                                                      abs=0.3), line
    assert checks["needs the plugin"]["verdict"] == "SKIP"
    assert rc == 0, report


def test_doctor_fails_clearly_when_nothing_matches(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report = setup.doctor(capsys, "--selector", '{job="nope"}')
    assert rc == 2
    (check,) = report["checks"]
    assert check["verdict"] == "FAIL"
    assert "nor does it hold an engine's own speculative decoding series" in check["reason"]
    assert "vLLM" in check["reason"] and "llama.cpp" in check["reason"]


def test_top_reads_one_engine_server(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    trtllm = setup.engines["trtllm"]
    rc, out, err = setup.top(capsys, f'{{instance="{trtllm.target}"}}', "--json")
    assert (rc, err) == (0, ""), (out, err)
    frame = json.loads(out)
    assert (frame["kind"], frame["source"], frame["engine"], frame["instance"]) == (
        "data", "engine", "TensorRT-LLM", trtllm.target)
    b = frame["breakdown"]
    w = WORKLOADS["trtllm"]
    assert b["acceptance_rate"] == pytest.approx(w.acceptance, rel=0.01)
    assert b["mean_acceptance_length"] == pytest.approx(1 + w.accepted_per_draft, rel=0.01)
    assert b["emitted_tokens_per_second"] == pytest.approx(w.emitted_per_second, rel=0.1)
    assert [p for p, _ in b["position_acceptance"]] == ["0", "1"]
    assert [v for _, v in b["position_acceptance"]] == pytest.approx([0.9, 0.72], rel=0.01)
    assert b["requests_running"] == w.running and b["requests_waiting"] == w.waiting
    # No cycle count, phase or speedup to read as zero: named as needing the plugin instead.
    assert not {"cycles", "stats", "speedup_realized", "dropped_total"} & set(b)
    assert frame["needs_plugin"] == [name for name, _ in es.NEEDS_PLUGIN]
    assert frame["status"] is not None and not math.isnan(b["acceptance_rate"])

    rc, out, err = setup.top(capsys, f'{{instance="{trtllm.target}"}}', "--plain")
    assert (rc, err) == (0, ""), (out, err)
    assert "source=engine engine=TensorRT-LLM" in out
    assert "speedup=needs_the_plugin" in out
    accept = re.search(r" accept=([0-9.]+)% ", out)
    assert accept is not None and float(accept.group(1)) == pytest.approx(w.acceptance * 100,
                                                                          abs=0.3), out


def test_top_asks_for_one_engine_server(setup: Setup, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    rc, out, _ = setup.top(capsys, '{job=~"vllm|sglang"}', "--plain")
    assert rc == 1
    assert "2 servers without the plugin match" in out and "narrow --selector" in out


def test_top_live_view_of_an_engine_server_names_what_needs_the_plugin(setup: Setup) -> None:
    import httpx
    from rich.console import Console

    from specobs.tools._top._sources import PrometheusSource
    from specobs.tools._top._views import LiveView

    vllm = setup.engines["vllm"]
    with httpx.Client(timeout=5) as client:
        frame = PrometheusSource(client, setup.prometheus.url,
                                 f'instance="{vllm.target}"', 5.0).poll()
    assert frame.kind == "data" and frame.engine == "vLLM", frame
    console = Console(record=True, width=140, color_system=None)
    console.print(LiveView("test", 2.0, console).render(frame, None))
    text = console.export_text()
    assert f"vLLM's own series at {vllm.target}: no specobs plugin" in text
    for name, _ in es.NEEDS_PLUGIN:
        assert f"{name}: {es.NEEDS_PLUGIN_TEXT}" in text, text
    assert re.search(r"acceptance (59\.\d|60\.\d)%", text) and "per position" in text, text
    # Nothing of the plugin's cycle view: no clock tables, no drops line.
    assert "host clock:" not in text and "drops" not in text
