"""OTLP transport settings: the ``OTEL_EXPORTER_OTLP_*`` protocol variables and the exporters.

The endpoint, header, timeout, TLS and compression variables are interpreted by the official
exporters themselves, so they mean here what they mean to every other Python OpenTelemetry
program. specobs resolves only what those exporters do not: which protocol each signal uses.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Literal, cast

from specobs._errors import ConfigurationError, require

require("opentelemetry.sdk", feature="OTLP export", extra="otlp")

from opentelemetry.sdk.metrics.export import MetricExporter  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter  # noqa: E402

__all__ = [
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "PROTOCOLS",
    "OtlpProtocol",
    "make_metric_exporter",
    "make_span_exporter",
    "positive_seconds",
    "resolve_protocol",
]

OtlpProtocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""OTLP transport for both signals: ``grpc`` (default, as the Python SDK) or ``http/protobuf``."""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""OTLP transport for spans; overrides ``OTEL_EXPORTER_OTLP_PROTOCOL``."""

OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
"""OTLP transport for metrics; overrides ``OTEL_EXPORTER_OTLP_PROTOCOL``."""


def _protocol(name: str, value: str) -> OtlpProtocol:
    v = value.strip().lower()
    if v not in PROTOCOLS:
        raise ConfigurationError(
            f"{name} must be 'grpc' or 'http/protobuf', got {value!r}. "
            f"(OTLP over http/json is not supported.)"
        )
    return cast(OtlpProtocol, v)


def resolve_protocol(arg: str | None, signal_var: str, env: Mapping[str, str]) -> OtlpProtocol:
    """The argument, else the signal's variable, else the general one, else ``grpc``."""
    if arg is not None:
        return _protocol("protocol", arg)
    for var in (signal_var, OTEL_EXPORTER_OTLP_PROTOCOL):
        raw = env.get(var)
        if raw is not None and raw.strip():
            return _protocol(var, raw)
    return "grpc"


def positive_seconds(name: str, value: object) -> float:
    """A finite number of seconds > 0, else a ConfigurationError naming ``name``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
    return v


def _signal_endpoint(endpoint: str | None, protocol: OtlpProtocol, path: str) -> str | None:
    if endpoint is None:
        return None  # the exporter reads the per-signal and the general variable itself
    if protocol == "grpc":
        return endpoint
    return f"{endpoint.rstrip('/')}/{path}"


#: The official exporter class of each (signal, protocol), imported only when made.
_EXPORTERS: dict[tuple[str, str], tuple[str, str]] = {
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                         "OTLPSpanExporter"),
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                                  "OTLPSpanExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
                          "OTLPMetricExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                                   "OTLPMetricExporter"),
}


def _make(signal: str, protocol: OtlpProtocol, endpoint: str | None,
          headers: dict[str, str] | None, timeout_seconds: float | None) -> object:
    module, name = _EXPORTERS[(signal, protocol)]
    exporter_class = getattr(importlib.import_module(module), name)
    return exporter_class(
        endpoint=_signal_endpoint(endpoint, protocol, f"v1/{signal}"),
        headers=headers,
        timeout=timeout_seconds,
    )


def make_span_exporter(
    protocol: OtlpProtocol, endpoint: str | None, headers: dict[str, str] | None,
    timeout_seconds: float | None,
) -> SpanExporter:
    """The official OTLP span exporter for ``protocol``; ``endpoint`` is a base URL or None."""
    return cast(SpanExporter, _make("traces", protocol, endpoint, headers, timeout_seconds))


def make_metric_exporter(
    protocol: OtlpProtocol, endpoint: str | None, headers: dict[str, str] | None,
    timeout_seconds: float | None,
) -> MetricExporter:
    """The official OTLP metric exporter for ``protocol``; ``endpoint`` is a base URL or None."""
    return cast(MetricExporter, _make("metrics", protocol, endpoint, headers, timeout_seconds))
