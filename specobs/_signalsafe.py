"""Thread primitives a signal handler cannot deadlock on.

Python runs a signal handler on the main thread, between two bytecodes of whatever that thread
was doing -- possibly inside specobs, holding a lock. A handler that calls back into specobs
(``force_flush()`` and ``shutdown()`` in a SIGTERM handler, a cycle recorded from SIGALRM) and
waits for that lock waits for itself, forever: ``threading.Lock`` is not re-entrant, and
``threading.Event.set()`` holds its condition's lock while Python code notifies the waiters.

- :class:`GuardedLock` is a lock that the thread holding it never waits for: its
  ``acquire`` returns ``False`` at once there (``with`` raises :class:`Reentered`), so the
  caller defers or skips its work instead of hanging. Other threads wait as on any lock.
- :class:`Wakeup` is ``threading.Event`` for one waiting thread, whose ``set()`` is one call
  into C (``queue.SimpleQueue.put``): nothing a handler could find half done.
"""

from __future__ import annotations

import queue
import threading
from types import TracebackType

__all__ = ["GuardedLock", "Reentered", "Wakeup"]


class Reentered(RuntimeError):
    """A :class:`GuardedLock` was entered by the thread that holds it: a signal handler (or a
    callback) that interrupted that thread inside the lock."""


class GuardedLock:
    """A mutual-exclusion lock that never waits for its own holder.

    Ownership is the C ``RLock``'s, set atomically with the acquisition, so there is no moment
    at which the lock is held but not yet known to be held by this thread.
    """

    __slots__ = ("_is_owned", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._is_owned = self._lock._is_owned  # type: ignore[attr-defined]

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock (an interrupted frame below it does)."""
        return bool(self._is_owned())

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``Lock.acquire``, but ``False`` at once when the calling thread holds it already."""
        if self._is_owned():
            return False
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> GuardedLock:
        if not self.acquire():
            raise Reentered("a lock entered again by the thread that holds it (a signal "
                            "handler that interrupted it?)")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._lock.release()


class Wakeup:
    """``set`` / ``wait`` / ``clear`` as ``threading.Event`` has them, for one waiting thread.

    ``set()`` from any thread or signal handler puts a token in a ``queue.SimpleQueue`` (C, no
    lock Python code holds) unless one is pending since the last ``clear``, so tokens do not
    pile up; ``wait`` takes one. A ``set`` after a ``clear`` always ends the next ``wait``
    early; a token left from before a ``clear`` ends one ``wait`` early (a wake-up with nothing
    to do, harmless).
    """

    __slots__ = ("_pending", "_tokens")

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._pending = False

    def set(self) -> None:
        if not self._pending:
            self._pending = True
            self._tokens.put(None)

    def is_set(self) -> bool:
        return self._pending

    def wait(self, timeout: float | None = None) -> bool:
        """Until a ``set()`` (True) or the timeout (False)."""
        try:
            self._tokens.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    def clear(self) -> None:
        self._pending = False
