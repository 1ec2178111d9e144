"""What the resolver needs of a ring, as protocols.

:class:`RingProtocol` is what both rings have: the pure-Python ring (``_ring.PyRing``) specifies
it, and the native core's ``Ring`` implements it. :class:`PumpingRing` adds the native core's
pump, which waits and walks with the GIL let go; only the native ring has it, and the resolver
asks once, when it is built, whether its ring pumps.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["PumpingRing", "RingProtocol"]


@runtime_checkable
class RingProtocol(Protocol):
    """The calls and counts the resolver reads of any ring."""

    #: A deferred cycle with this many done cycles behind it is handed on unsettled.
    settle_backlog: int
    #: Thread CPU ns the native walks spent with the GIL let go, and the last walk's thread CPU
    #: at its start (``walk_cpu_out``) and end (``walk_cpu_in``), its longest stretch under the
    #: GIL, and the walks so far. Zeros on a ring that never walks without the GIL.
    nogil_ns: int
    walk_cpu_out: int
    walk_cpu_in: int
    walk_hold_ns: int
    walk_count: int

    def __len__(self) -> int: ...

    def poll(self, limit: int, query: Any, polls_before_query: int) -> int: ...

    def pending(self, limit: int) -> tuple[list[tuple[int, Any, Any]], int]: ...

    def drain_into(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool
    ) -> tuple[int, int, list[Any], list[Any]]: ...

    def counters(self) -> tuple[int, int, int, int, int, int]: ...

    def clear_queue(self) -> int: ...

    def expire(self, timeout_ns: int) -> int: ...

    def take_dropped(self) -> list[tuple[Any, Any]]: ...

    def forget_current(self) -> None: ...


@runtime_checkable
class PumpingRing(RingProtocol, Protocol):
    """A ring with the native pump (``Ring.pump`` in specobs/_core.c)."""

    #: Whether a thread is inside ``pump()``.
    pumping: int
    #: Thread CPU ns when the pump last took the GIL back, and the pump's CPU so far.
    pump_cpu_in: int
    pump_ns: int

    def pump(
        self, poll_ns: int, next_trace: int, slow_ns: int, settle_ns: int, return_after_ns: int
    ) -> str: ...

    def pump_wake(self) -> None: ...
