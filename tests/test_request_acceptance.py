"""Per-request acceptance (``Observer.request_finished``): the histogram and its exemplars, bad
input counted and never raised, concurrent callers, both exposition formats parsed back, OTLP
through a real receiver, ``specobs top``, and the engines specobs wires itself: transformers'
real assisted generation on tiny models and the demo engine's completions."""

from __future__ import annotations

import logging
import os
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

import specobs
from specobs import catalog
from specobs.tools._top import _views
from specobs.tools._top._requests import request_acceptance
from specobs.tools._top._sources import EndpointSource
from tests._otlp_receiver import OtlpReceiver, attributes_to_dict

BOUNDS = catalog.REQUEST_ACCEPTANCE_BUCKETS
NAME = catalog.REQUEST_ACCEPTANCE.name
# (drafted, accepted, trace id): rates 0, 0.02, 0.1, 0.25, 0.5, 0.5, 0.95, 1; one drafted none.
REQUESTS: list[tuple[int, int, int | None]] = [
    (40, 0, 0xA1), (50, 1, 0xA2), (30, 3, None), (8, 2, 0xA4), (10, 5, 0xA5), (4, 2, None),
    (20, 19, 0xA7), (6, 6, 0xA8), (0, 0, 0xA9),
]


@pytest.fixture
def observer() -> Iterator[specobs.Observer]:
    obs = specobs.configure(sinks=[], clock="host", env={})
    yield obs
    obs.shutdown(2.0)


def _report(obs: specobs.Observer, requests: list[tuple[int, int, int | None]]) -> None:
    for drafted, accepted, trace_id in requests:
        obs.request_finished(drafted=drafted, accepted=accepted, trace_id=trace_id)


def test_known_requests_give_exact_buckets_sum_and_the_worst_as_exemplars(
        observer: specobs.Observer) -> None:
    assert observer.snapshot().request_acceptance is None  # absent until the first request
    _report(observer, REQUESTS)
    snap = observer.snapshot()
    h = snap.request_acceptance
    assert h is not None
    assert h.bounds == BOUNDS
    # le: 0, .05, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, 1, +Inf (a rate of exactly a bound
    # falls in that bound's bucket, as Prometheus's "le" says).
    assert h.counts == (1, 1, 1, 0, 1, 0, 2, 0, 0, 0, 0, 1, 1, 0)
    assert h.count == 8  # the request that drafted nothing is not observed ...
    assert snap.requests_finished_total == 9  # ... but counted as finished
    assert h.sum == pytest.approx(0 + 0.02 + 0.1 + 0.25 + 0.5 + 0.5 + 0.95 + 1.0)
    # Exemplars only on buckets up to 0.3, and only for traced requests: 0xA1 (0.0), 0xA2
    # (0.02), 0xA4 (0.25); the untraced 0.1 request leaves its bucket without one.
    got = {i: (e.value, e.trace_id, e.span_id) for i, e in enumerate(h.exemplars) if e}
    assert got == {0: (0.0, 0xA1, None), 1: (0.02, 0xA2, None), 4: (0.25, 0xA4, None)}
    # The latest traced request in a bucket replaces the one before; the number stays bounded.
    observer.request_finished(drafted=10, accepted=0, trace_id="0" * 31 + "f")
    latest = observer.snapshot().request_acceptance
    assert latest is not None and latest.exemplars[0] is not None
    assert latest.exemplars[0].trace_id == 0xF  # the hex trace id, now the latest at 0
    for i in range(200):
        observer.request_finished(drafted=100, accepted=i % 31, trace_id=i + 1)
    final = observer.snapshot().request_acceptance
    assert final is not None
    exemplars = [e for e in final.exemplars if e]
    assert len(exemplars) == 5  # buckets 0, .05, .1, .2, .3
    assert all(e.value <= catalog.REQUEST_ACCEPTANCE_EXEMPLAR_MAX for e in exemplars)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"drafted": 5, "accepted": 6}, "accepted=6"),
    ({"drafted": -1, "accepted": 0}, "drafted=-1"),
    ({"drafted": True, "accepted": 0}, "drafted=True"),
    ({"drafted": 5.0, "accepted": 1}, "drafted=5.0"),
    ({"drafted": "5", "accepted": 1}, "drafted='5'"),
    ({"drafted": None, "accepted": 1}, "drafted=None"),
])
def test_bad_counts_are_counted_and_logged_never_raised(
        kwargs: dict[str, Any], why: str, observer: specobs.Observer,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="specobs"):
        observer.request_finished(**kwargs)
        observer.request_finished(**kwargs)  # a second time: counted, not logged again
    observer.force_flush(5.0)
    snap = observer.snapshot()
    assert snap.errors["bad_request_acceptance"] == 2
    assert snap.request_acceptance is None and snap.requests_finished_total is None
    lines = [r.getMessage() for r in caplog.records if "request_finished" in r.getMessage()]
    assert len(lines) == 1
    assert "0 <= accepted <= drafted" in lines[0] and why in lines[0]


def test_a_bad_trace_id_is_dropped_and_the_request_still_counts(
        observer: specobs.Observer) -> None:
    for bad in ("xyz", "-" + "1" * 31, 0, 1 << 128, 1.5, b"0" * 32):
        observer.request_finished(drafted=10, accepted=0, trace_id=bad)  # type: ignore[arg-type]
    observer.request_finished(drafted=10, accepted=0, trace_id=None)
    observer.request_finished(drafted=10, accepted=0, trace_id=7)
    observer.force_flush(5.0)
    snap = observer.snapshot()
    assert snap.errors["bad_request_acceptance"] == 6
    h = snap.request_acceptance
    assert h is not None and h.count == 8 and h.counts[0] == 8
    assert h.exemplars[0] is not None and h.exemplars[0].trace_id == 7
    # Numpy's integers are integers.
    np = pytest.importorskip("numpy")
    observer.request_finished(drafted=np.int64(4), accepted=np.int32(1))
    assert observer.snapshot().request_acceptance.count == 9  # type: ignore[union-attr]


def test_after_shutdown_the_call_is_a_no_op() -> None:
    obs = specobs.configure(sinks=[], clock="host", env={})
    obs.shutdown(2.0)
    obs.request_finished(drafted=1, accepted=1)
    assert obs.snapshot().requests_finished_total is None


def test_concurrent_callers_lose_nothing(observer: specobs.Observer) -> None:
    threads, each = 8, 2_000
    barrier = threading.Barrier(threads)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def caller(t: int) -> None:
        barrier.wait()
        for i in range(each):
            observer.request_finished(drafted=4, accepted=(t + i) % 5, trace_id=i + 1)

    try:
        workers = [threading.Thread(target=caller, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(old)
    h = observer.snapshot().request_acceptance
    assert h is not None
    n = threads * each
    assert h.count == n and observer.snapshot().requests_finished_total == n
    # Rates 0, .25, .5, .75, 1 in equal parts (threads x each is a multiple of 5).
    assert h.counts[0] == h.counts[4] == h.counts[6] == h.counts[9] == h.counts[12] == n // 5
    assert h.sum == pytest.approx(n / 5 * (0 + 0.25 + 0.5 + 0.75 + 1.0))


def _get(url: str, accept: str) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode())


def test_both_expositions_parse_back_with_exemplars_in_openmetrics() -> None:
    sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
    obs = specobs.configure(sinks=[sink], clock="host", env={}, labels={"model": "m"})
    try:
        _report(obs, REQUESTS)
        assert sink.url is not None
        text = _get(sink.url, "text/plain")
        om = _get(sink.url, "application/openmetrics-text; version=1.0.0")
    finally:
        obs.shutdown(2.0)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    buckets = {s.labels["le"]: s.value for s in families[NAME].samples
               if s.name == f"{NAME}_bucket"}
    assert buckets["0.0"] == 1 and buckets["0.2"] == 3 and buckets["0.5"] == 6
    assert buckets["1.0"] == buckets["+Inf"] == 8
    assert "request_id" not in text  # bounded cardinality: no request in any label
    finished = families[catalog.REQUESTS_FINISHED.base_name].samples[0]
    assert finished.value == 9 and finished.labels == {"model": "m"}
    samples = [s for f in openmetrics_families(om) if f.name == NAME for s in f.samples]
    exemplars = {s.labels["le"]: s.exemplar for s in samples if s.exemplar is not None}
    assert set(exemplars) == {"0.0", "0.05", "0.3"}
    assert exemplars["0.0"].labels == {catalog.EXEMPLAR_TRACE_ID_LABEL: f"{0xA1:032x}"}
    assert exemplars["0.05"].value == pytest.approx(0.02)
    assert exemplars["0.3"].labels[catalog.EXEMPLAR_TRACE_ID_LABEL] == f"{0xA4:032x}"


@pytest.mark.slow
def test_otlp_carries_the_histogram_and_the_trace_ids(otlp_receiver: OtlpReceiver) -> None:
    from specobs.sinks.otlp import OtlpSink

    sink = OtlpSink(endpoint=otlp_receiver.grpc_endpoint, export_interval_seconds=3600.0)
    obs = specobs.configure(sinks=[sink], clock="host", env={})
    try:
        _report(obs, REQUESTS)
        assert obs.force_flush(5.0)
    finally:
        obs.shutdown(2.0)
    got = {m.name: m for _, m in otlp_receiver.metrics()}
    metric = got[catalog.REQUEST_ACCEPTANCE.otel_name]
    assert metric.unit == "1"
    (point,) = metric.histogram.data_points
    assert list(point.explicit_bounds) == list(BOUNDS)
    assert list(point.bucket_counts) == [1, 1, 1, 0, 1, 0, 2, 0, 0, 0, 0, 1, 1, 0]
    assert point.count == 8 and point.sum == pytest.approx(3.32)
    # The trace ids survive the SDK's encoder (span id all zeros: none).
    assert sorted(int.from_bytes(e.trace_id, "big") for e in point.exemplars) == [
        0xA1, 0xA2, 0xA4]
    assert all(e.span_id == bytes(8) for e in point.exemplars)
    (finished,) = got[catalog.REQUESTS_FINISHED.otel_name].sum.data_points
    assert finished.as_int == 9 and attributes_to_dict(finished.attributes) == {}


# -- specobs top ------------------------------------------------------------------------------


def _frame_lines(url: str) -> tuple[str, dict[str, Any]]:
    import httpx

    with httpx.Client() as client:
        source = EndpointSource(client, url)
        assert source.poll().kind == "waiting"
        return _views.plain_line(frame := source.poll()), _views.frame_json(frame)


def test_top_shows_the_intervals_requests_and_the_worst_traces() -> None:
    pytest.importorskip("httpx")
    sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
    obs = specobs.configure(sinks=[sink], clock="host", env={}, poll_interval_seconds=0.01)

    def cycle() -> None:
        with obs.cycle(batch_size=1) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1], draft_length=4)

    try:
        cycle()
        _report(obs, REQUESTS[:3])  # before the first poll: not in the interval
        assert sink.url is not None
        import httpx

        with httpx.Client() as client:
            source = EndpointSource(client, sink.url)
            assert source.poll().kind == "waiting"
            _report(obs, REQUESTS[3:])  # 0.25, 0.5, 0.5, 0.95, 1.0 (and one drafted none)
            cycle()
            assert obs.force_flush(5.0)
            frame = source.poll()
    finally:
        obs.shutdown(2.0)
    r = frame.requests
    assert r is not None
    assert r.requests == 5  # the interval's, not the lifetime's 8
    assert r.low_share == 0.0  # none of the interval's five at or below 0.2
    assert r.p50 == pytest.approx(0.475)  # interpolated in (0.4, 0.5] as histogram_quantile
    # The worst traced requests: the exemplars, lowest first (these predate the interval).
    assert r.worst == ((0.0, f"{0xA1:032x}"), (0.02, f"{0xA2:032x}"), (0.25, f"{0xA4:032x}"))
    line = _views.plain_line(frame)
    assert "requests=5 " in line and "req_le0.2=0.0%" in line
    assert f"worst=0%:{0xA1:032x}," in line
    assert _views.frame_json(frame)["requests"]["requests"] == 5


def test_top_hides_requests_when_the_endpoint_has_none() -> None:
    from specobs.tools import _scrape as scr

    assert request_acceptance(scr.Series(), {}) is None
    pytest.importorskip("httpx")
    sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
    obs = specobs.configure(sinks=[sink], clock="host", env={})
    try:
        assert sink.url is not None
        line, js = _frame_lines(sink.url)
    finally:
        obs.shutdown(2.0)
    assert "requests=" not in line and "worst=" not in line
    assert js["requests"] is None


# -- the engines specobs wires itself ------------------------------------------------------------


def test_transformers_reports_each_generate_call_as_the_sum_of_its_cycles() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from specobs.instrument.transformers import TransformersInstrumentor
    from tests.test_instrument_transformers import _build_pair, _generate

    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock="host", env={})
    inst = TransformersInstrumentor()
    inst.uninstrument()
    try:
        assert inst.instrument(observer=obs) is True
        per_call: list[tuple[int, int]] = []
        for kind, noise in (("llama", 0.03), ("gpt2", 0.03), ("llama", 0.3)):
            target, assistant = _build_pair(kind, noise)
            before = obs.snapshot() if obs.force_flush(5.0) else None
            assert before is not None
            _generate(target, assistant, do_sample=False)
            assert obs.force_flush(5.0)
            after = obs.snapshot()
            # The call's cycles (one sequence: one request).
            per_call.append((after.draft_tokens_total - before.draft_tokens_total,
                             after.accepted_tokens_total - before.accepted_tokens_total))
    finally:
        inst.uninstrument()
        obs.shutdown(2.0)
    snap = obs.snapshot()
    h = snap.request_acceptance
    assert h is not None and snap.requests_finished_total == 3 and h.count == 3
    assert all(d > 0 for d, _ in per_call)
    rates = [a / d for d, a in per_call]
    assert h.sum == pytest.approx(sum(rates))
    expected = [0] * (len(BOUNDS) + 1)
    for rate in rates:
        expected[next(i for i, b in enumerate(BOUNDS) if rate <= b)] += 1
    assert list(h.counts) == expected
    assert len({round(r, 6) for r in rates}) > 1  # the noisier draft accepts a different share


@pytest.mark.timeout(900)
def test_the_demo_engine_reports_each_completion() -> None:
    pytest.importorskip("torch")
    from specobs.demo import SpecDecodeEngine, TrainSettings, build_engine

    # The suite's weight cache (tests/conftest.py), as tests/test_demo_engine.py uses it.
    built = build_engine(cache_dir=os.environ["SPECOBS_CACHE_DIR"],
                         train_settings=TrainSettings())
    obs = specobs.configure(sinks=[], clock="host", env={})
    eng = SpecDecodeEngine(built.target, built.draft, built.tokenizer, k=4, observer=obs)
    try:
        prompts = built.models.language.held_out_prompts()[:4]
        handles = [eng.submit(p, 24, eos_id=None, trace_id=0xD0 + i)
                   for i, p in enumerate(prompts)]
        for _ in range(10_000):
            if not eng.has_work():
                break
            eng.step()
        assert all(h.done for h in handles)
        assert obs.force_flush(5.0)
        snap = obs.snapshot()
    finally:
        eng.close()
        obs.shutdown(2.0)
    h = snap.request_acceptance
    assert h is not None and h.count == 4 and snap.requests_finished_total == 4
    # Each request's counts are its cycles': together, every drafted and accepted token.
    assert sum(x.drafted_tokens for x in handles) == snap.draft_tokens_total
    assert sum(x.accepted_tokens for x in handles) == snap.accepted_tokens_total
    assert h.sum == pytest.approx(sum(x.accepted_tokens / x.drafted_tokens for x in handles))
    assert all(x.drafted_tokens > 0 and x.drafted_tokens % 4 == 0 for x in handles)
    # Exemplars: exactly the traced requests whose rate is in an exemplar bucket (<= 0.3) and
    # not replaced by a later one of the same bucket.
    traced = {e.trace_id for e in h.exemplars if e is not None}
    low = {x.trace_id for x in handles
           if x.accepted_tokens / x.drafted_tokens <= catalog.REQUEST_ACCEPTANCE_EXEMPLAR_MAX}
    assert traced <= low
    assert bool(traced) == bool(low)
