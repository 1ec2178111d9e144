"""How long the thread that records cycles ran on a CPU and how long it waited for one.

A host busy with other work lengthens every phase the engine's thread times, by the time the
kernel kept it off a CPU while it was runnable. Without that time a recent window slower than the
lifetime reads as something in the speculation (a phase slower, a cost at each boundary). Linux
keeps both times per thread in ``/proc/self/task/<id>/schedstat`` (nanoseconds on a CPU, then
nanoseconds runnable and waiting); the thread is the one that began the last cycle (the ring
keeps its native id). Read when a snapshot is taken (a scrape, an export), never on the hot path.

The totals are counters: when the recording thread changes, or after ``fork()``, the new thread's
times start from the read that first saw it. Where the file is missing (not Linux, a kernel
without schedstat, a thread that ended) nothing is added and, until a first read succeeds, nothing
is exported.
"""

from __future__ import annotations

from specobs._signalsafe import GuardedLock

__all__ = ["STATES", "WorkerThreadTime", "read_schedstat"]

#: The ``state`` label's values: on a CPU, and runnable but waiting for one.
STATES: tuple[str, ...] = ("running", "waiting")


def read_schedstat(native_id: int) -> tuple[int, int] | None:
    """``(ns on a CPU, ns runnable and waiting)`` of one thread of this process, or ``None``."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as f:
            fields = f.read(128).split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


class WorkerThreadTime:
    """Running and waiting seconds of the recording thread, as counters."""

    def __init__(self) -> None:
        self._lock = GuardedLock()
        self._thread = 0
        self._last: tuple[int, int] | None = None
        self._ns = [0, 0]
        self._seen = False

    def update(self, native_id: int) -> None:
        """Add what the thread ``native_id`` ran and waited since the last read of it."""
        if not native_id:
            return
        now = read_schedstat(native_id)
        if not self._lock.acquire():
            return  # a signal handler's read inside this thread's own: the next read adds it
        try:
            if now is None:
                self._thread, self._last = 0, None
                return
            last = self._last
            if native_id == self._thread and last is not None:
                # Each field only grows for one thread; max() guards a reused id.
                self._ns[0] += max(0, now[0] - last[0])
                self._ns[1] += max(0, now[1] - last[1])
            self._thread, self._last, self._seen = native_id, now, True
        finally:
            self._lock.release()

    def after_fork_in_child(self) -> None:
        """The parent's threads are not the child's: start again from zero."""
        self._lock = GuardedLock()
        self._thread, self._last, self._ns, self._seen = 0, None, [0, 0], False

    def seconds(self) -> dict[str, float]:
        """``{"running": s, "waiting": s}`` once a read succeeded, else ``{}``."""
        locked = self._lock.acquire()  # False: a signal handler's, inside this thread's read
        try:
            if not self._seen:
                return {}
            return {STATES[0]: self._ns[0] / 1e9, STATES[1]: self._ns[1] / 1e9}
        finally:
            if locked:
                self._lock.release()
