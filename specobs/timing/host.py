"""The host clock: ``time.perf_counter_ns`` on every boundary, anchored once to wall time."""

from __future__ import annotations

import time

__all__ = ["WallAnchor"]


class WallAnchor:
    """Maps ``perf_counter_ns`` readings to Unix-epoch nanoseconds.

    ``perf_counter`` is monotonic and fine-grained but has an arbitrary origin; spans need epoch
    timestamps. Reading both clocks once and adding the offset avoids a ``time_ns()`` call per
    boundary (and keeps intervals immune to wall-clock steps).
    """

    __slots__ = ("perf_ns", "wall_ns")

    def __init__(self) -> None:
        # Read perf on both sides of the wall reading and take the midpoint.
        p0 = time.perf_counter_ns()
        w = time.time_ns()
        p1 = time.perf_counter_ns()
        self.perf_ns = (p0 + p1) // 2
        self.wall_ns = w

    @property
    def offset_ns(self) -> int:
        """Add to a ``perf_counter_ns`` reading to get Unix-epoch nanoseconds."""
        return self.wall_ns - self.perf_ns
