"""The Prometheus sink: exposition bytes, promtool, a real Prometheus server, mounting modes."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

import specobs
from specobs import catalog
from specobs.timing import FakeEventClock, FakeGpu
from tests._prometheus_server import free_port, promtool

GOLDEN = Path(__file__).parent / "golden"


def fixed_observer(registry):
    """An observer whose aggregation holds exactly known values (no clocks involved)."""
    sink = specobs.PrometheusSink(registry=registry)
    obs = specobs.configure(sinks=[sink], clock="host", max_draft_length=2,
                            labels={"model": "m", "engine": "e"}, baseline_tokens_per_second=40.0)
    agg = obs.aggregation
    with agg.lock:
        agg.info["version"] = "X"
        agg.created_unix_seconds = 1699999990.0  # counters carry it as _created
        agg.phase_host[0].counts[6] = 3  # draft, (0.0005, 0.001]
        agg.phase_host[0].sum = 0.0024
        agg.phase_gpu[1].counts[9] = 2  # verify, (0.005, 0.01]
        agg.phase_gpu[1].sum = 0.016
        agg.cycle_host.counts[10] = 3
        agg.cycle_host.sum = 0.05
        agg.cycles = 3
        agg.draft_tokens = 12
        agg.accepted_tokens = 7
        agg.emitted_tokens = 13
        agg.sampled_cycles = 2
        agg.accept_length.counts[:] = [1, 1, 4, 0, 0]
        agg.accept_length.sum = 9
        agg.drafted_by_k[2] = 6
        agg.batch_size.counts[1] = 3
        agg.batch_size.sum = 6
        agg.last_cycle_timestamp = 1700000000.5
        agg.requests_waiting = 1.0
        agg.requests_running = 2.0
        agg.dropped["queue_full"] = 4
        agg.errors["wrong_phase_order"] = 1
        agg.cpu_seconds.clear()
        agg.cpu_seconds.update({"hot_path": 0.25, "resolver": 0.5})
        agg.sampling_interval = 4
        agg.overhead_ratio = 0.002
        from specobs._aggregation import Exemplar

        agg.phase_gpu[1].exemplars[9] = Exemplar(0.008, "0" * 31 + "1", "0" * 15 + "2",
                                                 1700000000.25)
    return obs, sink


def strip_scrape_cpu(text: str) -> str:
    # The collector adds its own CPU time under component="prometheus": not deterministic.
    return "\n".join(x for x in text.splitlines() if 'component="prometheus"' not in x) + "\n"


@pytest.mark.parametrize(("name", "render"), [
    ("exposition.txt", generate_latest),
    ("exposition.openmetrics.txt", generate_openmetrics),
])
def test_exposition_is_golden(name, render):
    registry = CollectorRegistry()
    obs, _ = fixed_observer(registry)
    text = strip_scrape_cpu(render(registry).decode())
    obs.shutdown()
    golden = GOLDEN / name
    if not golden.exists():  # pragma: no cover - bootstrapping a new golden file
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
        pytest.fail(f"wrote {golden}; review it and commit it")
    assert text == golden.read_text()



def strip_cpu(text: str) -> str:
    # Every CPU counter may move between two renders (the resolver thread runs meanwhile).
    return "\n".join(x for x in text.splitlines()
                     if not x.startswith("specobs_exporter_cpu_time_seconds_total")) + "\n"


@pytest.mark.parametrize("accept", [
    "", "text/plain;version=0.0.4", "text/plain; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text", "application/openmetrics-text; version=1.0.0",
])
def test_the_endpoint_serves_prometheus_client_bytes_from_its_cache(accept):
    """The endpoint encodes with cached prefixes (issue 15): the same bytes as
    prometheus_client's encoders, for every format it negotiates, exemplars and odd label
    values included, and the golden files through the endpoint's own path."""
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry()
    obs, sink = fixed_observer(registry)
    encoder, _ = choose_encoder(accept)
    for _ in range(2):  # a cold and a warm cache
        with obs.aggregation.lock:
            obs.aggregation.generation += 1
            obs.aggregation.cycles += 1
        _, ctype, body, _ = sink._render(accept, "")
        assert strip_cpu(body.decode()) == strip_cpu(encoder(registry).decode())
    assert sink.renders == 2
    obs.shutdown()
    registry = CollectorRegistry()
    obs, sink = fixed_observer(registry)
    golden = "exposition.openmetrics.txt" if "openmetrics" in accept else "exposition.txt"
    _, _, body, _ = sink._render(accept, "")
    assert strip_scrape_cpu(body.decode()) == (GOLDEN / golden).read_text()
    obs.shutdown()


def test_the_cached_encoder_handles_label_values_that_need_escaping():
    from prometheus_client.openmetrics.exposition import generate_latest as om

    registry = CollectorRegistry()
    sink = specobs.PrometheusSink(registry=registry)
    obs = specobs.configure(sinks=[sink], clock="host",
                            labels={"model": 'a "b" \\ c\nd', "engine": "é ü"})
    with obs.cycle() as c:
        c.mark("verify")
        c.mark("bookkeeping")
        c.accept([1, 0], draft_length=2)
    obs.force_flush()
    for accept, encoder in (("", generate_latest), ("application/openmetrics-text", om)):
        _, _, body, _ = sink._render(accept, "")
        assert strip_cpu(body.decode()) == strip_cpu(encoder(registry).decode())
    obs.shutdown()

def test_promtool_check_metrics_is_clean():
    registry = CollectorRegistry()
    obs, _ = fixed_observer(registry)
    text = generate_latest(registry).decode()
    obs.shutdown()
    res = promtool("check", "metrics", input=text)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (res.stdout + res.stderr).strip() == ""


def test_every_catalog_metric_is_exposed_with_constant_labels():
    registry = CollectorRegistry()
    obs, _ = fixed_observer(registry)
    samples = {s.name: s for m in registry.collect() for s in m.samples}
    obs.shutdown()
    for m in catalog.CATALOG:
        for series in m.series():
            assert series in samples, series
            if m is not catalog.INFO:
                assert samples[series].labels.get("model") == "m", series
    # Cardinality is fixed: phases x clocks x buckets, positions <= k, reasons and kinds enumerated.
    assert sum(1 for m in registry.collect() for _ in m.samples) < 400



def test_own_endpoint_from_environment_and_content_negotiation(monkeypatch):
    port = free_port()
    monkeypatch.setenv("SPECOBS_PROMETHEUS_PORT", str(port))
    monkeypatch.setenv("SPECOBS_EXPORTERS", "prometheus")
    obs = specobs.configure(clock="host")
    (sink,) = obs.sinks
    assert sink.port == port and sink.addr == "127.0.0.1"
    with obs.cycle() as c:
        c.mark("verify")
        c.mark("bookkeeping")
    obs.force_flush()
    with urllib.request.urlopen(sink.url) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        assert b"specobs_cycles_total 1.0" in r.read()
    req = urllib.request.Request(sink.url, headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().rstrip().endswith(b"# EOF")
    obs.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(specobs.ConfigurationError, match=rf"127\.0\.0\.1:{port}.*free port"):
            specobs.configure(sinks=[specobs.PrometheusSink(port=port)], clock="host")
    with pytest.raises(specobs.ConfigurationError, match=r"port must be an integer in 0\.\.65535"):
        specobs.PrometheusSink(port=70000)
    with pytest.raises(specobs.ConfigurationError, match="SPECOBS_PROMETHEUS_PORT"):
        specobs.configure(env={"SPECOBS_EXPORTERS": "prometheus",
                               "SPECOBS_PROMETHEUS_PORT": "http"}, clock="host")


def test_mounted_into_the_servers_registry_and_as_wsgi_app():
    registry = CollectorRegistry()
    own = Counter("server_requests", "the server's own metric", registry=registry)
    own.inc(5)
    sink = specobs.PrometheusSink(registry=registry)
    obs = specobs.configure(sinks=[sink], clock="host")
    assert sink.port is None  # nothing served: the server already exposes `registry`
    with obs.cycle() as c:
        c.mark("verify")
        c.mark("bookkeeping")
        c.accept([2], draft_length=3)
    obs.force_flush()
    text = generate_latest(registry).decode()
    assert "server_requests_total 5.0" in text
    assert "specobs_accepted_tokens_total 2.0" in text
    env: dict = {}
    setup_testing_defaults(env)
    env["PATH_INFO"] = "/metrics"
    status: list[str] = []
    body = b"".join(sink.wsgi_app()(env, lambda s, h: status.append(s)))
    assert status == ["200 OK"] and b"specobs_cycles_total 1.0" in body
    obs.shutdown()
    assert "specobs_cycles_total" not in generate_latest(registry).decode()  # unregistered


def test_all_ranks_get_a_rank_label_and_their_own_port():
    port = free_port()
    env = {"SPECOBS_EXPORTERS": "prometheus", "SPECOBS_PROMETHEUS_PORT": str(port - 1),
           "RANK": "1", "SPECOBS_ALL_RANKS": "1"}
    obs = specobs.configure(env=env, clock="host")
    (sink,) = obs.sinks
    assert sink.port == port
    with urllib.request.urlopen(sink.url) as r:
        assert b'specobs_cycles_total{rank="1"} 0.0' in r.read()
    obs.shutdown()
    # Rank 1 without SPECOBS_ALL_RANKS: nothing served, nothing recorded.
    obs = specobs.configure(env={**env, "SPECOBS_ALL_RANKS": "0"}, clock="host")
    assert obs.sinks == [] and obs.settings.enabled is False
    obs.shutdown()


@pytest.mark.slow
def test_real_prometheus_scrapes_values_and_exemplars(prometheus_server):
    gpu = FakeGpu()
    sink = specobs.PrometheusSink(port=0)
    mem = specobs.MemorySink(traces=True)
    obs = specobs.configure(sinks=[sink, mem], clock=FakeEventClock(gpu, pool_size=4096),
                            sample_every=2, trace_head_rate=1.0, labels={"model": "demo"},
                            poll_interval_seconds=0.01)
    for i in range(40):
        with obs.cycle(batch_size=2) as c:
            gpu.run(200_000)  # 0.2 ms draft
            c.mark("verify")
            gpu.run(3_000_000 if i % 2 == 0 else 1_000_000)
            c.mark("bookkeeping")
            gpu.run(50_000)
            c.accept([i % 4, 3], draft_length=3)
        gpu.complete()
    assert obs.force_flush()
    server = prometheus_server([f"127.0.0.1:{sink.port}"])
    server.wait_for_target_up(timeout_seconds=30)
    res = server.wait_for("specobs_cycles_total", timeout_seconds=30)
    assert float(res[0]["value"][1]) == 40
    assert res[0]["metric"]["model"] == "demo" and res[0]["metric"]["job"] == "specobs"
    accepted = sum(i % 4 + 3 for i in range(40))
    res = server.query("specobs_accepted_tokens_total")
    assert float(res[0]["value"][1]) == accepted
    res = server.query('specobs_phase_duration_seconds_sum{phase="verify",clock="gpu"}')
    assert float(res[0]["value"][1]) == pytest.approx(20 * 0.003)  # sampled: even cycles
    res = server.query('specobs_phase_duration_seconds_count{phase="draft",clock="host"}')
    assert float(res[0]["value"][1]) == 40
    res = server.query('sum(specobs_accepted_tokens_by_position_total)')
    assert float(res[0]["value"][1]) == accepted
    res = server.query('specobs_accepted_tokens_by_position_total{position="2"}')
    assert float(res[0]["value"][1]) == 40 + 10  # every second sequence, plus i%4 == 3
    # Exemplars: trace ids Prometheus stored are the traced cycles' ids.
    now = time.time()
    ex = server.query_exemplars('specobs_phase_duration_seconds_bucket{clock="gpu"}',
                                now - 600, now + 60)
    got = {e["labels"]["trace_id"] for series in ex for e in series["exemplars"]}
    traced = {f"{c.trace_id:032x}" for c in mem.cycles if c.trace_id and c.gpu_ns}
    assert got and got <= traced
    obs.shutdown()
