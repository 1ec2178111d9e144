"""The interface every event clock implements."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["EventClock", "EventPool", "PendingCopy", "PinnedSlot", "record_stream_of"]


class PendingCopy:
    """A device-to-host copy in flight: read ``buffer[:length]`` once ``event`` has completed.

    ``fenced`` is False for a copy that recorded no event of its own (the native core records
    one copy's event in ``fence_every``): it is complete once a later event on its stream
    completed, or once :meth:`landed` sees its values written over the sentinel. ``sentinel``
    is True when the buffer was filled with the sentinel before the copy (every copy the native
    core starts), so that :meth:`landed` means something.
    """

    __slots__ = ("buffer", "event", "fenced", "length", "release", "sentinel")

    def __init__(
        self, buffer: Any, length: int, event: Any, release: Callable[[], None]
    ) -> None:
        self.buffer = buffer
        self.length = length
        self.event = event
        self.release = release
        self.fenced = True
        self.sentinel = False

    def landed(self) -> bool:
        """Whether the copy has written every value over the sentinel (each byte 0xFF, read as
        a negative number) its buffer was filled with; False where there is no sentinel."""
        return False

    def read(self) -> list[int]:
        """The copied values. Only valid after the event completed; frees the buffer."""
        try:
            values: list[int] = self.buffer[: self.length].tolist()
        finally:
            self.release()
        return values


class PinnedSlot(PendingCopy):
    """A host buffer with its own event: a :class:`PendingCopy` that is reused (the CUDA
    clock's pinned buffers and the fake clock's stand-ins for them).

    ``host`` is the same memory as a ``ctypes`` array: slicing it reads the values as a list of
    ints at C speed. ``ptr``, ``itemsize``, ``handle`` and ``length`` are what the native core
    and the ring's drain read; ``handle`` is the event's ``cudaEvent_t`` as an int (0: none).
    Reading hands the slot back to ``free``.
    """

    __slots__ = ("_free", "_host", "handle", "itemsize", "ptr")

    def __init__(self, buffer: Any, host: Any, ptr: int, itemsize: int, event: Any,
                 handle: int, free: list[Any]) -> None:
        super().__init__(buffer, 0, event, self._give_back)
        self._free = free
        self._host: Any = host
        self.ptr = ptr
        self.itemsize = itemsize
        self.handle = handle

    def read(self) -> list[int]:
        try:
            values: list[int] = self._host[: self.length]
        finally:
            self.release()
        return values

    def landed(self) -> bool:
        # Accepted counts are never negative; the sentinel, and any element the copy has not
        # written whole, is (its top byte still 0xFF).
        n = self.length
        if not self.sentinel:
            return False
        return n == 0 or min(self._host[:n]) >= 0

    def _give_back(self) -> None:
        self._free.append(self)


class EventPool:
    """A free list of pre-created events shared by the worker and the resolver without a lock.

    Only the worker thread touches ``_free`` (``acquire``); the resolver hands events back through
    the ``_returned`` deque, whose ``append``/``popleft`` are atomic, and the worker moves them
    over when its own list runs short.
    """

    #: Set by a clock whose pinned copy buffers run low (the recorder then wakes the resolver,
    #: which hands them back) and cleared by the recorder.
    buffers_low = False
    #: Set once events were recorded on more than one stream: they need not complete in the
    #: order recorded, and the resolver asks each one instead of searching for a prefix.
    stream_switched = False

    def bind_thread(self) -> bool:
        """Prepare the calling (resolver) thread to read events; True if it reads them some
        faster way than :meth:`query` and :meth:`elapsed_ns` (the CUDA clock: the runtime,
        directly). Nothing to do here."""
        return False

    def __init__(self, events: list[Any]) -> None:
        self._free: list[Any] = list(events)
        self._returned: deque[Any] = deque()
        #: Events in the pool, taken or not.
        self.pool_events = len(events)

    def acquire(self, n: int) -> list[Any] | None:
        """Take ``n`` events, or ``None`` when fewer are free. Worker thread."""
        free = self._free
        if len(free) < n:
            returned = self._returned
            while returned:
                free.append(returned.popleft())
            if len(free) < n:
                return None
        taken = free[-n:]
        del free[-n:]
        return taken

    def release(self, events: list[Any]) -> None:
        """Give events back. Any thread."""
        self._returned.extend(events)

    def free_events(self) -> int:
        return len(self._free) + len(self._returned)

    def idle_events(self) -> list[Any]:
        """The events in the pool now (free or handed back), for a reader to learn their
        handles before any cycle draws them."""
        return [*self._free, *self._returned]


def record_stream_of(clock: Any) -> Any:
    """What ``clock.record_fn`` takes as its stream: ``record_stream``, which a clock may leave
    out when it is the same as ``stream``."""
    return getattr(clock, "record_stream", clock.stream)


class EventClock(Protocol):
    """What the recorder and resolver need from a GPU clock.

    A clock may also offer what lets the native core work without Python; each is read where
    present (``getattr`` with a default), so a clock of the user's own needs none of them:

    * ``bind_thread()``, ``buffers_low``, ``stream_switched`` (declared below; see
      :class:`EventPool`);
    * ``pool_events`` (how many events the pool holds) and ``idle_events()`` (those not drawn):
      the resolver caches their handles (:class:`EventPool` has both);
    * ``native_event_args()``: the runtime's event functions, for the native core to read GPU
      times with the GIL let go (``None``: not available);
    * ``native_copy_args()``, ``native_copy_type`` and ``copy_event_failed(slot)``: the
      runtime's copy functions and pinned slots, for the native core to copy CUDA acceptance
      itself, and what to do when recording a slot's event fails (the CUDA and fake clocks).
    """

    name: str
    #: Called on the worker thread as ``record_fn(event, stream)``: enqueue a timestamp.
    record_fn: Callable[[Any, Any], None]
    #: The stream events are recorded on (cached: looking it up costs microseconds).
    stream: Any
    #: What ``record_fn`` takes as its stream argument (optional; ``stream`` if absent).
    record_stream: Any
    #: See :class:`EventPool`, which every clock of specobs's own builds on; the recorder and
    #: resolver read these three with a default, for a clock that has none of them.
    buffers_low: bool
    stream_switched: bool

    def bind_thread(self) -> bool:
        """Prepare the resolver's thread to read events (see :meth:`EventPool.bind_thread`)."""
        ...

    def acquire(self, n: int) -> list[Any] | None:
        """Take ``n`` events from the pool, or ``None`` when it is dry. Worker thread."""
        ...

    def release(self, events: list[Any]) -> None:
        """Return events to the pool. Resolver thread."""
        ...

    def query(self, event: Any) -> bool:
        """Whether the event has completed; never blocks."""
        ...

    def elapsed_ns(self, start: Any, end: Any) -> int:
        """GPU time between two completed events, nanoseconds."""
        ...

    def capturing(self) -> bool:
        """Whether the current stream is capturing a CUDA graph (record nothing then)."""
        ...

    def copy_to_host(self, tensor: Any) -> PendingCopy | None:
        """Start an asynchronous copy of a device tensor into pinned memory, or ``None``."""
        ...

    def refresh_stream(self) -> None:
        """Look the current stream up again (after the engine switched streams)."""
        ...

    def free_events(self) -> int:
        """Events now in the pool."""
        ...
