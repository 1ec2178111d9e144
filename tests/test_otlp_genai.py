"""OpenTelemetry GenAI attributes on the OTLP sink's resource and spans, at a real OTLP receiver.

What arrives over gRPC and HTTP/protobuf is read back from the protobuf messages: the resource
of every metrics and traces request, the cycle span's attributes and the metric points' ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv.attributes import server_attributes

import specobs
from specobs import catalog
from specobs.sinks import _otlp_genai
from specobs.sinks.otlp import OtlpSink
from tests._cores import observer_factory
from tests._otlp_receiver import OtlpReceiver, ReceivedSpan, attributes_to_dict

pytestmark = pytest.mark.slow

NEVER = 3600.0  # export interval: no timer export fires during a test
PROVIDER = gen_ai_attributes.GEN_AI_PROVIDER_NAME
REQUEST_MODEL = gen_ai_attributes.GEN_AI_REQUEST_MODEL
RESPONSE_MODEL = gen_ai_attributes.GEN_AI_RESPONSE_MODEL
ADDRESS = server_attributes.SERVER_ADDRESS
PORT = server_attributes.SERVER_PORT


@pytest.fixture(params=["grpc", "http/protobuf"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def observers() -> Iterator[Callable[..., specobs.Observer]]:
    """``specobs.configure`` that shuts every observer down after the test."""
    yield from observer_factory()


def sink_for(receiver: OtlpReceiver, protocol: str, **kwargs: Any) -> OtlpSink:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return OtlpSink(endpoint=endpoint, protocol=protocol, export_interval_seconds=NEVER, **kwargs)


def run_cycles(obs: specobs.Observer, n: int = 2) -> None:
    for _ in range(n):
        with obs.cycle(batch_size=2) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1, 3], draft_length=4)
    assert obs.force_flush(5.0)


def cycle_spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return [s for s in receiver.spans() if s.name == catalog.CYCLE_SPAN_NAME]


def genai(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if k in _otlp_genai.GENAI_KEYS}


def test_configured_attributes_reach_the_resource_and_the_cycle_spans(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer]
) -> None:
    sink = sink_for(
        otlp_receiver, protocol, service_name="llm-server", provider_name="vllm",
        request_model="llama-3-8b", response_model="meta-llama/Llama-3-8B@a1b2",
        server_address="llm.internal", server_port=8000,
    )  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    run_cycles(obs)

    expected = {
        PROVIDER: "vllm", REQUEST_MODEL: "llama-3-8b",
        RESPONSE_MODEL: "meta-llama/Llama-3-8B@a1b2", ADDRESS: "llm.internal", PORT: 8000,
    }  # fmt: skip
    transport = "grpc" if protocol == "grpc" else "http"
    requests = otlp_receiver.requests()
    assert {(r.transport, r.signal) for r in requests} == {
        (transport, "traces"), (transport, "metrics")}
    metrics = otlp_receiver.metrics()
    assert metrics
    for resource, metric in metrics:
        assert genai(resource) == expected
        assert resource["service.name"] == "llm-server"
        # Points keep the catalog's labels only: a gen_ai.* point attribute would become a
        # Prometheus label the scrape path does not have.
        data = getattr(metric, str(metric.WhichOneof("data")))
        for point in data.data_points:
            assert not genai(attributes_to_dict(point.attributes)), metric.name
    spans = otlp_receiver.spans()
    roots = cycle_spans(otlp_receiver)
    assert len(roots) == 2 and len(spans) == 2 * 4
    for span in spans:
        assert genai(span.resource) == expected
    for root in roots:
        assert root.attributes == {
            **expected,
            "specobs.cycle.index": root.attributes["specobs.cycle.index"],
            "specobs.clock": "host",
            "specobs.host_duration_ns": root.attributes["specobs.host_duration_ns"],
            "specobs.batch_size": 2,
            "specobs.draft_tokens": 8,
            "specobs.accepted_tokens": 4,
            "specobs.emitted_tokens": 6,
        }
        # A span's attributes keep their order: the GenAI ones come first.
        assert list(root.attributes)[:5] == list(expected)
    for phase in (s for s in spans if s.name != catalog.CYCLE_SPAN_NAME):
        assert not genai(phase.attributes)  # the resource carries them for the phase spans


@pytest.mark.parametrize(
    ("labels", "integration", "expected"),
    [
        ({"model_name": "llama-3-8b", "serving_engine": "sglang"}, "manual",
         {PROVIDER: "sglang", REQUEST_MODEL: "llama-3-8b", RESPONSE_MODEL: "llama-3-8b"}),
        # The label names the engine even where the integration says another.
        ({"model_name": "m", "serving_engine": "trtllm"}, "vllm_v2",
         {PROVIDER: "trtllm", REQUEST_MODEL: "m", RESPONSE_MODEL: "m"}),
        ({"model_name": "qwen"}, "vllm_v2",
         {PROVIDER: "vllm", REQUEST_MODEL: "qwen", RESPONSE_MODEL: "qwen"}),
        ({}, "sglang", {PROVIDER: "sglang"}),
        ({}, "transformers", {PROVIDER: "transformers"}),
        ({"model_name": "m"}, "unsupported", {REQUEST_MODEL: "m", RESPONSE_MODEL: "m"}),
        ({"team": "infer"}, "manual", {}),
    ],
)
def test_the_observers_labels_and_integration_give_the_defaults(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer],
    labels: dict[str, str], integration: str, expected: dict[str, str],
) -> None:  # fmt: skip
    sink = sink_for(otlp_receiver, protocol)
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0, labels=labels,
                    integration=integration)
    run_cycles(obs, 1)
    for resource, _ in otlp_receiver.metrics():
        assert genai(resource) == expected
    (root,) = cycle_spans(otlp_receiver)
    assert genai(root.resource) == expected
    assert genai(root.attributes) == expected


def test_each_source_in_its_rank(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
    observers: Callable[..., specobs.Observer],
) -> None:  # fmt: skip
    """argument > resource_attributes > SPECOBS_* > OTEL_RESOURCE_ATTRIBUTES > the observer."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", ",".join([
        f"{PROVIDER}=from-otel", f"{REQUEST_MODEL}=from-otel", f"{ADDRESS}=from-otel",
        f"{RESPONSE_MODEL}=from-otel",
    ]))  # fmt: skip
    monkeypatch.setenv("SPECOBS_GENAI_PROVIDER_NAME", "from-specobs-env")
    monkeypatch.setenv("SPECOBS_GENAI_REQUEST_MODEL", "from-specobs-env")
    monkeypatch.setenv("SPECOBS_SERVER_PORT", "8001")
    sink = sink_for(
        otlp_receiver, "grpc",
        resource_attributes={REQUEST_MODEL: "from-resource-arg", PORT: 9000},
        server_port=8002,
    )  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0,
                    labels={"model_name": "from-label", "serving_engine": "from-label"})
    run_cycles(obs, 1)
    expected = {
        PROVIDER: "from-specobs-env",  # over OTEL_RESOURCE_ATTRIBUTES and the label
        REQUEST_MODEL: "from-resource-arg",  # over the variables and the label
        RESPONSE_MODEL: "from-otel",  # configured: not the request model, not the label
        ADDRESS: "from-otel",
        PORT: 8002,  # the argument over resource_attributes and SPECOBS_SERVER_PORT
    }
    (root,) = cycle_spans(otlp_receiver)
    assert genai(root.resource) == expected
    assert genai(root.attributes) == expected
    for resource, _ in otlp_receiver.metrics():
        assert genai(resource) == expected


def test_the_response_model_follows_a_configured_request_model(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    sink = sink_for(otlp_receiver, "http/protobuf", request_model="llama-3-8b-instruct")
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0,
                    labels={"model_name": "llama"})
    run_cycles(obs, 1)
    (root,) = cycle_spans(otlp_receiver)
    assert genai(root.attributes) == {
        REQUEST_MODEL: "llama-3-8b-instruct", RESPONSE_MODEL: "llama-3-8b-instruct"}


def test_configure_from_the_environment_alone(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
    observers: Callable[..., specobs.Observer],
) -> None:  # fmt: skip
    """The deployment path: ``SPECOBS_EXPORTERS=otlp``, no sink built by hand."""
    for name, value in {
        "SPECOBS_EXPORTERS": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "specobs",
        "SPECOBS_LABELS": "model_name=mistral-7b,serving_engine=sglang",
        "SPECOBS_TRACE_HEAD_RATE": "1",
        "SPECOBS_SERVER_ADDRESS": "10.0.0.7",
        "SPECOBS_SERVER_PORT": "30000",
        "SPECOBS_GENAI_RESPONSE_MODEL": "mistralai/Mistral-7B-Instruct-v0.3",
    }.items():
        monkeypatch.setenv(name, value)
    obs = observers(clock="host")
    run_cycles(obs, 1)
    expected = {
        PROVIDER: "sglang", REQUEST_MODEL: "mistral-7b",
        RESPONSE_MODEL: "mistralai/Mistral-7B-Instruct-v0.3", ADDRESS: "10.0.0.7", PORT: 30000,
    }  # fmt: skip
    (root,) = cycle_spans(otlp_receiver)
    assert genai(root.attributes) == expected
    assert root.resource["service.name"] == "specobs"
    assert {r.transport for r in otlp_receiver.requests()} == {"http"}
    for resource, _ in otlp_receiver.metrics():
        assert genai(resource) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"server_port": 0}, "server_port must be a port number between 1 and 65535, got 0"),
        ({"server_port": 65536}, "server_port must be a port number between 1 and 65535"),
        ({"server_port": True}, "server_port must be a port number between 1 and 65535, got True"),
        ({"server_port": "8000"}, "server_port must be a port number between 1 and 65535, got "
                                  "'8000'"),
        ({"provider_name": " "}, "provider_name must be a non-empty string, got ' '"),
        ({"request_model": 7}, "request_model must be a non-empty string, got 7"),
        ({"response_model": "a\rb"}, "response_model holds a control character (U+000D"),
        ({"server_address": "h" * 300}, "server_address is 300 characters long"),
    ],
)
def test_bad_arguments_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(specobs.ConfigurationError) as info:
        OtlpSink(endpoint="http://127.0.0.1:4317", **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SPECOBS_SERVER_PORT", "http", "SPECOBS_SERVER_PORT must be a port number between 1 "
                                        "and 65535, got 'http'"),
        ("SPECOBS_SERVER_PORT", "99999", "SPECOBS_SERVER_PORT must be a port number between 1 "
                                         "and 65535, got 99999"),
        ("SPECOBS_GENAI_REQUEST_MODEL", "a\x07b", "SPECOBS_GENAI_REQUEST_MODEL holds a control "
                                                  "character (U+0007"),
    ],
)
def test_bad_variables_are_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(specobs.ConfigurationError) as info:
        OtlpSink(endpoint="http://127.0.0.1:4317")
    assert message in str(info.value)


def test_the_span_attributes_are_the_catalogs(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    """Every ``specobs.*`` key a span carries is a catalog entry on the right span, and every
    catalog entry is carried (a cycle with a batch size and acceptance sets them all)."""
    sink = sink_for(otlp_receiver, "grpc")
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    run_cycles(obs, 1)
    spans = otlp_receiver.spans()
    (root,) = cycle_spans(otlp_receiver)
    on_cycle = [a.key for a in catalog.SPAN_ATTRIBUTES if a.spans in ("cycle", "both")]
    on_phase = [a.key for a in catalog.SPAN_ATTRIBUTES if a.spans in ("phase", "both")]
    assert sorted(root.attributes) == sorted(on_cycle)
    types = {a.key: {"int": int, "string": str}[a.type] for a in catalog.SPAN_ATTRIBUTES}
    for span in spans:
        for key, value in span.attributes.items():
            assert type(value) is types[key], key
    phases = [s for s in spans if s.name != catalog.CYCLE_SPAN_NAME]
    assert [s.name for s in phases] == ["draft", "verify", "bookkeeping"]
    for span in phases:
        assert sorted(span.attributes) == sorted(on_phase)


def test_the_attribute_names_are_the_semantic_conventions() -> None:
    """The keys come from the semantic-conventions package, and the default labels are the ones
    the generated dashboards and rules group by."""
    from specobs.mixin import MixinConfig

    assert _otlp_genai.GENAI_KEYS == (
        "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
        "server.address", "server.port",
    )  # fmt: skip
    assert (_otlp_genai.MODEL_LABEL, _otlp_genai.ENGINE_LABEL) == (
        MixinConfig().model_label, MixinConfig().engine_label)
