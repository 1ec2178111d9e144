"""The sink interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specobs._observer import Observer
    from specobs._resolver import ResolvedCycle

__all__ = ["Sink"]


class Sink:
    """Base class of sinks. Override what you need; every method has a harmless default.

    ``attach`` is called once by ``configure()``; ``on_cycles`` on the resolver thread with each
    batch of resolved cycles (keep it cheap: the resolver shares the GIL with the worker);
    ``force_flush`` and ``shutdown`` must return within ``timeout_seconds``.
    """

    #: Whether the resolver should pick cycles to trace and assign trace/span ids.
    wants_traces: bool = False
    #: Whether ``on_cycles`` should receive every resolved cycle (else only traced ones).
    wants_cycles: bool = False

    def attach(self, observer: Observer) -> None:
        self.observer = observer

    def on_cycles(self, cycles: Sequence[ResolvedCycle]) -> None:
        pass

    def force_flush(self, timeout_seconds: float) -> bool:
        return True

    def shutdown(self, timeout_seconds: float) -> None:
        pass

    def after_fork_in_child(self) -> None:
        """Called in a forked child after the observer rebuilt its resolver and zeroed its
        totals: restart what needs a thread or a socket of its own, or log that it cannot."""
