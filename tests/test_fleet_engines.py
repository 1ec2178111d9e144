"""``specobs fleet-sim --engines``: the mix of server kinds, each engine's own exposition as the
rules' table has it, values that follow the simulated cycles (faults included), and a plugin
host serving both endpoints. The fleet against a real Prometheus is in test_fleet_sim.py."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from specobs.cli import main
from specobs.mixin import _engines
from specobs.tools.fleet._engine_series import series_values
from specobs.tools.fleet._mix import MixError, describe_layout, kinds, layout, parse_mix
from specobs.tools.fleet._schedule import Fault
from specobs.tools.fleet._sim import CLUSTERS, MODELS, Fleet, SimServer
from tests._prometheus_server import promtool

ENGINE_NAMES = [e.name for e in _engines.ENGINES]
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"

# -- the mix ---------------------------------------------------------------------------------------


def test_the_mix_shares_servers_out_by_weight_in_blocks() -> None:
    mix = parse_mix("vllm:2, plugin:1")
    assert [(k.name, w) for k, w in mix] == [("vllm", 2.0), ("plugin", 1.0)]
    servers = layout(10, mix)
    # 6.67 and 3.33 servers: the larger remainder gets the tenth.
    assert [(k.name, j) for k, j in servers] == [("vllm", j) for j in range(7)] + [
        ("plugin", j) for j in range(3)]
    assert describe_layout(servers) == "0-6 vllm, 7-9 plugin"
    three = parse_mix("sglang,trtllm,lmdeploy")
    assert describe_layout(layout(2, three)) == "0 sglang, 1 trtllm"
    assert describe_layout(layout(7, three)) == "0-2 sglang, 3-4 trtllm, 5-6 lmdeploy"
    k = kinds()
    assert (k["plugin"].plugin, k["plugin"].engine_series, k["plugin"].engine) == (True, False,
                                                                                   None)
    assert (k["vllm+plugin"].plugin, k["vllm+plugin"].engine_series) == (True, True)
    assert (k["llamacpp"].plugin, k["llamacpp"].source) == (False, "engine")
    assert set(ENGINE_NAMES) < set(k)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vllm,tgi", "unknown server kind 'tgi'"),
        ("trtllm+plugin", "the simulated plugin runs in vllm or sglang; trtllm is served "
                          "engine-only as 'trtllm'"),
        ("vllm:0", "the weight of vllm must be > 0, got '0'"),
        ("vllm:x", "the weight of vllm must be a number, got 'x'"),
        ("vllm,plugin,vllm:2", "'vllm' is given twice"),
        ("", "unknown server kind ''"),
    ],
)
def test_a_bad_mix_says_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(MixError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_mix(text)


def test_bad_engines_and_models_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet-sim", "--engines", "sglang+plugin,tensorrt"]) == 2
    assert "unknown server kind 'tensorrt'" in capsys.readouterr().err
    # A rollout of a model the fleet does not serve: two models are the first two.
    assert main(["fleet-sim", "--models", "2", "--fault",
                 "bad_rollout model=qwen2.5-32b at=1"]) == 2
    assert "['llama-3.1-8b', 'llama-3.1-70b']" in capsys.readouterr().err


def test_the_default_fleet_is_the_plugin_fleet_it_always_was() -> None:
    """Without --engines every server runs the plugin, in vLLM or SGLang, laid out as before
    the mix existed: benchmarks and fault schedules written for it aim at the same servers."""
    fleet = Fleet(20, [], seed=2)
    for i, s in enumerate(fleet.servers):
        engine = ("vllm", "sglang")[(i // 4) % 2]
        assert (s.model, s.engine, s.cluster) == (MODELS[i % 4], engine, CLUSTERS[(i // 8) % 2])
        assert s.integration == {"vllm": "vllm_v1", "sglang": "sglang"}[engine]
        assert (s.instance, s.path, s.endpoints) == (f"sim-{i:04d}-r0:9477",
                                                     f"/s/{i}/r0/metrics", ("specobs",))
        assert s.labels() == {"cluster": s.cluster, "namespace": "inference",
                              "instance": s.instance, "pod": s.pod, "host": s.pod,
                              "model_name": s.model.name, "serving_engine": engine,
                              "source": "plugin"}
    assert set(fleet.by_path) == {s.path for s in fleet.servers}


# -- each engine's exposition ----------------------------------------------------------------------

def _server(engine: str, seconds: float = 60.0) -> SimServer:
    """An engine-only server that has run ``seconds``."""
    server = Fleet(1, [], seed=4, mix=parse_mix(engine)).servers[0]
    server.advance(time.time(), server.last_advance + seconds)
    return server


def _samples(body: bytes, openmetrics: bool = False) -> dict[str, dict[tuple[tuple[str, str],
                                                                            ...], float]]:
    parse = parse_om if openmetrics else parse_text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in parse(body.decode()):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_each_engine_serves_the_tables_series_as_the_engine_writes_them(engine: str) -> None:
    """Every family of the rules' table for this engine, and nothing else: its name, type, HELP
    and label names; the same names over OpenMetrics (colons kept); promtool finds nothing
    wrong but the colons the engines chose."""
    table = _engines.by_name()[engine]
    server = _server(engine)
    ctype, text = server.render("")
    assert ctype.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in parse_text(text.decode())}
    want = {m.name.removesuffix("_total") if m.type == "counter" else m.name: m
            for m in table.metrics}
    assert set(families) == set(want)
    for name, m in want.items():
        family = families[name]
        assert (family.type, family.documentation) == (m.type, m.help), name
        assert family.samples and {s.name for s in family.samples} == {m.name}, name
        for s in family.samples:
            assert set(s.labels) == set(m.labels), (name, s.labels)
            if "model_name" in m.labels:
                assert s.labels["model_name"] == server.model.name
    ctype, om = server.render(OPENMETRICS)
    if engine == "llamacpp":  # its server writes the text format whatever the Accept header
        assert (ctype, om) == server.render("")
    else:
        assert ctype.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n")
        om_samples, text_samples = _samples(om, openmetrics=True), _samples(text)
        assert {n: set(v) for n, v in om_samples.items()} == {
            n: set(v) for n, v in text_samples.items()}
        # The same values, but the queue length: a fresh draw at each scrape.
        for name in set(text_samples) - set(table.request_gauges):
            assert om_samples[name] == text_samples[name], name
    check = promtool("check", "metrics", input=text.decode())
    problems = [line for line in check.stdout.splitlines() if line.strip()]
    assert all(line.endswith("metric names should not contain ':'") for line in problems), (
        check.stdout + check.stderr)
    assert check.returncode in (0, 3), check.stderr  # 3: lint problems only


def test_the_table_and_the_simulator_agree_on_every_series() -> None:
    """Every series of the rules' table has a simulated value: a series added to the table
    without one here fails this test, not a fleet run."""
    state = _server("vllm").engine_state()
    for engine in _engines.ENGINES:
        for m in engine.metrics:
            value = series_values(m, state)
            positional = any(lab in ("position", "token_position") for lab in m.labels)
            assert isinstance(value, dict) == positional, m.name
    with pytest.raises(KeyError, match="no value for the engine series vllm:made_up"):
        series_values(_engines.EngineMetric("vllm:made_up", "gauge", (), ""), state)


def _acceptance(engine: str, body: bytes, earlier: bytes | None = None) -> float:
    """The acceptance an engine's own series give, as the rules compute it: accepted over drafted
    tokens between two scrapes (the counters' rate), or SGLang's gauge."""
    now = _samples(body)
    if engine == "sglang":
        return next(iter(now["sglang:spec_accept_rate"].values()))
    prefix = {"vllm": "vllm:", "llamacpp": "llamacpp:", "lmdeploy": "lmdeploy:",
              "trtllm": "trtllm_"}[engine]
    then = _samples(earlier) if earlier is not None else defaultdict(dict)

    def delta(name: str) -> float:
        full = f"{prefix}spec_decode_num_{name}_total"
        return sum(now[full].values()) - sum(then[full].values())

    return delta("accepted_tokens") / delta("draft_tokens")


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_an_engines_counters_follow_the_simulated_cycles_and_show_a_collapse(
        engine: str) -> None:
    """The acceptance an engine's own series give is the server's simulated acceptance, before
    an acceptance collapse and during it; the counters hold together (drafted tokens are k per
    draft, generated tokens the accepted plus one per draft, per position sums to the total)."""
    server = _server(engine)
    k = server.model.draft_length
    healthy = server.hists["accept"].mean / k
    _, body = server.render("")
    assert _acceptance(engine, body) == pytest.approx(healthy, rel=0.01)
    st = server.engine_state()
    assert st.accepted == sum(j * int(c) for j, c in enumerate(server.hists["accept"].counts))
    assert st.generated == st.accepted + st.drafts
    samples = _samples(body)
    if engine in ("vllm", "llamacpp", "lmdeploy"):
        p = f"{engine}:spec_decode_num_"
        drafts = next(iter(samples[f"{p}drafts_total"].values()))
        assert next(iter(samples[f"{p}draft_tokens_total"].values())) == drafts * k
        by_pos = samples[f"{p}accepted_tokens_per_pos_total"]
        assert len(by_pos) == k
        assert sum(by_pos.values()) == next(iter(samples[f"{p}accepted_tokens_total"].values()))
    if engine == "sglang":
        verify = next(iter(samples["sglang:spec_verify_calls_total"].values()))
        # Counted per finished request: whole requests, behind the steps taken.
        assert verify % 200 == 0 and st.drafts - 200 < verify <= st.drafts
        length = next(iter(samples["sglang:spec_accept_length"].values()))
        assert length == pytest.approx(1 + healthy * k)
    server.set_fault(time.time(), server.last_advance, acceptance_factor=0.3)
    server.advance(time.time(), server.last_advance + 60.0)
    _, later = server.render("")
    collapsed = server.hists["accept"].mean / k
    assert collapsed < 0.5 * healthy
    assert _acceptance(engine, later, body) == pytest.approx(collapsed, rel=0.02)


def test_a_stalled_engine_keeps_its_requests_and_stops_counting() -> None:
    server = _server("vllm", 30.0)
    _, before = server.render("")
    server.set_fault(time.time(), server.last_advance, stalled=True)
    server.advance(time.time(), server.last_advance + 60.0)
    _, after = server.render("")
    a, b = _samples(before), _samples(after)
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:generation_tokens_total"):
        assert a[name] == b[name], name
    assert next(iter(b["vllm:num_requests_running"].values())) == round(server.batch) > 0


# -- endpoints, targets, faults --------------------------------------------------------------------

def test_a_plugin_host_serves_both_endpoints_and_faults_hit_the_right_one(tmp_path: Path) -> None:
    """A ``vllm+plugin`` server: specobs's endpoint and vLLM's own on one pod, the engine's
    under its own job; a llama.cpp server gets its model's name from its target. exporter_down
    breaks the plugin's endpoint (vLLM's keeps answering) or an engine-only server's own; a
    rollout moves every endpoint to the new pod."""
    targets = tmp_path / "targets.json"
    fleet = Fleet(3, [], seed=1, mix=parse_mix("vllm+plugin,llamacpp,sglang"),
                  targets_path=targets, scrape_failure_ratio=0.0, restarts_per_hour=0.0)
    fleet.address = "127.0.0.1:9470"
    fleet.write_targets()
    groups = [g["labels"] for g in json.loads(targets.read_text())]
    plugin, llamacpp, sglang = fleet.servers
    assert groups == [
        {"__metrics_path__": "/s/0/r0/metrics", "instance": "sim-0000-r0:9477",
         "pod": "sim-0000-r0", "cluster": plugin.cluster, "namespace": "inference"},
        {"__metrics_path__": "/s/0/r0/vllm/metrics", "instance": "sim-0000-r0:8000",
         "pod": "sim-0000-r0", "cluster": plugin.cluster, "namespace": "inference",
         "job": "vllm"},
        {"__metrics_path__": "/s/1/r0/llamacpp/metrics", "instance": "sim-0001-r0:8080",
         "pod": "sim-0001-r0", "cluster": llamacpp.cluster, "namespace": "inference",
         "job": "llamacpp", "model_name": llamacpp.model.name},
        {"__metrics_path__": "/s/2/r0/sglang/metrics", "instance": "sim-0002-r0:30000",
         "pod": "sim-0002-r0", "cluster": sglang.cluster, "namespace": "inference",
         "job": "sglang"},
    ]
    assert plugin.labels()["instance"] == "sim-0000-r0:9477" and "job" not in plugin.labels()
    assert llamacpp.labels() == {
        "cluster": llamacpp.cluster, "namespace": "inference", "instance": "sim-0001-r0:8080",
        "pod": "sim-0001-r0", "host": "sim-0001-r0", "model_name": llamacpp.model.name,
        "serving_engine": "llamacpp", "source": "engine", "job": "llamacpp"}

    def status(path: str) -> int:
        return fleet.respond(path, "")[0]

    code, _, body = fleet.respond("/s/0/r0/metrics", "")
    assert code == 200 and b"specobs_cycles_total" in body and b"vllm:" not in body
    code, _, body = fleet.respond("/s/0/r0/vllm/metrics", "")
    assert code == 200 and b"vllm:spec_decode_num_drafts_total" in body and b"specobs" not in body
    down = Fault("exporter_down", 0.0, servers=(0, 1))
    fleet._apply(down, True, time.time(), time.monotonic())
    assert [status(p) for p in ("/s/0/r0/metrics", "/s/0/r0/vllm/metrics",
                                "/s/1/r0/llamacpp/metrics", "/s/2/r0/sglang/metrics")] == [
        503, 200, 503, 200]
    fleet._apply(down, False, time.time(), time.monotonic())
    rollout = Fault("bad_rollout", 0.0, model=plugin.model.name, factor=0.3)
    fleet._apply(rollout, True, time.time(), time.monotonic())
    assert status("/s/0/r0/vllm/metrics") == 404 and status("/s/0/r0/metrics") == 404
    assert status("/s/0/r1/vllm/metrics") == 200 and status("/s/0/r1/metrics") == 200
    rolled = {g["labels"]["instance"] for g in json.loads(targets.read_text())}
    assert {"sim-0000-r1:9477", "sim-0000-r1:8000"} <= rolled
    assert fleet.events[-1]["servers"][0]["instance"] == "sim-0000-r1:9477"


def test_the_command_serves_the_mix_and_says_which_servers_are_which(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    targets = tmp_path / "targets.json"
    code = main(["fleet-sim", "--servers", "5", "--port", "0", "--duration", "0.5",
                 "--engines", "lmdeploy:3,sglang+plugin:2", "--models", "1",
                 "--targets-file", str(targets)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(servers 0-2 lmdeploy, 3-4 sglang+plugin;" in out
    groups = [g["labels"] for g in json.loads(targets.read_text())]
    assert [(g["instance"], g.get("job")) for g in groups] == [
        ("sim-0000-r0:23333", "lmdeploy"), ("sim-0001-r0:23333", "lmdeploy"),
        ("sim-0002-r0:23333", "lmdeploy"), ("sim-0003-r0:9477", None),
        ("sim-0003-r0:30000", "sglang"), ("sim-0004-r0:9477", None),
        ("sim-0004-r0:30000", "sglang")]
