"""specobs: observability for speculative decoding.

Times the draft, verify and bookkeeping phases of every speculative decoding cycle on the GPU's own
clock without synchronising the device, counts drafted and accepted tokens, and exports it all as
Prometheus and OpenTelemetry metrics and traces.

    import specobs
    obs = specobs.configure(sinks=[specobs.PrometheusSink()])
    with obs.cycle(batch_size=len(batch)) as c:
        draft(...)
        c.mark("verify")
        verify(...)
        c.mark("bookkeeping")
        c.accept(accepted_lengths, draft_length=k)

``import specobs`` loads no torch, prometheus_client, opentelemetry or grafanalib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specobs._config import Settings
from specobs._errors import (
    ConfigurationError,
    MissingDependencyError,
    ObserverClosedError,
    SpecobsError,
)
from specobs._model import CycleHandle, Exemplar, HistogramData, ResolvedCycle, Snapshot
from specobs._observer import Observer, configure
from specobs._version import __version__
from specobs.sinks import MemorySink, Sink

if TYPE_CHECKING:
    # The real classes for type checkers and editors. At run time the module __getattr__ below
    # imports them on first use, so importing this module loads neither prometheus_client nor
    # opentelemetry.
    from specobs.sinks.otlp import OtlpSink
    from specobs.sinks.prometheus import PrometheusSink

__all__ = [
    "ConfigurationError",
    "CycleHandle",
    "Exemplar",
    "HistogramData",
    "MemorySink",
    "MissingDependencyError",
    "Observer",
    "ObserverClosedError",
    "OtlpSink",
    "PrometheusSink",
    "ResolvedCycle",
    "Settings",
    "Sink",
    "Snapshot",
    "SpecobsError",
    "__version__",
    "configure",
]


def __getattr__(name: str) -> Any:
    # Heavy sinks load their SDK only when asked for.
    if name in ("PrometheusSink", "OtlpSink"):
        from specobs import sinks

        return getattr(sinks, name)
    if name == "Cycle":
        import warnings

        from specobs._recorder import Cycle

        warnings.warn(
            "specobs.Cycle is deprecated: it is the class of one core's handles (the native or "
            "the pure-Python one); annotate with specobs.CycleHandle, the protocol both follow",
            DeprecationWarning, stacklevel=2,
        )
        return Cycle
    raise AttributeError(f"module 'specobs' has no attribute {name!r}")
