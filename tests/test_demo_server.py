"""The demo's HTTP server against the real engine: a real uvicorn on a free port, real httpx.

Completions as text and token ids (greedy output equal to plain greedy decoding of the target),
SSE streaming, every kind of bad input answered with the OpenAI error shape while the server
keeps serving, a client that goes away mid-stream (its request is cancelled), and run-time fault
switching through /admin/fault, visible in what the engine does.

Hostile and careless clients: bodies over the cap (413), a lone surrogate in the prompt, prompts
too long to tokenize, clients that send their headers or body a byte at a time (dropped), more
completions than the admission limit (429 with Retry-After), the admin token (401 without it,
404 when the server has none), bytes that are not HTTP and an exception in a route (JSON, not
text).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import specobs  # noqa: E402
from specobs.demo import (  # noqa: E402
    RequestHandle,
    SpecDecodeEngine,
    TrainSettings,
    build_engine,
    greedy_generate,
)
from specobs.demo._server import ServerLimits, ServerThread, create_app  # noqa: E402

# The demo's default models: the weights that ship with specobs (specobs/demo/weights/), the same
# on every machine, so no demo test depends on how training went on this one. The suite's one
# weight cache (tests/conftest.py) holds what other settings train.
QUICK_TRAINING: TrainSettings | None = None
WEIGHTS_DIR = Path(os.environ["SPECOBS_CACHE_DIR"])
LABELS = {"model_name": "specobs-demo", "serving_engine": "specobs-demo"}
#: The admin token of the shared server; its client sends it with every request.
ADMIN_TOKEN = "test-admin-token-5f2b9c0e4d7a1386"


def quick_engine(
    observer: Any = None, train_settings: TrainSettings | None = QUICK_TRAINING, **kwargs: Any
) -> SpecDecodeEngine:
    """The demo engine on CPU; ``train_settings=None`` (the default) loads the models that
    ship with specobs, as ``specobs demo`` does."""
    return build_engine(
        cache_dir=WEIGHTS_DIR, train_settings=train_settings, observer=observer, **kwargs
    )


def wait_until(predicate: Callable[[], Any], timeout_seconds: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_seconds} s")
        time.sleep(0.05)


class Served:
    def __init__(self, train_settings: TrainSettings | None = QUICK_TRAINING) -> None:
        self.sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
        # The resolver's default poll: the doctor runs against these servers and reads the
        # overhead gauge, which a faster poll raises (a pass's fixed cost over fewer cycles: at
        # 0.02 s the CPU demo's ~55 cycles/s took one pass each, ~50 us a cycle, at the edge of
        # the 0.3 % the design allows a 17 ms cycle). Tests wait for what they need.
        self.observer = specobs.configure(sinks=[self.sink], labels=LABELS, max_draft_length=4)
        self.engine = quick_engine(self.observer, train_settings)
        self.engine.start()
        self.server = ServerThread(
            create_app(self.engine, self.observer, admin_token=ADMIN_TOKEN), port=0
        ).start()
        self.client = httpx.Client(
            base_url=self.server.url, timeout=60,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        lang = self.engine.models.language
        text = lang.stream(4000, seed=4242)
        self.prompts = [text[i * 37 : i * 37 + 5 + (i * 7) % 30] for i in range(8)]

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.engine.close()
        self.observer.shutdown(5)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with contextlib.closing(Served()) as s:
        yield s


@pytest.fixture
def api(served: Served) -> Iterator[Served]:
    served.engine.fault = None
    yield served
    served.engine.fault = None
    wait_until(lambda: not served.engine.has_work(), 60, "the engine did not drain")


def complete(s: Served, **body: Any) -> dict[str, Any]:
    r = s.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def reference(s: Served, prompt: list[int], max_tokens: int) -> list[int]:
    return greedy_generate(s.engine.target, prompt, max_tokens, eos_id=s.engine.eos_id)


def sse_events(s: Served, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    with s.client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# -- completions ----------------------------------------------------------------------------


def test_text_prompt_gives_the_greedy_completion_with_text_and_token_ids(api: Served) -> None:
    tok = api.engine.tokenizer
    prompt_text = tok.decode(api.prompts[0])
    out = complete(api, prompt=prompt_text, max_tokens=24, model="anything")
    assert out["object"] == "text_completion"
    assert out["model"] == "specobs-demo"
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert ids == reference(api, tok.encode(prompt_text), 24)
    assert choice["text"] == tok.decode(ids)
    assert choice["finish_reason"] in ("length", "stop")
    usage = out["usage"]
    assert usage["completion_tokens"] == len(ids)
    assert usage["prompt_tokens"] == len(tok.encode(prompt_text))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_concurrent_token_id_prompts_equal_plain_greedy_decoding(api: Served) -> None:
    results: dict[int, Any] = {}

    def send(i: int) -> None:
        results[i] = api.client.post(
            "/v1/completions", json={"prompt": api.prompts[i], "max_tokens": 40, "temperature": 0}
        )

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(api.prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, prompt in enumerate(api.prompts):
        r = results[i]
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == reference(api, prompt, 40), i


def test_streaming_sends_sse_chunks_then_done(api: Served) -> None:
    prompt = api.prompts[1]
    whole = complete(api, prompt=prompt, max_tokens=30)["choices"][0]
    events = sse_events(
        api,
        {"prompt": prompt, "max_tokens": 30, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert len(chunks) >= 2, "expected the tokens to arrive in several chunks"
    assert all(e["object"] == "text_completion" for e in chunks)
    assert [t for e in chunks for t in e["choices"][0]["token_ids"]] == whole["token_ids"]
    assert "".join(e["choices"][0]["text"] for e in chunks) == whole["text"]
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == whole["finish_reason"]
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == len(whole["token_ids"])


def test_health_models_and_metrics(api: Served) -> None:
    complete(api, prompt=api.prompts[2], max_tokens=8)
    health = api.client.get("/health").json()
    assert health["status"] == "ok"
    assert health["engine"]["cycles"] > 0
    models = api.client.get("/v1/models").json()
    assert models["data"][0]["id"] == "specobs-demo"
    assert models["data"][0]["max_model_len"] == api.engine.max_request_tokens()
    api.observer.force_flush(5)
    text = api.client.get("/metrics").text
    assert "specobs_cycles_total" in text
    assert 'specobs_phase_duration_seconds_count{clock="host"' in text or (
        "specobs_phase_duration_seconds_count{" in text
    )
    om = api.client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    # The same registry is served on the specobs endpoint's own port.
    own = httpx.get(api.sink.url, timeout=10).text
    assert "specobs_cycles_total" in own


# -- bad input ------------------------------------------------------------------------------

GOOD = {"prompt": "x", "max_tokens": 4}
BAD_BODIES: list[tuple[str, Any, str]] = [
    ("malformed json", b'{"prompt": "hello", "max_tokens": ', "not valid JSON"),
    ("not an object", [1, 2, 3], "JSON object"),
    ("empty body", b"", "empty"),
    ("prompt missing", {"max_tokens": 4}, "'prompt' is required"),
    ("prompt wrong type", {"prompt": 17}, "expected a text or an array of token ids"),
    ("prompt object", {"prompt": {"text": "hi"}}, "got object"),
    ("empty text", {"prompt": ""}, "empty text"),
    ("empty ids", {"prompt": []}, "empty array"),
    ("token id wrong type", {"prompt": [300, "x"]}, "element 1 is string"),
    ("token id bool", {"prompt": [300, True]}, "element 1 is boolean"),
    ("token id out of vocab", {"prompt": [300, 10**6]}, "out of range"),
    ("negative token id", {"prompt": [-1]}, "out of range"),
    ("batch of prompts", {"prompt": ["a", "b"]}, "batches of prompts are not supported"),
    ("max_tokens string", {**GOOD, "max_tokens": "ten"}, "'max_tokens': expected an integer"),
    ("max_tokens float", {**GOOD, "max_tokens": 2.5}, "'max_tokens': expected an integer"),
    ("max_tokens zero", {**GOOD, "max_tokens": 0}, "expected an integer >= 1, got 0"),
    ("max_tokens negative", {**GOOD, "max_tokens": -5}, "expected an integer >= 1, got -5"),
    ("max_tokens huge", {**GOOD, "max_tokens": 10**12}, "expected at most"),
    ("stream wrong type", {**GOOD, "stream": "yes"}, "'stream': expected a boolean"),
    ("temperature sampling", {**GOOD, "temperature": 0.7}, "only greedy decoding"),
    ("temperature string", {**GOOD, "temperature": "hot"}, "'temperature': expected a number"),
    ("model wrong type", {**GOOD, "model": 3}, "'model': expected a string"),
    ("unknown field", {**GOOD, "top_k": 5}, "unknown field 'top_k'"),
    ("unknown stream option", {**GOOD, "stream_options": {"x": 1}}, "unknown field"),
]


@pytest.mark.parametrize(("name", "body", "needle"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_gets_a_400_that_says_what_was_wrong(
    api: Served, name: str, body: Any, needle: str
) -> None:
    if isinstance(body, bytes):
        r = api.client.post(
            "/v1/completions", content=body, headers={"Content-Type": "application/json"}
        )
    else:
        r = api.client.post("/v1/completions", json=body)
    assert r.status_code == 400, (name, r.status_code, r.text)
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"], error["message"]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_sent_without_its_content_type_is_told_to_send_it(
    api: Served, content_type: str | None
) -> None:
    """``curl -d '{...}'`` sends application/x-www-form-urlencoded; FastAPI then reads the body
    as bytes and the answer said "expected a JSON object, got bytes". It names the header."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = api.client.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 2}',
                        headers=headers)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    said = f"Content-Type {content_type}" if content_type else "no Content-Type"
    assert message == (f"the request body was not read as JSON ({said}): send it with "
                       "Content-Type: application/json"), message


def test_over_long_prompts_are_refused_with_the_limit(api: Served) -> None:
    limit = api.engine.max_request_tokens()
    too_long = [300] * (api.engine.config.max_seq_len + 1)
    r = api.client.post("/v1/completions", json={"prompt": too_long, "max_tokens": 1})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert f"limit of {limit} tokens" in msg and str(len(too_long)) in msg
    prompt = [300] * (limit - 10)
    r = api.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 11})
    assert r.status_code == 400
    assert "max_tokens <= 10" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "max_tokens"
    # Exactly at the limit is fine.
    out = complete(api, prompt=prompt, max_tokens=10)
    assert len(out["choices"][0]["token_ids"]) <= 10


def test_unknown_endpoints_and_methods_answer_json(api: Served) -> None:
    r = api.client.get("/v1/chat")
    assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
    r = api.client.get("/v1/completions")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]["message"]


def test_server_keeps_serving_after_a_burst_of_bad_requests(api: Served) -> None:
    for _, body, _ in BAD_BODIES:
        if isinstance(body, bytes):
            api.client.post("/v1/completions", content=body,
                            headers={"Content-Type": "application/json"})
        else:
            api.client.post("/v1/completions", json=body)
    prompt = api.prompts[3]
    out = complete(api, prompt=prompt, max_tokens=12)
    assert out["choices"][0]["token_ids"] == reference(api, prompt, 12)


# -- clients that go away -------------------------------------------------------------------


def _watch_cancels(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once the server cancels a request (``RequestHandle.cancel``, its reaction to
    a client that left). While the engine is stalled nothing else shows the cancel: the request
    stays queued until the next step drops it."""
    cancelled = threading.Event()
    cancel = RequestHandle.cancel

    def cancel_and_tell(handle: RequestHandle) -> None:
        cancel(handle)
        cancelled.set()

    monkeypatch.setattr(RequestHandle, "cancel", cancel_and_tell)
    return cancelled


def test_client_closing_mid_stream_cancels_the_request(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the engine is stalled the request waits; the client leaves; once the engine runs
    again the request is dropped without generating a token."""
    eng = api.engine
    cancelled = _watch_cancels(monkeypatch)
    before = eng.stats()
    assert api.client.post("/admin/fault", json={"fault": "stall"}).json()["fault"] == "stall"
    body = {"prompt": api.prompts[4], "max_tokens": 100, "stream": True}
    with httpx.Client(base_url=api.server.url, timeout=30) as other:
        with other.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            wait_until(lambda: eng.stats().waiting == 1, 10, "the request did not queue")
        # Leaving the block closes the connection mid-stream.
    # The server notices within its poll interval and cancels; only then may the engine run.
    assert cancelled.wait(30), "the server did not cancel the request of the client that left"
    api.client.post("/admin/fault", json={"fault": None})
    wait_until(lambda: not eng.has_work(), 30, "the cancelled request was not dropped")
    after = eng.stats()
    assert after.requests_finished - before.requests_finished == 1
    assert after.emitted_tokens == before.emitted_tokens, "a cancelled request generated tokens"
    # And the server still serves.
    prompt = api.prompts[5]
    assert complete(api, prompt=prompt, max_tokens=8)["choices"][0]["token_ids"] == reference(
        api, prompt, 8
    )


def test_client_closing_during_generation_frees_the_slot_early(api: Served) -> None:
    eng = api.engine
    limit = eng.max_request_tokens()
    prompt = api.prompts[6]
    body = {"prompt": prompt, "max_tokens": limit - len(prompt), "stream": True}
    before = eng.stats()
    with api.client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    wait_until(lambda: not eng.has_work(), 30, "the request kept running")
    generated = eng.stats().emitted_tokens - before.emitted_tokens
    assert generated < body["max_tokens"], "the request ran to completion after the client left"


def test_non_streaming_client_timeout_cancels_the_request(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-streaming client gives up (as on its read timeout) while its request waits in the
    stalled engine: the server cancels it, and once the engine runs again it is dropped without
    generating a token."""
    eng = api.engine
    cancelled = _watch_cancels(monkeypatch)
    before = eng.stats()
    api.client.post("/admin/fault", json={"fault": "stall"})
    # A raw socket, so that the client leaves once the request is queued, not after a fixed
    # time that a busy machine may spend before the server has even read the request.
    url = httpx.URL(api.server.url)
    body = json.dumps({"prompt": api.prompts[7], "max_tokens": 50}).encode()
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (url.host.encode(), len(body), body))
        wait_until(lambda: eng.stats().waiting == 1, 30, "the request did not queue")
        readable, _, _ = select.select([sock], [], [], 0)
        assert readable == [], "the server answered a request the stalled engine holds"
        # Closing the connection without reading is what a client's read timeout does.
    assert cancelled.wait(30), "the server did not cancel the request of the client that left"
    api.client.post("/admin/fault", json={"fault": None})
    wait_until(lambda: not eng.has_work(), 30, "the abandoned request was not dropped")
    assert eng.stats().emitted_tokens == before.emitted_tokens


# -- faults at run time ---------------------------------------------------------------------


def test_admin_fault_validation(api: Served) -> None:
    got = api.client.get("/admin/fault").json()
    assert got["fault"] is None
    assert got["faults"] == [
        None, "wrong-hidden-layers", "slow-verify", "stall", "sync-between-phases",
    ]
    r = api.client.post("/admin/fault", json={"fault": "melt"})
    assert r.status_code == 400
    assert "expected one of" in r.json()["error"]["message"]
    assert '"melt"' in r.json()["error"]["message"]
    r = api.client.post("/admin/fault", json={"fault": None, "extra": 1})
    assert r.status_code == 400 and "unknown field 'extra'" in r.json()["error"]["message"]
    r = api.client.post("/admin/fault", json={})
    assert r.status_code == 400 and "'fault' is required" in r.json()["error"]["message"]
    assert api.client.get("/admin/fault").json()["fault"] is None


def test_stall_stops_cycles_while_a_request_waits_and_none_resumes(api: Served) -> None:
    eng, obs = api.engine, api.observer
    assert api.client.post("/admin/fault", json={"fault": "stall"}).json()["previous"] is None
    result: dict[str, Any] = {}
    prompt = api.prompts[0]

    def send() -> None:
        result["r"] = api.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 20})

    t = threading.Thread(target=send)
    t.start()
    wait_until(lambda: eng.stats().waiting == 1, 10, "the request did not queue")
    obs.force_flush(5)
    cycles = obs.snapshot().cycles_total
    time.sleep(1.5)
    obs.force_flush(5)
    assert obs.snapshot().cycles_total == cycles, "cycles advanced while stalled"
    assert "r" not in result
    # The server reports the waiting request to specobs (the stall alert reads it).
    wait_until(lambda: obs.snapshot().requests_waiting == 1, 5, "requests_waiting not reported")
    metrics = api.client.get("/metrics").text
    assert any(
        line.startswith("specobs_requests_waiting") and line.rstrip().endswith(" 1.0")
        for line in metrics.splitlines()
    ), metrics
    assert api.client.post("/admin/fault", json={"fault": None}).json()["previous"] == "stall"
    t.join(60)
    assert result["r"].status_code == 200
    assert result["r"].json()["choices"][0]["token_ids"] == reference(api, prompt, 20)
    obs.force_flush(5)
    assert obs.snapshot().cycles_total > cycles


def test_slow_verify_and_wrong_hidden_layers_change_the_cycle_not_the_output(api: Served) -> None:
    """slow-verify runs the verify forward 1 + 3 times: the verify phase gets visibly longer.
    wrong-hidden-layers feeds the draft other target layers; output stays greedy either way.
    (The acceptance collapse itself is measured in tests/test_demo_engine.py.)"""
    obs = api.observer

    def run(fault: str | None) -> tuple[float, float]:
        assert api.client.post("/admin/fault", json={"fault": fault}).json()["fault"] == fault
        obs.force_flush(5)
        before = obs.snapshot()
        for prompt in api.prompts[:3]:
            out = complete(api, prompt=prompt, max_tokens=24)
            assert out["choices"][0]["token_ids"] == reference(api, prompt, 24), fault
        obs.force_flush(5)
        after = obs.snapshot()

        def mean(phase: str) -> float:
            n = after.phase_count(phase, "host") - before.phase_count(phase, "host")
            s = after.phase_seconds_sum(phase, "host") - before.phase_seconds_sum(phase, "host")
            return s / n

        return mean("verify"), mean("draft")

    # Other processes only ever add time: of three alternating rounds, the one least disturbed
    # shows the fault's own cost (the verify forward 3 more times).
    rounds = []
    for _ in range(3):
        healthy_verify, _ = run(None)
        slow_verify, _ = run("slow-verify")
        rounds.append((healthy_verify, slow_verify))
        if slow_verify > 2 * healthy_verify:
            break
    assert max(slow / healthy for healthy, slow in rounds) > 2, rounds
    run("wrong-hidden-layers")
    assert api.client.get("/admin/fault").json()["fault"] == "wrong-hidden-layers"


# -- hostile and careless clients -------------------------------------------------------------

#: The strict server's limits: small, so that each limit is reached quickly.
STRICT = ServerLimits(max_body_bytes=64 * 1024, max_requests=2, read_timeout_seconds=0.5)


class Strict:
    """A second app and uvicorn over the shared engine, with :data:`STRICT` limits and no admin
    token."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.server = ServerThread(create_app(served.engine, limits=STRICT), port=0,
                                   limits=STRICT).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=60)

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture(scope="module")
def strict_server(served: Served) -> Iterator[Strict]:
    s = Strict(served)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def strict(strict_server: Strict, api: Served) -> Strict:
    return strict_server


def assert_openai_error(r: httpx.Response, status: int, kind: str, needle: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == kind, error
    assert needle in error["message"], error["message"]
    return error


def drip(port: int, first: bytes, every: float = 0.1, limit: float = 5.0) -> tuple[float, bytes]:
    """Send ``first``, then one more byte every ``every`` seconds, until the server hangs up;
    returns the seconds that took and what the server sent. Fails after ``limit`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        started = time.monotonic()
        sock.sendall(first)
        got = b""
        while time.monotonic() - started < limit:
            readable, _, _ = select.select([sock], [], [], every)
            try:
                if readable:
                    data = sock.recv(65536)
                    if not data:
                        return time.monotonic() - started, got
                    got += data
                else:
                    sock.sendall(b"x")
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - started, got
    raise AssertionError(f"the server still held the connection after {limit} s; sent {got!r}")


def test_a_body_over_the_cap_is_refused_with_413(api: Served, strict: Strict) -> None:
    big = {"prompt": "a " * (600 * 1024), "max_tokens": 4}  # 1.2 MB of JSON: over the 1 MiB cap
    started = time.monotonic()
    r = api.client.post("/v1/completions", json=big)
    error = assert_openai_error(r, 413, "invalid_request_error", "larger than this server's limit")
    assert error["code"] == "request_too_large"
    assert time.monotonic() - started < 5
    # A chunked body (no Content-Length) is cut at the cap as it arrives.
    sent = []

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(64):
            sent.append(4096)
            yield b"a " * 2048
        yield b'"}'

    r = strict.client.post("/v1/completions", content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert_openai_error(r, 413, "invalid_request_error", "limit of 65536 bytes")
    assert "content-length" not in {k.lower() for k in r.request.headers}
    # Both servers go on serving.
    prompt = api.prompts[0]
    assert complete(api, prompt=prompt, max_tokens=4)["choices"][0]["token_ids"] == reference(
        api, prompt, 4)


def test_a_lone_surrogate_in_the_prompt_is_a_400_not_a_500(api: Served) -> None:
    for raw, at in ((b'{"prompt": "\\ud800 a", "max_tokens": 2}', 0),
                    (b'{"prompt": "ab \\udfff", "max_tokens": 2}', 3)):
        r = api.client.post("/v1/completions", content=raw,
                            headers={"Content-Type": "application/json"})
        error = assert_openai_error(r, 400, "invalid_request_error", "lone surrogate")
        assert f"at character {at}" in error["message"]
        assert error["param"] == "prompt"
    # A surrogate pair is one real character: accepted.
    r = api.client.post("/v1/completions", content=b'{"prompt": "a \\ud83d\\ude00", '
                        b'"max_tokens": 2}', headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_prompts_are_measured_before_and_tokenized_off_the_event_loop(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = api.engine.tokenizer
    calls: list[tuple[int, str]] = []
    encode = tok.encode

    def spy(text: str) -> list[int]:
        calls.append((len(text), threading.current_thread().name))
        return encode(text)

    monkeypatch.setattr(tok, "encode", spy)
    limit = api.engine.max_request_tokens()
    long_text = "to " * (16 * limit)  # under the body cap, far over what can fit
    r = api.client.post("/v1/completions", json={"prompt": long_text, "max_tokens": 1})
    error = assert_openai_error(r, 400, "invalid_request_error", f"at most {16 * limit} characters")
    assert error["param"] == "prompt" and f"got {len(long_text)} characters" in error["message"]
    assert calls == [], "the over-long prompt was tokenized"
    prompt_text = tok.decode(api.prompts[1])
    out = complete(api, prompt=prompt_text, max_tokens=4)
    assert out["usage"]["prompt_tokens"] == len(encode(prompt_text))
    ((length, thread),) = calls
    assert length == len(prompt_text)
    assert thread != "specobs-demo-http", "tokenized on the event loop's thread"


#: The server's deadline runs from its accept, the test's clock from a moment later, and the
#: event loop may run a timer up to a millisecond early: seen 0.497 s for a 0.5 s deadline.
EARLY_SECONDS = 0.05


def test_slow_clients_are_dropped(strict: Strict) -> None:
    port = strict.server.port
    low = STRICT.read_timeout_seconds - EARLY_SECONDS
    # Headers a byte at a time: the connection is closed, nothing is answered.
    seconds, got = drip(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert got == b""
    assert low <= seconds < STRICT.read_timeout_seconds + 2.5
    # A connection that sends nothing at all.
    seconds, got = drip(port, b"", every=60)
    assert got == b"" and seconds < STRICT.read_timeout_seconds + 2.5
    # Whole headers, then the body a byte at a time: 408 in the API's shape, then closed.
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{")
    seconds, got = drip(port, head)
    assert low <= seconds < STRICT.read_timeout_seconds + 2.5
    status, _, rest = got.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", got
    assert b"connection: close" in rest.lower()
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout"
    assert "did not arrive within 0.5 s" in error["message"]
    # Prompt clients are served as before.
    assert strict.client.get("/health").json()["status"] == "ok"


def test_the_admission_limit_answers_429_with_retry_after(api: Served, strict: Strict) -> None:
    eng = api.engine
    eng.fault = "stall"
    results: list[httpx.Response] = []

    def send(i: int) -> None:
        results.append(strict.client.post(
            "/v1/completions", json={"prompt": api.prompts[i], "max_tokens": 6}))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(STRICT.max_requests)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: eng.stats().waiting == STRICT.max_requests, 10, "requests did not queue")
        r = strict.client.post("/v1/completions", json={"prompt": api.prompts[5], "max_tokens": 2})
        error = assert_openai_error(r, 429, "rate_limit_error", "2 completions in flight")
        assert error["code"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "1"
        assert eng.stats().waiting == STRICT.max_requests  # the refused one never reached it
        # Other endpoints are not limited.
        assert strict.client.get("/health").status_code == 200
    finally:
        eng.fault = None
        for t in threads:
            t.join(60)
    assert [r.status_code for r in results] == [200] * STRICT.max_requests
    # The slots are free again, streaming or not.
    for stream in (False, True, False):
        r = strict.client.post("/v1/completions", json={"prompt": api.prompts[6], "max_tokens": 3,
                                                        "stream": stream})
        assert r.status_code == 200, r.text


def test_admin_needs_the_token(api: Served) -> None:
    url = api.server.url + "/admin/fault"
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"},
                    {"Authorization": f"Basic {ADMIN_TOKEN}"}, {"Authorization": ADMIN_TOKEN}):
        r = httpx.get(url, headers=headers, timeout=10)
        assert_openai_error(r, 401, "authentication_error", "Authorization: Bearer <token>")
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = httpx.post(url, headers=headers, json={"fault": "stall"}, timeout=10)
        assert r.status_code == 401
        # Authorization comes before the body is even parsed.
        r = httpx.post(url, headers=headers, content=b"{nonsense", timeout=10)
        assert r.status_code == 401
    assert api.engine.fault is None
    r = httpx.get(url, headers={"Authorization": "Bearer wrong-token-wrong-token"}, timeout=10)
    assert "the token given is wrong" in r.json()["error"]["message"]
    ok = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["fault"] is None


def test_admin_is_off_without_a_token(api: Served, strict: Strict) -> None:
    for method in ("GET", "POST"):
        r = strict.client.request(method, "/admin/fault", json={"fault": "stall"},
                                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert_openai_error(r, 404, "not_found", "the admin endpoints are off")
    assert api.engine.fault is None
    r = strict.client.get("/admin")
    assert r.status_code == 404
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_app(api.engine, admin_token="short")


def test_every_failure_is_json(api: Served, strict: Strict,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Bytes that are not HTTP: uvicorn's own 400, in the API's shape.
    seconds, got = drip(strict.server.port, b"\x16\x03\x01 not http at all\r\n\r\n", every=5)
    status, _, rest = got.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", got
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["type"] == "invalid_request_error"
    # An exception in a route: a JSON 500, and the server goes on.

    def broken() -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(api.engine, "stats", broken)
    r = api.client.get("/health")
    assert_openai_error(r, 500, "server_error", "the server failed this request")
    monkeypatch.undo()
    assert api.client.get("/health").json()["status"] == "ok"


def test_the_fault_api_takes_none_as_the_command_line_spells_it(api: Served) -> None:
    assert api.client.post("/admin/fault", json={"fault": "stall"}).json()["fault"] == "stall"
    switched = api.client.post("/admin/fault", json={"fault": "none"}).json()
    assert switched == {"fault": None, "previous": "stall", "faults": switched["faults"]}
    assert api.engine.fault is None
    bad = api.client.post("/admin/fault", json={"fault": "None!"})
    assert bad.status_code == 400 and "expected one of" in bad.text


def test_stopping_with_requests_in_flight_answers_them_and_cancels_no_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stalled engine never finishes what it holds: at shutdown the server gives requests in
    flight a moment, then the engine's close ends them, so each client gets a 503 that says why
    and uvicorn has no task to cancel (it logged a CancelledError traceback for each, and the
    demo's load counted them as 500s)."""
    s = Served()
    try:
        s.engine.fault = "stall"
        answers: list[httpx.Response] = []

        def ask() -> None:
            answers.append(s.client.post("/v1/completions",
                                         json={"prompt": s.prompts[0], "max_tokens": 8}))

        clients = [threading.Thread(target=ask) for _ in range(3)]
        for t in clients:
            t.start()
        wait_until(lambda: s.engine.has_work(), 30, "the requests did not reach the engine")
        with caplog.at_level("INFO"):
            s.server.stop(grace_seconds=0.5, on_grace_end=s.engine.close)
            for t in clients:
                t.join(30)
        assert not s.server._thread.is_alive()
        assert [a.status_code for a in answers] == [503] * 3, [a.text for a in answers]
        assert all("shutting down" in a.json()["error"]["message"] for a in answers)
        assert "Exception in ASGI application" not in caplog.text
        assert "Cancel" not in caplog.text, caplog.text
    finally:
        s.engine.fault = None
        s.close()
