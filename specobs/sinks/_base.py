"""The sink interface, and what a sink is given to read from: a :class:`MetricSource`.

A sink never sees the observer. Like a ``prometheus_client`` collector (which knows only its
``collect()``) or an OpenTelemetry metric reader (which is handed a collect callback, never the
provider), it gets a narrow source: a consistent snapshot to read, and two ways to count its own
cost and losses. The aggregation implements it and stays the only writer of itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from specobs._model import ResolvedCycle, Snapshot

__all__ = ["MetricSource", "Sink"]


@runtime_checkable
class MetricSource(Protocol):
    """What a sink reads and writes back: implemented by the observer's aggregation."""

    @property
    def generation(self) -> int:
        """Moves whenever what :meth:`snapshot` returns may have changed (a cache key)."""
        ...

    def snapshot(self) -> Snapshot:
        """A consistent copy of every total, histogram and gauge."""
        ...

    def add_cpu(self, component: str, seconds: float) -> None:
        """Count thread CPU the sink spent (``specobs_exporter_cpu_time_seconds_total``)."""
        ...

    def count_dropped(self, reason: str, n: int) -> None:
        """Count what the sink lost (``specobs_exporter_dropped_records_total{reason}``)."""
        ...


class Sink:
    """Base class of sinks. Override what you need; every method has a harmless default.

    ``attach`` is called once by ``configure()`` with the observer's :class:`MetricSource`;
    ``on_cycles`` on the resolver thread with each batch of resolved cycles (keep it cheap: the
    resolver shares the GIL with the worker); ``force_flush`` and ``shutdown`` must return within
    ``timeout_seconds``.
    """

    #: Whether the resolver should pick cycles to trace and assign trace/span ids.
    wants_traces: bool = False
    #: Whether ``on_cycles`` should receive every resolved cycle (else only traced ones).
    wants_cycles: bool = False
    #: The source given to :meth:`attach`.
    source: MetricSource

    def attach(self, source: MetricSource) -> None:
        """Keep the observer's source of snapshots; called once by ``configure()``.

        Args:
            source: what the sink reads totals from (``source.snapshot()``).
        """
        self.source = source

    def on_cycles(self, cycles: Sequence[ResolvedCycle]) -> None:
        """Take a batch of resolved cycles, on the resolver's thread.

        Args:
            cycles: every resolved cycle if :attr:`wants_cycles`, else only the traced ones.
        """

    def force_flush(self, timeout_seconds: float) -> bool:
        """Export what is pending.

        Args:
            timeout_seconds: how long the call may take.

        Returns:
            Whether everything pending was exported in time.
        """
        return True

    def shutdown(self, timeout_seconds: float) -> None:
        """Export what is pending and let go of threads and sockets; the sink is not reused.

        Args:
            timeout_seconds: how long the call may take.
        """

    def after_fork_in_child(self) -> None:
        """Called in a forked child after the observer rebuilt its resolver and zeroed its
        totals: restart what needs a thread or a socket of its own, or log that it cannot."""
