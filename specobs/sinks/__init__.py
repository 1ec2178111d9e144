"""Sinks: where resolved cycles and the aggregation go.

``MemorySink`` (tests, no dependencies) is always importable. ``PrometheusSink`` and ``OtlpSink``
import their SDKs lazily; a missing extra raises an ImportError naming ``pip install
'specobs[extra]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specobs.sinks._base import MetricSource, Sink
from specobs.sinks.memory import MemorySink

if TYPE_CHECKING:
    # The real classes for type checkers and editors. At run time the module __getattr__ below
    # imports them on first use, so importing this module loads neither prometheus_client nor
    # opentelemetry.
    from specobs.sinks.otlp import OtlpSink
    from specobs.sinks.prometheus import PrometheusSink

__all__ = ["MemorySink", "MetricSource", "OtlpSink", "PrometheusSink", "Sink"]


def __getattr__(name: str) -> Any:
    if name == "PrometheusSink":
        from specobs.sinks.prometheus import PrometheusSink

        return PrometheusSink
    if name == "OtlpSink":
        from specobs.sinks.otlp import OtlpSink

        return OtlpSink
    raise AttributeError(f"module 'specobs.sinks' has no attribute {name!r}")
