"""The OTLP sink against collectors that misbehave, forked children, credentials and clock steps.

- A raw-socket collector (:mod:`tests._hostile_collector`) that answers 200 with an endless
  body, announces a 1 GiB one, trickles its body, or trickles its headers: every export ends
  within the exporter's timeout and is counted as failed, and the worker never reads more than
  :data:`~specobs.sinks._otlp_config.MAX_RESPONSE_BYTES` of it.
- Real ``os.fork()`` children of a process exporting by OTLP/gRPC to the real receiver
  (:mod:`tests._otlp_receiver`): none dies of a signal, each one's own totals arrive; a child
  forked while an export was in flight stays silent and says so once.
- Credentials in the endpoint URL never reach a ``repr``, a log record or gRPC's own log, and
  are sent as an HTTP Basic ``authorization`` header by both protocols.
- A wall clock stepped back (a fake one, injected) never gives a point a time before its start.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import specobs
from specobs import catalog
from specobs.sinks import _otlp_config, otlp
from specobs.sinks._otlp_config import MAX_RESPONSE_BYTES, redact_url, split_userinfo
from specobs.sinks._otlp_data import metrics_data
from specobs.sinks.otlp import OtlpSink
from tests._cores import observer_factory
from tests._hostile_collector import HostileCollector
from tests._otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow

NEVER = 3600.0  # export interval: no timer export fires during a test
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def observers() -> Iterator[Callable[..., specobs.Observer]]:
    """``specobs.configure`` that shuts every observer down after the test."""
    yield from observer_factory()


@pytest.fixture
def collector() -> Iterator[HostileCollector]:
    c = HostileCollector(drip_seconds=0.3, max_seconds=60.0)
    try:
        yield c
    finally:
        c.close()


def run_cycles(obs: specobs.Observer, n: int) -> None:
    for _ in range(n):
        with obs.cycle(batch_size=1) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1], draft_length=2)


def wait_until(predicate: Callable[[], bool], timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ten_traced_cycles_for(
    collector: HostileCollector, mode: str, observers: Callable[..., specobs.Observer],
    timeout: float,
) -> specobs.Observer:  # fmt: skip
    """An observer that traces every cycle and exports spans and metrics over HTTP to
    ``collector`` in ``mode``, ``timeout`` seconds an export and no periodic export, after 10
    cycles."""
    collector.mode = mode
    sink = OtlpSink(endpoint=collector.endpoint, protocol="http/protobuf",
                    timeout_seconds=timeout, export_interval_seconds=NEVER)  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    run_cycles(obs, 10)
    return obs


def _failed_flush_seconds(obs: specobs.Observer, flush_timeout: float) -> float:
    """How long a flush that fails (returns False) took."""
    t0 = time.monotonic()
    assert not obs.force_flush(flush_timeout)
    return time.monotonic() - t0


def _assert_the_metric_export_and_every_span_lost(obs: specobs.Observer) -> None:
    """The one metric export counted dropped, and the spans of the 10 cycles (4 each)."""
    snap = obs.snapshot()
    assert snap.dropped["metric_export"] == 1
    assert snap.dropped["span_export"] == 4 * 10


# -- N6: a collector answering 200 with an endless or huge body --------------------------------


@pytest.mark.parametrize("mode", ["endless", "biglength"])
def test_huge_response_is_capped_and_the_export_counted_as_failed(
    collector: HostileCollector, mode: str, observers: Callable[..., specobs.Observer],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    timeout = 5.0
    obs = _ten_traced_cycles_for(collector, mode, observers, timeout)
    elapsed = _failed_flush_seconds(obs, 20.0)
    # The cap ends each request at once: well before one export's timeout, let alone two.
    assert elapsed < timeout, elapsed
    assert collector.requests == 2  # one span batch, one metric export; neither retried
    # What the collector got into the socket: the capped read plus the kernel's buffers, not
    # the gigabytes it was sending.
    assert max(collector.bytes_sent) < 32 * 1024 * 1024, collector.bytes_sent
    _assert_the_metric_export_and_every_span_lost(obs)
    reason = "exceeded" if mode == "endless" else "announced a 1073741824-byte response"
    assert any(reason in r.getMessage() for r in caplog.records), caplog.text
    assert str(MAX_RESPONSE_BYTES) in caplog.text


def test_a_redirecting_collector_fails_each_export_counted_and_says_where_it_points(
    collector: HostileCollector, observers: Callable[..., specobs.Observer],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The exporters count a 3xx as success and follow no redirect: without the adapter's
    check the collector's 307 lost every export with flush True and nothing counted."""
    obs = _ten_traced_cycles_for(collector, "redirect", observers, 5.0)
    assert not obs.force_flush(20.0)
    assert collector.requests == 2  # one span batch, one metric export; neither retried
    _assert_the_metric_export_and_every_span_lost(obs)
    assert "answered 307 (a redirect to 'https://collector.invalid:4318/v1/traces')" in (
        caplog.text)


def test_a_credential_provider_session_is_bounded_too(
    collector: HostileCollector, observers: Callable[..., specobs.Observer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER names an entry point returning the
    # session to use; specobs loads it as the exporter would and mounts its adapter on it.
    import importlib.metadata

    import requests

    class Provider:
        def load(self) -> Callable[[], requests.Session]:
            def make() -> requests.Session:
                session = requests.Session()
                session.headers["x-from-provider"] = "1"
                return session
            return make

    def entry_points(*, group: str, name: str) -> list[Provider]:
        assert group == "opentelemetry_otlp_credential_provider"
        return [Provider()] if name == "test-provider" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "test-provider")
    collector.mode = "endless"
    sink = OtlpSink(endpoint=collector.endpoint, protocol="http/protobuf", timeout_seconds=5.0,
                    export_interval_seconds=NEVER, traces=False)  # fmt: skip
    obs = observers(sinks=[sink], clock="host")
    t0 = time.monotonic()
    assert not obs.force_flush(20.0)
    assert time.monotonic() - t0 < 5.0
    assert max(collector.bytes_sent) < 32 * 1024 * 1024
    assert obs.snapshot().dropped["metric_export"] == 1

    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "missing")
    with pytest.raises(specobs.ConfigurationError, match=r"'missing'.*not an installed"):
        specobs.configure(sinks=[OtlpSink(endpoint=collector.endpoint,
                                          protocol="http/protobuf")], clock="host")


# -- N7: a collector that trickles its answer --------------------------------------------------


@pytest.mark.parametrize("mode", ["drip", "slowhead"])
def test_trickling_collector_costs_each_export_its_timeout_and_no_more(
    collector: HostileCollector, mode: str, observers: Callable[..., specobs.Observer],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    # One byte every 0.3 s: every socket read succeeds well within the 1 s timeout, so only a
    # deadline over the whole request can end it (the collector would go on for 60 s).
    timeout = 1.0
    obs = _ten_traced_cycles_for(collector, mode, observers, timeout)
    elapsed = _failed_flush_seconds(obs, 30.0)
    assert 2 * timeout * 0.9 <= elapsed < 2 * timeout + 3.0, elapsed  # spans, then metrics
    _assert_the_metric_export_and_every_span_lost(obs)
    assert "within the export's timeout" in caplog.text

    t0 = time.monotonic()
    obs.shutdown(5.0)  # its final metric export is bounded the same way
    assert time.monotonic() - t0 < timeout + 2.0


def test_trickling_collector_periodic_exports_are_counted_as_they_fail(
    collector: HostileCollector, observers: Callable[..., specobs.Observer],
) -> None:
    collector.mode = "drip"
    sink = OtlpSink(endpoint=collector.endpoint, protocol="http/protobuf", timeout_seconds=0.5,
                    export_interval_seconds=0.1, traces=False)  # fmt: skip
    obs = observers(sinks=[sink], clock="host")
    # Each periodic export fails at its deadline and is counted then, not when the collector
    # gives up (it would drip for 60 s).
    assert wait_until(lambda: obs.snapshot().dropped["metric_export"] >= 3, 20.0)
    assert collector.requests >= 3


def test_bounded_session_keeps_a_healthy_collector_working(
    collector: HostileCollector, observers: Callable[..., specobs.Observer],
) -> None:
    # Keep-alive connections go back to the pool after a capped read, and the deadline timer
    # of an export that ended never cuts a connection reused by the next one.
    sink = OtlpSink(endpoint=collector.endpoint, protocol="http/protobuf", timeout_seconds=0.3,
                    export_interval_seconds=NEVER)  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    for _ in range(5):
        run_cycles(obs, 3)
        assert obs.force_flush(5.0)
        time.sleep(0.35)  # past the previous request's deadline, on the same connection
    assert collector.requests == 10
    assert obs.snapshot().dropped["metric_export"] == 0


# -- N39: fork() under a parent exporting by gRPC ----------------------------------------------

_FORK_SCRIPT = textwrap.dedent('''
    import json, os, sys, threading, time, traceback
    import specobs

    endpoint, n_children, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "busy-late":
        # The observer's fork hook is registered before the sink's module is imported: the
        # sink must not depend on the order the hooks run in.
        specobs.configure(sinks=[], clock="host").shutdown(1)
    from specobs.sinks import otlp
    # Generous on a loaded machine: how long fork() may wait for an export in progress, read
    # when the gRPC sink is made.
    os.environ["SPECOBS_OTLP_FORK_WAIT_SECONDS"] = "5" if mode == "healthy" else "0.2"
    # On a loaded machine 16 children and the parent export at once to one Python receiver: the
    # per-export deadline and the flushes are bounds on waiting for delivery, not the expectation.
    sink = otlp.OtlpSink(endpoint=endpoint, protocol="grpc",
                         timeout_seconds=30 if mode == "healthy" else 10,
                         export_interval_seconds=0.05 if mode == "healthy" else 3600,
                         traces=mode == "healthy")
    obs = specobs.configure(sinks=[sink], clock="host", trace_head_rate=1.0)
    stop = threading.Event()

    def load():
        while not stop.is_set():
            for _ in range(20):
                with obs.cycle() as c:
                    c.mark("verify")
                    c.mark("bookkeeping")
            time.sleep(0.001)

    def child(i):
        try:
            for _ in range(1000 + i):
                with obs.cycle() as c:
                    c.mark("verify")
                    c.mark("bookkeeping")
            ok = obs.force_flush(60 if mode == "healthy" else 15)
            t0 = time.monotonic()
            obs.shutdown(5)
            took = time.monotonic() - t0
            if mode == "healthy":
                if not ok:
                    print(f"child {i}: flush failed, dropped {obs.snapshot().dropped}",
                          file=sys.stderr)
                return 0 if ok else 3
            # Waiting on the parent's gRPC channel would hold shutdown to its 5 s bound; a loaded
            # machine may take a second or two to stop the child's threads, never 4.
            if ok or took >= 4.0:
                print(f"child {i}: flush {'delivered' if ok else 'refused'}, shutdown took "
                      f"{took:.2f} s", file=sys.stderr)
                return 5
            return 0
        except BaseException:
            traceback.print_exc()
            return 4

    threading.Thread(target=load, daemon=True).start()
    if mode == "healthy":
        assert obs.force_flush(15)  # the channel is up and exporting before the first fork
    else:
        threading.Thread(target=obs.force_flush, args=(30,), daemon=True).start()
        deadline = time.monotonic() + 15
        while not sink._metrics_exporting and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sink._metrics_exporting
    pids = {}
    for i in range(n_children):
        pid = os.fork()
        if pid == 0:
            code = child(i)
            sys.stdout.flush()
            sys.stderr.flush()
            if i % 2:
                sys.exit(code)  # a normal interpreter exit: atexit hooks, finalizers
            os._exit(code)
        pids[pid] = i
        time.sleep(0.02)
    status = {}
    deadline = time.monotonic() + 150
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status[pids.pop(pid)] = os.waitstatus_to_exitcode(st)
        time.sleep(0.01)
    for pid, i in pids.items():
        os.kill(pid, 9)
        status[i] = "hung"
    stop.set()
    parent_ok = obs.force_flush(60) if mode == "healthy" else None
    obs.shutdown(5)
    print(json.dumps({"status": status, "start": obs.snapshot().created_unix_nano,
                      "parent_ok": parent_ok}))
''')


def run_fork_script(endpoint: str, n_children: int, mode: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, endpoint, str(n_children), mode],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_forked_children_of_a_grpc_exporting_parent_export_their_own_totals(
    otlp_receiver: OtlpReceiver,
) -> None:
    n = 16
    result, stderr = run_fork_script(otlp_receiver.grpc_endpoint, n, "healthy")
    # No child died of a signal (SIGABRT in gRPC core) or hung; each one's flush delivered.
    assert result["status"] == {str(i): 0 for i in range(n)}, (result, stderr[-4000:])
    assert result["parent_ok"] is True
    assert "Check failed" not in stderr
    assert "skipping fork() handlers" not in stderr
    # Each child's cumulative series start at its own fork and end at exactly its own cycles.
    final: dict[int, float] = {}
    for _, metric in otlp_receiver.metrics(transport="grpc"):
        if metric.name == catalog.CYCLES.otel_name:
            for p in metric.sum.data_points:
                if p.start_time_unix_nano != result["start"]:
                    final[p.start_time_unix_nano] = max(
                        final.get(p.start_time_unix_nano, 0), p.as_int or p.as_double)
    assert sorted(final.values()) == [1000 + i for i in range(n)], final


@pytest.mark.parametrize("mode", ["busy", "busy-late"])
def test_child_forked_during_a_grpc_export_stays_silent_and_exits_cleanly(
    otlp_receiver: OtlpReceiver, mode: str,
) -> None:
    otlp_receiver.delay_seconds = 3.0  # the parent's export is in flight at every fork
    n = 4
    result, stderr = run_fork_script(otlp_receiver.grpc_endpoint, n, mode)
    assert result["status"] == {str(i): 0 for i in range(n)}, (result, stderr[-4000:])
    assert "Check failed" not in stderr
    lines = [ln for ln in stderr.splitlines() if "does not export by OTLP/gRPC" in ln]
    assert len(lines) == n, stderr[-4000:]  # once per child
    assert len({ln.split("pid ")[1].split(")")[0] for ln in lines}) == n
    assert "http/protobuf" in lines[0]


# -- N52: credentials in the endpoint URL ------------------------------------------------------

SECRET = "URLSECRET"
BASIC = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()


def with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://alice:{SECRET}@")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("where", ["argument", "environment"])
def test_endpoint_credentials_are_sent_as_basic_auth_and_never_printed(
    otlp_receiver: OtlpReceiver, protocol: str, where: str,
    observers: Callable[..., specobs.Observer], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)  # every logger: specobs, the exporters, urllib3, grpc
    base = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    if where == "argument":
        sink = OtlpSink(endpoint=with_userinfo(base), protocol=protocol, timeout_seconds=5,
                        headers={"x-tenant": "t1"}, export_interval_seconds=NEVER)  # fmt: skip
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", with_userinfo(base))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t1")
        sink = OtlpSink(protocol=protocol, timeout_seconds=5, export_interval_seconds=NEVER)
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    logging.getLogger("specobs").debug("attached %r", sink)
    run_cycles(obs, 3)
    assert obs.force_flush(10.0)  # the gRPC target is host:port again, so it connects

    requests = otlp_receiver.requests()
    assert {r.signal for r in requests} == {"traces", "metrics"}
    for r in requests:
        assert r.headers["authorization"] == BASIC
        assert r.headers["x-tenant"] == "t1"  # the other headers are kept
    assert SECRET not in repr(sink) and SECRET not in str(sink.endpoint)
    obs.shutdown(2.0)
    printed = caplog.text + "".join(capfd.readouterr())
    assert "attached <specobs.OtlpSink" in printed
    assert SECRET not in printed
    assert BASIC.split()[1] not in printed


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_endpoint_credentials_stay_out_of_failure_logs(
    protocol: str, observers: Callable[..., specobs.Observer],
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    port = closed_port()
    sink = OtlpSink(endpoint=f"http://alice:{SECRET}@127.0.0.1:{port}", protocol=protocol,
                    timeout_seconds=0.5, export_interval_seconds=NEVER)  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    run_cycles(obs, 3)
    assert not obs.force_flush(5.0)
    obs.shutdown(1.0)
    printed = caplog.text + "".join(capfd.readouterr())
    assert f"127.0.0.1:{port}" in printed  # the failures were logged, with where they went
    assert SECRET not in printed


def test_endpoint_credentials_and_an_authorization_header_are_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = OtlpSink(endpoint=f"http://alice:{SECRET}@127.0.0.1:4317",
                    headers={"Authorization": "Bearer x"}, export_interval_seconds=NEVER)
    with pytest.raises(specobs.ConfigurationError, match="expected one set of credentials") as e:
        specobs.configure(sinks=[sink], clock="host")
    assert SECRET not in str(e.value) and "127.0.0.1:4317" in str(e.value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://bob:{SECRET}@127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x")
    with pytest.raises(specobs.ConfigurationError, match="OTEL_EXPORTER_OTLP_"):
        specobs.configure(sinks=[OtlpSink(protocol="http/protobuf")], clock="host")


@pytest.mark.parametrize(
    ("url", "stripped", "credentials"),
    [
        ("http://alice:pw@h:4318/v1/traces", "http://h:4318/v1/traces", "alice:pw"),
        ("https://a%40b:p%3Aw@h:4318", "https://h:4318", "a@b:p:w"),  # percent-decoded
        ("alice:pw@h:4317", "h:4317", "alice:pw"),  # a scheme-less gRPC target
        ("http://alice@h:4318", "http://h:4318", "alice:"),
        ("http://h:4318/p@th?q=a@b", "http://h:4318/p@th?q=a@b", None),  # '@' after the host
        ("http://[::1]:4317", "http://[::1]:4317", None),
    ],
)
def test_split_userinfo(url: str, stripped: str, credentials: str | None) -> None:
    got, authorization = split_userinfo(url)
    assert got == stripped == redact_url(url)
    if credentials is None:
        assert authorization is None
    else:
        assert authorization == "Basic " + base64.b64encode(credentials.encode()).decode()


# -- N28: the wall clock stepped back ----------------------------------------------------------


def test_points_never_precede_their_start_when_the_wall_clock_steps_back(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    step = {"ns": 0}
    real = time.time_ns
    monkeypatch.setattr(otlp, "_wall_clock_ns", lambda: real() + step["ns"])
    sink = OtlpSink(endpoint=otlp_receiver.grpc_endpoint, export_interval_seconds=NEVER,
                    traces=False)  # fmt: skip
    obs = observers(sinks=[sink], clock="host")
    run_cycles(obs, 2)
    assert obs.force_flush(5.0)
    step["ns"] = -3600 * 10**9  # NTP steps the clock back an hour
    run_cycles(obs, 2)
    assert obs.force_flush(5.0)

    start = obs.snapshot().created_unix_nano
    times: list[list[int]] = []
    for request in otlp_receiver.requests(signal="metrics"):
        stamps = []
        for rm in request.request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    data = getattr(m, str(m.WhichOneof("data")))
                    for p in data.data_points:
                        assert p.time_unix_nano >= p.start_time_unix_nano, m.name
                        if m.WhichOneof("data") != "gauge":
                            assert p.start_time_unix_nano == start
                        stamps.append(p.time_unix_nano)
        times.append(stamps)
    assert len(times) == 2
    # The second export's points still move forward, on the sink's anchored timeline.
    assert min(times[1]) > max(times[0])
    assert min(times[1]) - real() > 3000 * 10**9 - 3600 * 10**9  # not an hour back


def test_metrics_data_clamps_a_time_before_the_start() -> None:
    obs = specobs.configure(sinks=[], clock="host")
    try:
        snap = obs.snapshot()
        sink = OtlpSink(export_interval_seconds=NEVER)
        data = metrics_data(snap, sink.resource, snap.created_unix_nano - 3600 * 10**9)
        points = [
            p
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            for p in m.data.data_points
        ]  # fmt: skip
        assert points
        assert all(p.time_unix_nano == p.start_time_unix_nano == snap.created_unix_nano
                   for p in points)
    finally:
        obs.shutdown(1.0)


def test_module_constants() -> None:
    assert _otlp_config.MAX_RESPONSE_BYTES == 1024 * 1024
    assert 0 < otlp._FORK_WAIT_SECONDS <= 1.0


def test_the_fork_wait_is_read_when_a_grpc_sink_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SPECOBS_OTLP_FORK_WAIT_SECONDS``: how long fork() waits for a gRPC export in progress
    (children forked during a slow one cannot export). A bad value is refused where the sink is
    made, saying what was expected; an http/protobuf sink does not read it."""
    monkeypatch.setattr(otlp, "_FORK_WAIT_SECONDS", otlp._FORK_WAIT_SECONDS)
    monkeypatch.setenv("SPECOBS_OTLP_FORK_WAIT_SECONDS", "2.5")
    OtlpSink(endpoint="http://127.0.0.1:9", protocol="grpc")
    assert otlp._FORK_WAIT_SECONDS == 2.5
    monkeypatch.setenv("SPECOBS_OTLP_FORK_WAIT_SECONDS", "soon")
    OtlpSink(endpoint="http://127.0.0.1:9", protocol="http/protobuf")  # not read
    with pytest.raises(specobs.ConfigurationError, match="SPECOBS_OTLP_FORK_WAIT_SECONDS") as e:
        OtlpSink(endpoint="http://127.0.0.1:9", protocol="grpc")
    assert "got 'soon'" in str(e.value)
    monkeypatch.setenv("SPECOBS_OTLP_FORK_WAIT_SECONDS", "600")
    with pytest.raises(specobs.ConfigurationError, match="60"):
        OtlpSink(endpoint="http://127.0.0.1:9", protocol="grpc")
    assert otlp._FORK_WAIT_SECONDS == 2.5


# -- a count no exporter can encode ------------------------------------------------------------

# ``emitted`` values one cycle may not count: past what OTLP's int64 holds (alone or summed),
# negative, not a whole number, a bool, or one per sequence of the wrong length.
UNEXPORTABLE = [10**30, 2**63, 2**63 - 1, [10**18, 10**18], -1, 1.5, True, [3], [1, 2, 3],
                [1, -1], 2**32 + 1]


def _exported_sums(receiver: OtlpReceiver, transport: str) -> list[dict[str, float]]:
    """Per metrics request, in order: each Sum point's value by metric name and attributes."""
    out = []
    for req in receiver.requests(transport=transport, signal="metrics"):  # type: ignore[arg-type]
        found: dict[str, float] = {}
        for rm in req.request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.WhichOneof("data") != "sum":
                        continue
                    for p in m.sum.data_points:
                        attrs = ",".join(f"{a.key}={a.value.string_value}" for a in p.attributes)
                        value = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                        found[f"{m.name}{{{attrs}}}"] = value
        out.append(found)
    return out


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_emitted_count_no_exporter_can_encode_is_refused_and_export_goes_on(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """``accept(..., emitted=10**30)`` was counted, and from then on every OTLP metric export of
    the process failed to encode (int64). Now each such value is refused where it is validated,
    counted as ``bad_acceptance``, said once in the log, and the cycle counts its default
    emitted tokens; exports keep arriving with exact totals."""
    caplog.set_level(logging.WARNING, logger="specobs")
    transport = "grpc" if protocol == "grpc" else "http"
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    sink = OtlpSink(endpoint=endpoint, protocol=protocol, timeout_seconds=5, traces=False,
                    export_interval_seconds=NEVER)
    obs = observers(sinks=[sink], clock="host", max_draft_length=4)
    run_cycles(obs, 2)  # emitted 2 each (1 accepted + the bonus token)
    assert obs.force_flush(10.0)
    for em in UNEXPORTABLE:
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1, 2], draft_length=4, emitted=em)  # default emitted: 1 + 2 + 2 = 5
    run_cycles(obs, 2)
    assert obs.force_flush(10.0)
    run_cycles(obs, 1)
    assert obs.force_flush(10.0)  # and the one after: the process's exports are not poisoned

    sums = _exported_sums(otlp_receiver, transport)
    assert len(sums) == 3
    emitted = [s["specobs.emitted_tokens{}"] for s in sums]
    bad = len(UNEXPORTABLE)
    assert emitted == [4, 4 + 5 * bad + 4, 4 + 5 * bad + 6]
    assert sums[-1]["specobs.exporter.errors{kind=bad_acceptance}"] == bad
    assert sums[-1]["specobs.exporter.dropped_records{reason=metric_export}"] == 0
    s = obs.snapshot()
    assert (s.emitted_tokens_total, s.errors["bad_acceptance"]) == (4 + 5 * bad + 6, bad)
    lines = [r.getMessage() for r in caplog.records if "emitted must be" in r.getMessage()]
    assert len(lines) == 1  # said once (then once a minute at most, with a count)
    assert "between 0 and 4294967296" in lines[0] and "1000000000000000000000000000000" in lines[0]
