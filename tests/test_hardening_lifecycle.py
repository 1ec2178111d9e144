"""The metrics endpoint under hostile clients, fork, exit, configuration
edges. Fork and exit run in subprocesses."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

import specobs
from tests._prometheus_server import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cycles(obs, n, accepted=(1,)):
    for _ in range(n):
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(list(accepted), draft_length=2)


def scrape(url, **headers):
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read(), r.headers


def served(**kwargs):
    sink = specobs.PrometheusSink(port=0)
    obs = specobs.configure(sinks=[sink], clock="host", poll_interval_seconds=3600, **kwargs)
    return obs, sink


def test_slow_clients_are_bounded_and_cut_off_and_scrapes_still_answer():
    obs, sink = served()
    server = sink.server
    server.read_timeout_seconds = 0.5
    threads_before = threading.active_count()
    slow = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", sink.port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        slow.append(s)
    # 300 connections cost no thread: the endpoint is one thread.
    assert threading.active_count() <= threads_before
    assert server.connections() <= server.max_connections
    # Past the read deadline every slow connection is closed, and a scrape is answered.
    # (Connections still in the kernel's accept queue are not counted yet: wait for all 300.)
    deadline = time.monotonic() + 15
    while (server.connections() or server.refused + server.timed_out < 300) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert server.connections() == 0
    assert server.refused + server.timed_out >= 300
    body, _ = scrape(sink.url)
    assert b"specobs_cycles_total 0.0" in body
    for s in slow:
        s.close()
    # A client dripping its head a byte at a time is cut off by the deadline, not per read.
    drip = socket.create_connection(("127.0.0.1", sink.port))
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 3:
        try:
            drip.sendall(b"X")
        except OSError:
            closed = True
            break
        time.sleep(0.05)
        drip.settimeout(0.01)
        try:
            if drip.recv(1) == b"":
                closed = True
                break
        except (TimeoutError, BlockingIOError):
            pass
        except OSError:
            closed = True
            break
    drip.close()
    assert closed and time.monotonic() - t0 < 2.0
    obs.shutdown()
    assert not server.thread.is_alive()


def test_back_to_back_scrapes_cost_one_encode_per_resolver_update():
    obs, sink = served()
    sink.cache_max_age_seconds = 3600  # only a resolver update invalidates
    run_cycles(obs, 3)
    assert obs.force_flush()
    first, _ = scrape(sink.url)
    renders = sink.renders
    for _ in range(20):
        again, _ = scrape(sink.url)
        assert again == first
    assert sink.renders == renders and sink.cache_hits >= 20
    run_cycles(obs, 2)
    assert obs.force_flush()
    after, _ = scrape(sink.url)
    assert sink.renders == renders + 1
    assert b"specobs_cycles_total 5.0" in after
    # Formats and encodings are cached apart and negotiated as prometheus_client does.
    om, headers = scrape(sink.url, Accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.rstrip().endswith(b"# EOF") and b"specobs_cycles_created" in om
    zipped, headers = scrape(sink.url, **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"specobs_cycles_total 5.0" in gzip.decompress(zipped)
    obs.shutdown()


def test_self_reported_cpu_counts_encoding_and_http_not_only_collect():
    obs, sink = served()
    sink.cache_max_age_seconds = 0.0  # every scrape renders
    agg = obs.aggregation
    collector = sink.collector
    collect_only = 0.0
    real_collect = collector.collect

    def timed_collect():
        nonlocal collect_only
        t0 = time.thread_time()
        out = list(real_collect())
        collect_only += time.thread_time() - t0
        return iter(out)

    collector.collect = timed_collect
    before = agg.snapshot().cpu_seconds.get("prometheus", 0.0)
    for _ in range(30):
        scrape(sink.url)
    time.sleep(0.1)  # the endpoint hands its CPU over after each turn of its loop
    reported = agg.snapshot().cpu_seconds["prometheus"] - before
    # The whole request (collect, encode, HTTP) is counted: more than collect() alone.
    assert collect_only > 0
    assert reported > collect_only * 1.2
    obs.shutdown()


def test_wsgi_app_counts_its_whole_call():
    from wsgiref.util import setup_testing_defaults

    from prometheus_client import CollectorRegistry

    sink = specobs.PrometheusSink(registry=CollectorRegistry())
    obs = specobs.configure(sinks=[sink], clock="host")
    env: dict = {}
    setup_testing_defaults(env)
    app = sink.wsgi_app()
    before = obs.snapshot().cpu_seconds.get("prometheus", 0.0)
    for _ in range(20):
        b"".join(app(env, lambda s, h: None))
    assert obs.snapshot().cpu_seconds["prometheus"] > before
    obs.shutdown()


def test_one_sink_cannot_serve_two_observers_and_nothing_is_orphaned():
    obs, sink = served()
    url = sink.url
    with pytest.raises(specobs.ConfigurationError, match="already attached"):
        specobs.configure(sinks=[sink], clock="host")
    obs.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_a_failing_later_sink_stops_the_ones_already_started():
    class Started(specobs.MemorySink):
        pass

    first = specobs.PrometheusSink(port=0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(specobs.ConfigurationError, match="free port"):
            specobs.configure(sinks=[first, specobs.PrometheusSink(port=port)], clock="host")
    assert first.server is None  # shut down by the failed configure()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{first.port}/metrics", timeout=2)


def test_otlp_threads_do_not_leak_when_prometheus_fails(otlp_receiver):
    code = textwrap.dedent("""
        import socket, threading, specobs
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
        port = s.getsockname()[1]
        try:
            specobs.configure(env={"SPECOBS_EXPORTERS": "otlp,prometheus",
                                    "SPECOBS_PROMETHEUS_PORT": str(port)}, clock="host")
        except specobs.ConfigurationError as exc:
            print("error", "free port" in str(exc))
        # Threads that are ending may take a while on a busy machine; leaked ones never end.
        import time
        deadline = time.monotonic() + 30
        while len(threading.enumerate()) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        print(sorted(t.name for t in threading.enumerate() if t.name != "MainThread"))
    """)
    env = {**os.environ, "PYTHONPATH": ROOT,
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.grpc_endpoint}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, check=True)
    assert out.stdout.splitlines() == ["error True", "[]"], out.stdout + out.stderr


# -- fork ------------------------------------------------------------------------------------

FORK_CHILD = textwrap.dedent("""
    import json, logging, os, sys, time, urllib.request
    import specobs
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    port_arg = int(sys.argv[1])
    sink = specobs.PrometheusSink(port=port_arg)
    obs = specobs.configure(sinks=[sink], clock="host", poll_interval_seconds=0.01)
    def cycles(n):
        for _ in range(n):
            with obs.cycle() as c:
                c.mark("verify"); c.mark("bookkeeping"); c.accept([1], draft_length=1)
    cycles(100)
    assert obs.force_flush(5)
    parent_created = obs.snapshot().created_unix_seconds
    parent_url = sink.url
    time.sleep(0.01)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            cycles(10)
            ok = obs.force_flush(5)
            s = obs.snapshot()
            body = ""
            if sink.url is not None:
                body = urllib.request.urlopen(sink.url, timeout=5).read().decode()
            t0 = time.monotonic(); obs.shutdown(3); shut = time.monotonic() - t0
            os.write(w, json.dumps({
                "ok": ok, "cycles": s.cycles_total, "accepted": s.accepted_tokens_total,
                "new_created": s.created_unix_seconds > parent_created,
                "url": sink.url, "parent_url": parent_url, "shutdown_s": shut,
                "served_own": "specobs_cycles_total 10.0" in body,
            }).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    child = json.loads(os.read(r, 4096))
    parent_body = urllib.request.urlopen(parent_url, timeout=5).read().decode()
    child["parent_still_100"] = "specobs_cycles_total 100.0" in parent_body
    print(json.dumps(child))
    obs.shutdown()
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("fixed_port", [False, True], ids=["port 0", "fixed port"])
def test_forked_child_counts_only_its_own_restarts_or_says_so_and_shuts_down_fast(fixed_port):
    import json

    port = free_port() if fixed_port else 0
    out = subprocess.run([sys.executable, "-c", FORK_CHILD, str(port)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["ok"] is True
    assert child["cycles"] == 10 and child["accepted"] == 10  # not 110: the parent's are its own
    assert child["new_created"] is True
    assert child["shutdown_s"] < 1.0  # was the full 3 s
    assert child["parent_still_100"] is True
    if fixed_port:
        assert child["url"] is None
        assert out.stderr.count("does not serve Prometheus metrics") == 1
    else:
        assert child["url"] != child["parent_url"] and child["served_own"] is True
        assert out.stderr.count("serves its own metrics") == 1


# -- exit ------------------------------------------------------------------------------------

EXIT_OTLP = textwrap.dedent("""
    import sys, specobs
    obs = specobs.configure(sinks=[specobs.OtlpSink(endpoint=sys.argv[1],
                                                    export_interval_seconds=3600)],
                            clock="host", trace_head_rate=1.0, poll_interval_seconds=3600)
    for _ in range(500):
        with obs.cycle() as c:
            c.mark("verify"); c.mark("bookkeeping"); c.accept([1, 2], draft_length=2)
    # no shutdown(): what every engine integration does
""")


def _last_value(metrics, name):
    """The latest cumulative value of a counter (every export resends the total)."""
    values = [p.as_int for _, m in metrics if m.name == name for p in m.sum.data_points]
    return values[-1] if values else None


def test_exit_without_shutdown_delivers_the_last_records_and_the_final_export(otlp_receiver):
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", EXIT_OTLP, otlp_receiver.grpc_endpoint],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 30
    metrics = otlp_receiver.metrics()
    assert _last_value(metrics, "specobs.cycles") == 500
    assert len(otlp_receiver.spans()) == 500 * 4  # a cycle span and one per phase


EXIT_DEAD = textwrap.dedent("""
    import logging, sys, specobs
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    obs = specobs.configure(sinks=[specobs.OtlpSink(endpoint=sys.argv[1], timeout_seconds=30,
                                                    export_interval_seconds=3600)],
                            clock="host", trace_head_rate=1.0, poll_interval_seconds=3600)
    for _ in range(50):
        with obs.cycle() as c:
            c.mark("verify"); c.mark("bookkeeping")
""")


def test_exit_flush_is_bounded_and_counts_what_it_could_not_deliver(otlp_receiver):
    otlp_receiver.delay_seconds = 20  # a collector that never answers in time
    env = {**os.environ, "PYTHONPATH": ROOT, "SPECOBS_EXIT_TIMEOUT_SECONDS": "1.5"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", EXIT_DEAD, otlp_receiver.grpc_endpoint],
                         capture_output=True, text=True, timeout=60, env=env)
    took = time.monotonic() - t0
    otlp_receiver.delay_seconds = 0
    assert out.returncode == 0, out.stderr
    assert took < 15, took
    lines = [x for x in out.stderr.splitlines() if "at exit" in x]
    assert len(lines) == 1, out.stderr
    # 50 cycles x 4 spans queued, none delivered, and the one final metric export.
    assert "0 cycle records, 200 spans and 1 metric exports" in lines[0]
