"""An in-memory sink for tests (yours and ours): keeps the last N resolved cycles."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from specobs._model import ResolvedCycle, Snapshot
from specobs.sinks._base import Sink

__all__ = ["MemorySink"]


class MemorySink(Sink):
    """Keeps resolved cycles (bounded) and reads the observer's aggregation back.

    >>> import specobs
    >>> mem = specobs.MemorySink()
    >>> obs = specobs.configure(sinks=[mem], clock="host")
    >>> with obs.cycle() as c:
    ...     c.mark("verify"); c.mark("bookkeeping"); c.accept([1, 2], draft_length=4)
    >>> obs.force_flush()
    True
    >>> mem.snapshot().accepted_tokens_total
    3
    >>> obs.shutdown()

    Args:
        max_cycles: resolved cycles kept, the oldest let go first (0: none, and the resolver
            hands this sink no cycles).
        traces: whether the resolver picks cycles to trace for this sink.
    """

    def __init__(self, max_cycles: int = 100_000, *, traces: bool = False) -> None:
        self._cycles: deque[ResolvedCycle] = deque(maxlen=max_cycles)
        self._lock = threading.Lock()
        self.wants_traces = traces
        self.wants_cycles = max_cycles > 0
        self.shut_down = False

    def on_cycles(self, cycles: Sequence[ResolvedCycle]) -> None:
        with self._lock:
            self._cycles.extend(cycles)

    @property
    def cycles(self) -> list[ResolvedCycle]:
        """Resolved cycles in order, oldest first (at most ``max_cycles``)."""
        with self._lock:
            return list(self._cycles)

    def clear(self) -> None:
        with self._lock:
            self._cycles.clear()

    def snapshot(self) -> Snapshot:
        """The attached observer's aggregation (call ``observer.force_flush()`` first)."""
        return self.source.snapshot()

    def shutdown(self, timeout_seconds: float) -> None:
        self.shut_down = True
