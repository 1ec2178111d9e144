"""OpenTelemetry GenAI semantic-convention attributes of the OTLP sink's resource and spans.

The GenAI conventions (open-telemetry/semantic-conventions-genai; every attribute there is at
stability *development*) describe a model server by ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.response.model``, ``server.address`` and ``server.port``. The
sink puts each of them that is known on its resource, so every metric and span it exports
carries them, and on each ``specobs.cycle`` span, where trace queries that filter spans by
attribute find them. Metric points get none of them: a point attribute becomes a Prometheus
label, and the series would no longer match the ones the Prometheus sink exposes.

Where each value comes from, first match wins:

1. the ``OtlpSink`` argument (``provider_name``, ``request_model``, ``response_model``,
   ``server_address``, ``server_port``);
2. the key in the ``resource_attributes`` argument;
3. the variable below (docs/configuration.md);
4. the key in ``OTEL_RESOURCE_ATTRIBUTES``;
5. what the observer knows, read when the sink is attached: the provider from the constant
   label ``serving_engine``, else the engine the integration instruments (``vllm``,
   ``sglang``, ``transformers``); the request model from the constant label ``model_name``;
   the response model is the request model. The server's address and port have no default.

These are the precedences of ``service.name`` too (argument, then ``OTEL_SERVICE_NAME``, then
``OTEL_RESOURCE_ATTRIBUTES``). No ``specobs.*`` attribute is renamed or removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specobs._errors import ConfigurationError, require
from specobs.catalog import label_value_problem

require("opentelemetry.semconv", feature="OTLP export", extra="otlp")

from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (  # noqa: E402
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
)
from opentelemetry.semconv.attributes.server_attributes import (  # noqa: E402
    SERVER_ADDRESS,
    SERVER_PORT,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME  # noqa: E402

__all__ = [
    "ENGINE_LABEL",
    "GENAI_KEYS",
    "INTEGRATION_PROVIDERS",
    "MODEL_LABEL",
    "SPECOBS_GENAI_PROVIDER_NAME",
    "SPECOBS_GENAI_REQUEST_MODEL",
    "SPECOBS_GENAI_RESPONSE_MODEL",
    "SPECOBS_SERVER_ADDRESS",
    "SPECOBS_SERVER_PORT",
    "configured_attributes",
    "observer_defaults",
    "sink_resource",
    "span_attributes",
]

SPECOBS_GENAI_PROVIDER_NAME = "SPECOBS_GENAI_PROVIDER_NAME"
"""``gen_ai.provider.name`` of the OTLP resource and cycle spans: the serving engine, ``vllm``
or ``sglang`` say. Default: the ``serving_engine`` constant label, else the instrumented engine."""

SPECOBS_GENAI_REQUEST_MODEL = "SPECOBS_GENAI_REQUEST_MODEL"
"""``gen_ai.request.model``: the model name clients ask for. Default: the ``model_name``
constant label."""

SPECOBS_GENAI_RESPONSE_MODEL = "SPECOBS_GENAI_RESPONSE_MODEL"
"""``gen_ai.response.model``: the model that generates the responses, where it differs from the
name clients ask for (an alias, a pinned revision). Default: the request model."""

SPECOBS_SERVER_ADDRESS = "SPECOBS_SERVER_ADDRESS"
"""``server.address``: the host name or IP address clients reach the inference server at. No
default."""

SPECOBS_SERVER_PORT = "SPECOBS_SERVER_PORT"
"""``server.port``: the port clients reach the inference server at, 1-65535. No default."""

#: Every attribute this module sets, in the order the spans carry them.
GENAI_KEYS: tuple[str, ...] = (
    GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL, SERVER_ADDRESS, SERVER_PORT,
)

#: The constant labels the defaults are read from: the names docs/deploy.md recommends, which
#: the generated dashboards and rules group by.
MODEL_LABEL = "model_name"
ENGINE_LABEL = "serving_engine"

#: The provider each integration (``specobs_info{integration}``) implies; ``manual`` and
#: ``unsupported`` imply none.
INTEGRATION_PROVIDERS: dict[str, str] = {
    "vllm": "vllm",
    "vllm_v1": "vllm",
    "vllm_v2": "vllm",
    "sglang": "sglang",
    "transformers": "transformers",
}

# (argument, variable, attribute key) of each setting.
_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("provider_name", SPECOBS_GENAI_PROVIDER_NAME, GEN_AI_PROVIDER_NAME),
    ("request_model", SPECOBS_GENAI_REQUEST_MODEL, GEN_AI_REQUEST_MODEL),
    ("response_model", SPECOBS_GENAI_RESPONSE_MODEL, GEN_AI_RESPONSE_MODEL),
    ("server_address", SPECOBS_SERVER_ADDRESS, SERVER_ADDRESS),
    ("server_port", SPECOBS_SERVER_PORT, SERVER_PORT),
)
# Longest text value accepted: the label rule's default limit.
_MAX_TEXT = 256


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
    text = value.strip()
    problem = label_value_problem(text, _MAX_TEXT)
    if problem is not None:
        raise ConfigurationError(f"{name} {problem}; got {text[:60]!r}")
    return text


def _port(name: str, value: object, from_env: bool) -> int:
    if from_env:
        try:
            value = int(str(value).strip())
        except ValueError:
            raise ConfigurationError(
                f"{name} must be a port number between 1 and 65535, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigurationError(
            f"{name} must be a port number between 1 and 65535, got {value!r}")
    return value


def _parse(name: str, key: str, value: object, from_env: bool) -> str | int:
    return _port(name, value, from_env) if key == SERVER_PORT else _text(name, value)


def configured_attributes(
    arguments: Mapping[str, object], env: Mapping[str, str]
) -> tuple[dict[str, str | int], dict[str, str | int]]:
    """The GenAI attributes given by ``OtlpSink`` arguments (``arguments``: argument name ->
    value, ``None`` for not given) and by the variables in ``env``, validated; returned
    separately, since ``resource_attributes`` ranks between the two.

    Raises :class:`~specobs.ConfigurationError` naming the argument or variable.
    """
    from_arguments: dict[str, str | int] = {}
    from_env: dict[str, str | int] = {}
    for argument, variable, key in _SETTINGS:
        value = arguments.get(argument)
        if value is not None:
            from_arguments[key] = _parse(argument, key, value, False)
        raw = env.get(variable)
        if raw is not None and raw.strip():
            from_env[key] = _parse(variable, key, raw, True)
    return from_arguments, from_env


def observer_defaults(
    present: Mapping[str, Any], labels: Mapping[str, str], integration: str | None
) -> dict[str, str]:
    """The attributes the observer implies that ``present`` (the resource's attributes) does
    not already hold: provider and models from the constant labels and the integration."""
    out: dict[str, str] = {}
    provider = labels.get(ENGINE_LABEL) or INTEGRATION_PROVIDERS.get(integration or "")
    if provider and GEN_AI_PROVIDER_NAME not in present:
        out[GEN_AI_PROVIDER_NAME] = provider
    model = present.get(GEN_AI_REQUEST_MODEL) or labels.get(MODEL_LABEL)
    if model and GEN_AI_REQUEST_MODEL not in present:
        out[GEN_AI_REQUEST_MODEL] = str(model)
    if model and GEN_AI_RESPONSE_MODEL not in present:
        out[GEN_AI_RESPONSE_MODEL] = str(model)
    return out


def span_attributes(resource_attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The GenAI attributes of the resource, which every cycle span carries too."""
    return {k: resource_attributes[k] for k in GENAI_KEYS if k in resource_attributes}


def sink_resource(
    arguments: Mapping[str, object],
    resource_attributes: Mapping[str, str | bool | int | float] | None,
    service_name: str | None,
    env: Mapping[str, str],
) -> Any:
    """The sink's OTLP ``Resource``: the GenAI variables, then ``resource_attributes``, then the
    GenAI ``arguments`` (as :func:`configured_attributes` takes them) and ``service_name``, each
    over the one before; ``Resource.create`` adds ``OTEL_RESOURCE_ATTRIBUTES`` and
    ``OTEL_SERVICE_NAME`` below them all.

    Raises :class:`~specobs.ConfigurationError` on an invalid value or variable.
    """
    from opentelemetry.sdk.resources import Resource

    genai_arguments, genai_env = configured_attributes(arguments, env)
    attrs: dict[str, Any] = {**genai_env, **(resource_attributes or {}), **genai_arguments}
    if service_name is not None:
        attrs[SERVICE_NAME] = service_name
    try:
        return Resource.create(attrs)
    except Exception as exc:
        raise ConfigurationError(
            f"could not build the OTLP resource from OTEL_RESOURCE_ATTRIBUTES / "
            f"OTEL_SERVICE_NAME / resource_attributes: {exc}"
        ) from exc
