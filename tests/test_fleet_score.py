"""``specobs fleet-sim --score``: alerts read from a Prometheus, scored against the faults the run
injected. The Prometheus here is a stand-in answering the scoring query from the run's own
events file, so the test needs no Prometheus binary and no minutes of rule evaluation."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from specobs.cli import main
from specobs.mixin._config import MixinConfig
from specobs.mixin._rules import AlertNames, alert_rules
from specobs.tools.fleet._score import ALERT_MAP, first_firing_query


def test_the_scoring_map_names_only_alerts_the_rules_define() -> None:
    defined = {a.alert for a in alert_rules(MixinConfig())}
    assert set(AlertNames.all()) == defined
    for must, may in ALERT_MAP.values():
        assert must | may <= defined


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A stand-in Prometheus: every stall fault's servers fire the stall alert 5 s after the
    fault started, and one server no fault touched fires it too (a false positive)."""
    events = tmp_path / "events.jsonl"
    queries: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            queries.append(parse_qs(urlsplit(self.path).query)["query"][0])
            result = [{"metric": {"alertname": AlertNames.DECODING_STALLED,
                                  "alertstate": "firing", "host": "nobody", "cluster": "x"},
                       "value": [0, "1"]}]
            for line in events.read_text().splitlines():
                rec = json.loads(line)
                if rec["kind"] == "stall:start":
                    result += [{"metric": {"alertname": AlertNames.DECODING_STALLED,
                                           "alertstate": "firing", "host": s["host"],
                                           "cluster": s["cluster"]},
                                "value": [0, str(rec["t"] + 5)]} for s in rec["servers"]]
            body = json.dumps({"status": "success",
                               "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", queries
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_fleet_sim_scores_alerts_against_its_faults(
    tmp_path: Path, prometheus: tuple[str, list[str]], capsys: pytest.CaptureFixture[str],
) -> None:
    url, queries = prometheus
    code = main(["fleet-sim", "--servers", "4", "--port", "0", "--duration", "1",
                 "--restarts-per-hour", "0", "--scrape-failure-ratio", "0",
                 "--fault", "stall servers=1,2 at=0s",
                 "--events-file", str(tmp_path / "events.jsonl"),
                 "--targets-file", str(tmp_path / "targets.json"), "--score", url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(queries) == 1 and queries[0].startswith("min_over_time(timestamp(ALERTS{")
    row = next(line.split() for line in out.splitlines()
               if line.strip().startswith(AlertNames.DECODING_STALLED))
    # Two faulted hosts found (recall 100 %), one alert on an untouched host (precision 2/3).
    assert row[1:5] == ["2", "1", "67%", "100%"], out
    assert "1 faults scored" in out


def test_score_needs_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet-sim", "--score", "http://127.0.0.1:9"]) == 2
    assert "--score needs a --duration" in capsys.readouterr().err


def test_the_first_firing_query_covers_the_run() -> None:
    assert first_firing_query(125.4, 2.0) == (
        'min_over_time(timestamp(ALERTS{alertstate="firing", alertname=~"Specobs.*"})'
        "[125s:2s])")


def _server(pod: str, engine: str, model: str, source: str) -> dict[str, str]:
    """A server as fleet-sim's events name it: an engine-only one under its engine's job."""
    port = "9477" if source == "plugin" else "8000"
    server = {"cluster": "c", "namespace": "inference", "instance": f"{pod}:{port}", "pod": pod,
              "host": pod, "model_name": model, "serving_engine": engine, "source": source}
    return server | ({"job": engine} if source == "engine" else {})


def test_an_engine_only_servers_faults_are_judged_where_its_series_show_them() -> None:
    """A collapse and a rollout of an engine-only server are judged; its slowdown, stall and
    broken endpoint are not (no alert can see them: not a miss). A cohort alert of the engine's
    job names its engine-only servers and never the plugin's servers of the same model."""
    from specobs.tools.fleet._score import FaultEvent, judged, score, score_table

    engine_a = _server("e-a", "vllm", "m", "engine")
    engine_b = _server("e-b", "vllm", "m", "engine")
    plugin = _server("p-a", "vllm", "m", "plugin")
    faults = [
        FaultEvent("acceptance_collapse", 100.0, (engine_a,)),
        FaultEvent("verify_slowdown", 100.0, (engine_b, plugin)),
        FaultEvent("stall", 100.0, (engine_b,)),
        FaultEvent("exporter_down", 100.0, (engine_b,)),
        FaultEvent("bad_rollout", 100.0, (engine_a, plugin)),
    ]
    assert [judged(f.kind, s) for f in faults for s in f.servers] == [
        True, False, True, False, False, True, True]
    cohort = {"cluster": "c", "namespace": "inference", "model_name": "m",
              "serving_engine": "vllm"}
    firing = [
        ({"alertname": AlertNames.ACCEPTANCE_BELOW_COHORT, "instance": "e-a:8000"}, 130.0),
        ({"alertname": AlertNames.PHASE_LATENCY_ABOVE_COHORT, "instance": "p-a:9477"}, 140.0),
        # The rollout's drop, in the engine-only cohort only: the plugin's cohort is missed.
        ({"alertname": AlertNames.ACCEPTANCE_RATE_DROP, "job": "vllm", **cohort}, 135.0),
        # A rate drop of the plugin's cohort before any fault: named by no fault.
        ({"alertname": AlertNames.ACCEPTANCE_RATE_DROP, "job": "specobs", **cohort}, 50.0),
    ]
    scores = score(firing, faults)
    below = scores[AlertNames.ACCEPTANCE_BELOW_COHORT]
    assert (below.expected, below.detected, below.delays_seconds) == (1, 1, [30.0])
    phase = scores[AlertNames.PHASE_LATENCY_ABOVE_COHORT]
    assert (phase.expected, phase.detected) == (1, 1)  # the plugin server's only
    assert scores[AlertNames.DECODING_STALLED].expected == 0
    assert scores[AlertNames.EXPORTER_DOWN].expected == 0
    drop = scores[AlertNames.ACCEPTANCE_RATE_DROP]
    # Two cohorts expected (engine-only and plugin, told apart by job), one found.
    assert (drop.expected, drop.detected, drop.true_positives, drop.false_positives) == (
        2, 1, 1, 1)
    assert drop.false == [{"alertname": AlertNames.ACCEPTANCE_RATE_DROP, "job": "specobs",
                           **cohort}]
    table = score_table(scores, faults)
    assert table.splitlines()[-1] == (
        "  not judged (engine-only servers; their engine's series cannot show it): "
        "exporter_down on e-b:8000, stall on e-b:8000, verify_slowdown on e-b:8000")


def test_the_plugins_cohort_alert_is_not_credited_to_engine_only_servers() -> None:
    from specobs.tools.fleet._score import FaultEvent, score

    engine_a = _server("e-a", "sglang", "m", "engine")
    cohort = {"cluster": "c", "namespace": "inference", "model_name": "m",
              "serving_engine": "sglang"}
    faults = [FaultEvent("bad_rollout", 100.0, (engine_a,))]
    scores = score([({"alertname": AlertNames.ACCEPTANCE_RATE_DROP, "job": "specobs", **cohort},
                     120.0)], faults)
    drop = scores[AlertNames.ACCEPTANCE_RATE_DROP]
    assert (drop.expected, drop.detected, drop.false_positives) == (1, 0, 1)
