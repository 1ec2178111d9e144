"""How long the resolver holds the GIL: the slicing policy, and a meter benchmarks attach.

The worker shares the GIL with the resolver. A worker whose GPU sync returns while the resolver
holds it waits for the rest of the hold, so the resolver works in slices bounded by thread CPU
time, not by a count of records: a record costs from under a microsecond to tens of them,
depending on batch size, GPU sampling, sinks and the machine.

:func:`next_chunk` sizes the next slice. :class:`Tuning` holds the knobs a benchmark compares
(the slice target, the pause between slices, the native pump on or off); production runs
:data:`DEFAULT_TUNING`. :class:`HoldMeter` records each hold for benchmarks; the resolver holds
a :class:`NullMeter`, which records nothing, unless one is attached.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any

__all__ = [
    "CHUNK", "DEFAULT_TUNING", "MAX_CHUNK", "MIN_CHUNK", "SLICE_NS", "YIELD_SECONDS", "HoldMeter",
    "NullMeter", "Tuning", "next_chunk",
]

#: Records resolved in the first GIL hold of a new resolver; after that the count follows the
#: measured length of each hold (:func:`next_chunk`).
CHUNK = 32
#: Thread CPU one hold of the GIL aims at. Measured side by side, shorter slices keep most holds
#: under 100 µs for a little more process CPU per cycle (benchmarks/RESULTS.md has the figures).
SLICE_NS = 80_000
MIN_CHUNK = 16
MAX_CHUNK = 2048
#: Pause between two slices of one drain. ``time.sleep(0)`` releases the GIL but does not hand
#: it over: the resolver's own syscall returns before the woken worker is scheduled, and it
#: takes the GIL straight back (the worker then waits out the 5 ms switch interval). A real
#: sleep lets a waiting worker in.
YIELD_SECONDS = 20e-6
#: A hold longer than this counts in :attr:`HoldMeter.long_holds` (a garbage collection inside
#: a slice, say).
LONG_HOLD_NS = 100_000


def next_chunk(limit: int, taken: int, cpu_ns: int, slice_ns: int) -> int:
    """How many records the next slice may take, after one that could take ``limit``, took
    ``taken`` and held the GIL ``cpu_ns``.

    Doubled after a full slice well under ``slice_ns``, shrunk in proportion after any slice
    over it, within ``MIN_CHUNK``..``MAX_CHUNK``. Not from ``cpu_ns / taken``: a slice's fixed
    cost would read as per-record cost and shrink slices until fixed cost is all they do."""
    if taken >= limit and cpu_ns * 2 < slice_ns:
        return min(MAX_CHUNK, limit * 2)
    if cpu_ns > slice_ns and taken > MIN_CHUNK:
        return max(MIN_CHUNK, taken * slice_ns // cpu_ns)
    return limit


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The resolver's knobs that benchmarks compare; production runs :data:`DEFAULT_TUNING`."""

    #: Thread CPU one slice aims at (ns).
    slice_ns: int = SLICE_NS
    #: Pause between two slices of one drain (seconds).
    yield_seconds: float = YIELD_SECONDS
    #: Wait and walk inside the native ring's ``pump`` (the GIL let go) where the ring has one;
    #: False: the loop of waits and drains alone.
    use_pump: bool = True


DEFAULT_TUNING = Tuning()


class HoldMeter:
    """The resolver's holds of the GIL, for benchmarks.

    A hold is one stretch of the resolver thread's work between two points where it lets go of
    the GIL (a wait, a sleep, a walk of the native ring), in thread CPU ns. The resolver calls
    :meth:`took_back` where it takes the GIL back, :meth:`release_point` where it lets go, and
    :meth:`slice_done` after each slice. No locks: only the resolver's drains write it, and
    they hold the drain lock.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start from nothing (a fresh measurement, or a forked child)."""
        #: The last holds (ns), for percentiles.
        self.holds: deque[int] = deque(maxlen=4096)
        self.max_hold_ns = 0
        self.long_holds = 0
        #: Slices of work taken (each one GIL hold, or more around native walks).
        self.slices = 0
        #: Why each ``pump()`` came back, by its answer.
        self.pump_returns: dict[str, int] = {}
        #: Thread CPU ns when the resolver's thread last took the GIL back (None: not known).
        self.held_since: int | None = None

    def note(self, hold: int) -> None:
        """One stretch of work with the GIL held (thread CPU ns)."""
        if hold > self.max_hold_ns:
            self.max_hold_ns = hold
        if hold > LONG_HOLD_NS:
            self.long_holds += 1
        self.holds.append(hold)

    def took_back(self, at: int | None = None) -> None:
        """The resolver's thread took the GIL back at thread CPU ``at`` (now, if ``None``)."""
        self.held_since = time.thread_time_ns() if at is None else at

    def release_point(self) -> None:
        """The resolver's thread is about to let go of the GIL: its hold ends here."""
        since = self.held_since
        if since is not None:
            self.note(time.thread_time_ns() - since)
            self.held_since = None

    def pump_returned(self, why: str) -> None:
        """The native pump came back, for reason ``why``."""
        self.pump_returns[why] = self.pump_returns.get(why, 0) + 1

    def slice_done(self, ring: Any, t_cpu: int, t_end: int, cpu: int, in_run: bool) -> None:
        """A slice ran from thread CPU ``t_cpu`` to ``t_end``, ``cpu`` of it under the GIL.

        A walk the native ring made with the GIL let go splits the slice: the stretch up to
        the walk's start ends a hold, and the one after the walk's end goes on to the next
        release point. ``in_run``: the slice ran on the resolver's thread (else a caller's,
        whose stretches are the slice's own)."""
        self.slices += 1
        walked = getattr(ring, "walk_count", 0) and ring.walk_cpu_out >= t_cpu
        if not in_run:
            self.note(max(ring.walk_cpu_out - t_cpu, t_end - ring.walk_cpu_in,
                          ring.walk_hold_ns) if walked else cpu)
            return
        since = self.held_since
        start = t_cpu if since is None else since
        if walked:
            self.note(ring.walk_cpu_out - start)
            if ring.walk_hold_ns:
                self.note(ring.walk_hold_ns)
            self.held_since = ring.walk_cpu_in
        else:
            self.held_since = start


class NullMeter(HoldMeter):
    """A meter that records nothing: what the resolver holds unless a benchmark attaches one."""

    def note(self, hold: int) -> None:
        pass

    def took_back(self, at: int | None = None) -> None:
        pass

    def release_point(self) -> None:
        pass

    def pump_returned(self, why: str) -> None:
        pass

    def slice_done(self, ring: Any, t_cpu: int, t_end: int, cpu: int, in_run: bool) -> None:
        pass
