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


def _hist(bounds, counts_at, total):
    counts = [0] * (len(bounds) + 1)
    exemplars = [None] * (len(bounds) + 1)
    for index, value in counts_at.items():
        if isinstance(value, tuple):
            value, exemplars[index] = value
        counts[index] = value
    return specobs.HistogramData(tuple(bounds), tuple(counts), total, sum(counts),
                                 tuple(exemplars))


def fixed_snapshot() -> specobs.Snapshot:
    """A snapshot of exactly known values, written as data (no observer, no clocks)."""
    d = catalog.DURATION_BUCKETS_SECONDS
    phases = ("draft", "verify", "bookkeeping")
    empty = _hist(d, {}, 0.0)
    phase = {(p, c): empty for p in phases for c in ("gpu", "host")}
    phase[("draft", "host")] = _hist(d, {6: 3}, 0.0024)  # (0.0005, 0.001]
    exemplar = specobs.Exemplar(0.008, 1, 2, 1_700_000_000_250_000_000)
    phase[("verify", "gpu")] = _hist(d, {9: (2, exemplar)}, 0.016)  # (0.005, 0.01]
    return specobs.Snapshot(
        phases=phases, max_draft_length=2, labels={"model": "m", "engine": "e"},
        info={"version": "X", "phases": ",".join(phases), "gpu_clock": "none",
              "sampling": "adaptive", "integration": "manual", "core": "native"},
        cycles_total=3, draft_tokens_total=12, accepted_tokens_total=7, emitted_tokens_total=13,
        sampled_cycles_total=2, phase_histograms=phase,
        cycle_histograms={"gpu": empty, "host": _hist(d, {10: 3}, 0.05)},
        accept_length=_hist(catalog.accept_length_buckets(2), {0: 1, 1: 1, 2: 4}, 9.0),
        drafted_by_position=(6, 6), batch_size=_hist(catalog.BATCH_SIZE_BUCKETS, {1: 3}, 6.0),
        last_cycle_timestamp_seconds=1700000000.5, baseline_tokens_per_second=40.0,
        requests_running=2.0, requests_waiting=1.0,
        dropped={**dict.fromkeys(catalog.DROP_REASONS, 0), "queue_full": 4},
        errors={**dict.fromkeys(catalog.ERROR_KINDS, 0), "wrong_phase_order": 1},
        cpu_seconds={"hot_path": 0.25, "resolver": 0.5}, sampling_interval=4,
        overhead_ratio=0.002, created_unix_nano=1_699_999_990_000_000_000,
        worker_thread_seconds={"running": 1.5, "waiting": 0.25}, sampling_budget_ratio=0.005,
        # One plain step (k = 0: two sequences, a token each) and two cycles at k = 2.
        cycles_by_draft_length={0: 1, 2: 2},
        phase_seconds_by_draft_length={0: (0.0004, 0.0005, 0.0001), 2: (0.002, 0.012, 0.001)},
        emitted_by_draft_length={0: 2, 2: 11}, accepted_by_draft_length={0: 0, 2: 7},
        sequences_by_draft_length={0: 2, 2: 6}, batch_by_draft_length={0: 2, 2: 4},
        # Three cycles of one thread: one gap of 0.3 ms, one idle gap (over the idle bound).
        cycle_gap=_hist(d, {5: 1}, 0.0003), idle_gaps_total=1,
        # Requests at 0.0 (traced: its exemplar has no span id), 0.55 and 0.6; one drafted none.
        request_acceptance=_hist(catalog.REQUEST_ACCEPTANCE_BUCKETS, {
            0: (1, specobs.Exemplar(0.0, 3, None, 1_700_000_000_500_000_000)), 7: 2}, 1.15),
        requests_finished_total=4,
        draft_tokens_unverified=6,
    )


class FixedSource:
    """A MetricSource serving one snapshot; counts what sinks write back."""

    def __init__(self, snapshot: specobs.Snapshot) -> None:
        self.snap = snapshot
        self.generation = 0
        self.cpu: dict[str, float] = {}
        self.dropped: dict[str, int] = {}

    def snapshot(self) -> specobs.Snapshot:
        return self.snap

    def add_cpu(self, component: str, seconds: float) -> None:
        self.cpu[component] = self.cpu.get(component, 0.0) + seconds

    def count_dropped(self, reason: str, n: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def fixed_sink(registry):
    """A Prometheus sink attached to a :class:`FixedSource` of :func:`fixed_snapshot`."""
    source = FixedSource(fixed_snapshot())
    sink = specobs.PrometheusSink(registry=registry)
    sink.attach(source)
    return source, sink


def test_the_sinks_source_is_a_protocol_the_aggregation_implements():
    from specobs.sinks import MetricSource

    obs = specobs.configure(sinks=[], clock="host")
    assert isinstance(obs.aggregation, MetricSource)
    assert isinstance(FixedSource(fixed_snapshot()), MetricSource)
    obs.shutdown()


@pytest.mark.parametrize("render", [generate_latest, generate_openmetrics])
def test_only_the_cycle_counter_carries_created_unless_asked(render):
    """``_created`` is a series of its own in Prometheus: by default only
    specobs_cycles_total has one (the observer's start); ``"all"`` gives every counter its own,
    ``"none"`` none; anything else is a clear error."""
    counters = {m.base_name for m in catalog.CATALOG if m.kind == "counter"}

    def created(mode):
        registry = CollectorRegistry()
        sink = specobs.PrometheusSink(registry=registry, created_series=mode)
        sink.attach(FixedSource(fixed_snapshot()))
        try:
            text = render(registry).decode()
        finally:
            sink.shutdown(1.0)
        return {line.split("{")[0].split()[0].removesuffix("_created")
                for line in text.splitlines()
                if line and not line.startswith("#") and "_created" in line.split()[0]}

    assert created("cycles") == {catalog.CYCLES.base_name}
    assert created("none") == set()
    everyone = created("all")
    assert catalog.CYCLES.base_name in everyone and len(everyone) >= 10
    assert everyone <= counters
    with pytest.raises(specobs.ConfigurationError, match="created_series must be one of"):
        specobs.PrometheusSink(registry=CollectorRegistry(), created_series="some")


def strip_scrape_cpu(text: str) -> str:
    # The collector adds its own CPU time under component="prometheus": not deterministic.
    return "\n".join(x for x in text.splitlines() if 'component="prometheus"' not in x) + "\n"


@pytest.mark.parametrize(("name", "render"), [
    ("exposition.txt", generate_latest),
    ("exposition.openmetrics.txt", generate_openmetrics),
])
def test_exposition_is_golden(name, render):
    registry = CollectorRegistry()
    _, sink = fixed_sink(registry)
    text = strip_scrape_cpu(render(registry).decode())
    sink.shutdown(1.0)
    golden = GOLDEN / name
    if not golden.exists():  # pragma: no cover - bootstrapping a new golden file
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
        pytest.fail(f"wrote {golden}; review it and commit it")
    assert text == golden.read_text()


def strip_cpu(text: str) -> str:
    # Every CPU counter may move between two renders (the resolver thread runs meanwhile, and
    # each snapshot reads the recording thread's times).
    return "\n".join(x for x in text.splitlines()
                     if not x.startswith(("specobs_exporter_cpu_time_seconds_total",
                                          "specobs_worker_thread_time_seconds_total"))) + "\n"


@pytest.mark.parametrize("accept", [
    "", "text/plain;version=0.0.4", "text/plain; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text", "application/openmetrics-text; version=1.0.0",
])
def test_the_endpoint_serves_prometheus_client_bytes_from_its_cache(accept):
    """The endpoint encodes with cached prefixes: the same bytes as
    prometheus_client's encoders, for every format it negotiates, exemplars and odd label
    values included, and the golden files through the endpoint's own path."""
    from prometheus_client.exposition import choose_encoder

    source = FixedSource(fixed_snapshot())
    sink = specobs.PrometheusSink(port=0)  # its own registry: the cached encoder serves it
    sink.attach(source)
    registry = sink.registry
    cached = []
    encode = sink._exposition.encode
    sink._exposition.encode = lambda *a: cached.append(1) or encode(*a)  # type: ignore[method-assign]
    encoder, _ = choose_encoder(accept)
    for _ in range(2):  # a cold and a warm cache
        source.generation += 1
        _, ctype, body, _ = sink._render(accept, "")
        assert strip_cpu(body.decode()) == strip_cpu(encoder(registry).decode())
    assert sink.renders == 2 and len(cached) == 2
    # Anything else in the registry: prometheus_client encodes it (and sees the other metric).
    from prometheus_client import Counter

    Counter("server_requests", "the server's own metric", registry=registry)
    source.generation += 1
    _, _, body, _ = sink._render(accept, "")
    assert len(cached) == 2 and "server_requests" in body.decode()
    sink.shutdown(1.0)
    registry = CollectorRegistry()
    _, sink = fixed_sink(registry)
    golden = "exposition.openmetrics.txt" if "openmetrics" in accept else "exposition.txt"
    _, _, body, _ = sink._render(accept, "")
    assert strip_scrape_cpu(body.decode()) == (GOLDEN / golden).read_text()
    sink.shutdown(1.0)


def test_the_cached_encoder_handles_label_values_that_need_escaping():
    from prometheus_client.openmetrics.exposition import generate_latest as om

    registry = CollectorRegistry()
    sink = specobs.PrometheusSink(registry=registry)
    obs = specobs.configure(sinks=[sink], clock="host",
                            labels={"model": 'a "b" \\ c', "engine": "é ü"})
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
    _, sink = fixed_sink(registry)
    text = generate_latest(registry).decode()
    sink.shutdown(1.0)
    res = promtool("check", "metrics", input=text)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (res.stdout + res.stderr).strip() == ""


def test_every_catalog_metric_is_exposed_with_constant_labels():
    registry = CollectorRegistry()
    _, sink = fixed_sink(registry)
    samples = {s.name: s for m in registry.collect() for s in m.samples}
    sink.shutdown(1.0)
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
    label = catalog.EXEMPLAR_TRACE_ID_LABEL
    got = {e["labels"][label] for series in ex for e in series["exemplars"]}
    traced = {f"{c.trace_id:032x}" for c in mem.cycles if c.trace_id and c.gpu_ns}
    assert got and got <= traced
    obs.shutdown()
