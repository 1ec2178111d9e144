"""A deterministic fake GPU for tests: events complete only when the test says so.

``FakeGpu`` has a timeline. ``record_fn`` stamps an event with the timeline's current position;
``gpu.run(ns)`` advances it (work enqueued); ``gpu.complete()`` marks everything enqueued so far as
done. A test can therefore hold events pending, assert nothing resolves, then release them —
without sleeps or races.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from specobs.timing._base import EventPool, PendingCopy

__all__ = ["FakeDeviceArray", "FakeEvent", "FakeEventClock", "FakeGpu"]


class FakeGpu:
    """A GPU timeline in nanoseconds with a completion frontier."""

    def __init__(self) -> None:
        self.now_ns = 0
        self.completed_ns = -1
        self.capturing = False
        self._lock = threading.Lock()

    def run(self, ns: int) -> None:
        """Enqueue ``ns`` nanoseconds of work."""
        with self._lock:
            self.now_ns += ns

    def complete(self) -> None:
        """Finish all work enqueued so far."""
        with self._lock:
            self.completed_ns = self.now_ns


class FakeEvent:
    __slots__ = ("recorded", "ts")

    def __init__(self) -> None:
        self.ts = -1
        self.recorded = False


class FakeDeviceArray:
    """Stands in for a CUDA tensor of accepted lengths (``is_cuda`` is True)."""

    is_cuda = True

    def __init__(self, values: Sequence[int]) -> None:
        self.values = list(values)

    def numel(self) -> int:
        return len(self.values)


class _FakeBuffer:
    def __init__(self, values: list[int]) -> None:
        self.values = values

    def __getitem__(self, s: slice) -> _FakeBuffer:
        return _FakeBuffer(self.values[s])

    def tolist(self) -> list[int]:
        return list(self.values)


class FakeEventClock(EventPool):
    """An :class:`~specobs.timing.EventClock` over a :class:`FakeGpu`."""

    name = "fake"

    def __init__(self, gpu: FakeGpu | None = None, pool_size: int = 64) -> None:
        self.gpu = gpu if gpu is not None else FakeGpu()
        self.pool_size = pool_size
        super().__init__([FakeEvent() for _ in range(pool_size)])
        self.stream = object()
        self.record_stream = self.stream
        gpu_ = self.gpu

        def record_fn(event: Any, stream: Any) -> None:
            event.ts = gpu_.now_ns
            event.recorded = True

        self.record_fn = record_fn
        self.copies = 0

    def query(self, event: Any) -> bool:
        return bool(event.recorded) and event.ts <= self.gpu.completed_ns

    def elapsed_ns(self, start: Any, end: Any) -> int:
        if not (self.query(start) and self.query(end)):
            raise RuntimeError("elapsed_ns on an event that has not completed")
        return int(end.ts - start.ts)

    def capturing(self) -> bool:
        return self.gpu.capturing

    def copy_to_host(self, tensor: Any) -> PendingCopy | None:
        ev = self.acquire(1)
        if ev is None:
            return None
        self.record_fn(ev[0], self.stream)
        self.copies += 1
        event = ev[0]
        return PendingCopy(
            _FakeBuffer(list(tensor.values)), len(tensor.values), event,
            lambda: self.release([event]),
        )

    def refresh_stream(self) -> None:
        pass

