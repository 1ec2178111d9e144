"""A deterministic fake GPU for tests: events complete only when the test says so.

``FakeGpu`` has a timeline. ``record_fn`` stamps an event with the timeline's current position;
``gpu.run(ns)`` advances it (work enqueued); ``gpu.complete()`` marks everything enqueued so far as
done. A test can therefore hold events pending, assert nothing resolves, then release them —
without sleeps or races.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

from specobs.timing._base import EventPool, PendingCopy, PinnedSlot

__all__ = [
    "FAKE_INT64",
    "FakeDeviceArray",
    "FakeEvent",
    "FakeEventClock",
    "FakeGpu",
    "FakeNativeCopyClock",
    "FakeNativeEventClock",
]

#: The dtype of a :class:`FakeDeviceArray` (what ``tensor.dtype`` is to a pinned-slot pool).
FAKE_INT64 = "fake.int64"


_V = TypeVar("_V")


class _CField(Generic[_V]):
    """An int (or bool) attribute kept in a ctypes field, where the fake runtime's C functions
    read it: ``_CField("cell", "value", int)`` reads and writes ``obj.cell.value``."""

    def __init__(self, memory: str, field: str, kind: Callable[[int], _V]) -> None:
        self.memory = memory
        self.field = field
        self.kind: Callable[[int], _V] = kind

    @overload
    def __get__(self, obj: None, owner: type) -> _CField[_V]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _V: ...
    def __get__(self, obj: object, owner: type | None = None) -> _CField[_V] | _V:
        if obj is None:
            return self
        return self.kind(getattr(getattr(obj, self.memory), self.field))

    def __set__(self, obj: object, value: int) -> None:
        setattr(getattr(obj, self.memory), self.field, int(value))


class FakeGpu:
    """A GPU timeline in nanoseconds with a completion frontier."""

    #: The completion frontier (in ``completed_cell``).
    completed_ns = _CField("completed_cell", "value", int)

    def __init__(self) -> None:
        self.now_ns = 0
        #: The completion frontier, in memory a fake runtime's C functions read too.
        self.completed_cell = ctypes.c_int64(-1)
        self.capturing = False
        self._lock = threading.Lock()
        #: Device-to-host copies enqueued and not yet run: (timeline position, dst, bytes).
        self._copies: list[tuple[int, int, bytes]] = []

    def enqueue_copy(self, dst: int, data: bytes) -> None:
        """A copy into host memory at ``dst`` that lands when the work before it completes."""
        with self._lock:
            self._copies.append((self.now_ns, dst, data))

    def run(self, ns: int) -> None:
        """Enqueue ``ns`` nanoseconds of work."""
        with self._lock:
            self.now_ns += ns

    def complete(self) -> None:
        """Finish all work enqueued so far: its copies land, then its events complete."""
        self.complete_until(self.now_ns)

    def complete_until(self, ns: int) -> None:
        """Finish the work enqueued up to timeline position ``ns``: the copies enqueued at or
        before it land, the events recorded at or before it complete, the rest stay in
        flight (as a GPU partway through its stream)."""
        import ctypes

        with self._lock:
            ns = min(ns, self.now_ns)
            rest = []
            for c in self._copies:
                if c[0] <= ns:
                    ctypes.memmove(c[1], c[2], len(c[2]))
                else:
                    rest.append(c)
            self._copies = rest
            self.completed_ns = max(self.completed_ns, ns)


class FakeEvent:
    __slots__ = ("recorded", "ts")

    def __init__(self) -> None:
        self.ts = -1
        self.recorded = False


class _FakeEventMem(ctypes.Structure):
    _fields_ = (("ts", ctypes.c_int64), ("recorded", ctypes.c_int64),
                ("completed", ctypes.c_void_p))


class FakeNativeEvent:
    """A :class:`FakeEvent` whose state lives in C memory, and whose ``cuda_event`` (what a
    torch event's is: the runtime's handle) is that memory's address: what the fake runtime's
    functions (``specobs._core._fake_event_fns``) read, with no Python."""

    __slots__ = ("_mem", "cuda_event")

    ts = _CField("_mem", "ts", int)
    recorded = _CField("_mem", "recorded", bool)

    def __init__(self, gpu: FakeGpu) -> None:
        self._mem = _FakeEventMem(-1, 0, ctypes.addressof(gpu.completed_cell))
        self.cuda_event = ctypes.addressof(self._mem)


class FakeDeviceArray:
    """Stands in for a CUDA tensor of accepted lengths (``is_cuda`` is True): int64 values in
    memory of its own, with the attributes the native core's copy reads (``dtype``,
    ``data_ptr()``, ``get_device()``, ``is_contiguous()``)."""

    is_cuda = True
    dtype = FAKE_INT64

    def __init__(self, values: Sequence[int], *, device: int = 0, contiguous: bool = True
                 ) -> None:
        import ctypes

        self.values = list(values)
        self._mem = (ctypes.c_int64 * max(1, len(self.values)))(*self.values)
        self._device = device
        self._contiguous = contiguous

    def numel(self) -> int:
        return len(self.values)

    def data_ptr(self) -> int:
        import ctypes

        return ctypes.addressof(self._mem)

    def get_device(self) -> int:
        return self._device

    def is_contiguous(self) -> bool:
        return self._contiguous


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


class _FakePinnedSlot(PinnedSlot):
    """A host buffer with its own event, as the CUDA clock's pinned slots are."""

    __slots__ = ()

    def __init__(self, capacity: int, event: FakeEvent, handle: int,
                 free: list[_FakePinnedSlot]) -> None:
        import ctypes

        mem = (ctypes.c_int64 * capacity)()
        super().__init__(mem, mem, ctypes.addressof(mem), 8, event, handle, free)


class FakeNativeCopyClock(FakeEventClock):
    """A fake clock whose acceptance copies the native core can start itself, as it does on a
    GPU: ``native_copy_args()`` hands it C functions (``ctypes`` callbacks) in the place of
    ``cudaMemcpyAsync`` (a ``memmove``), ``cudaEventRecord`` (stamps the slot's event on the
    fake timeline) and ``cudaGetLastError``. A copy lands in its slot when the fake GPU completes
    the work before it (``gpu.complete()``), as a real one does. ``memcpy_rc`` / ``record_rc``
    make the next calls fail like a refusing runtime; ``native=False`` leaves every copy to
    :meth:`copy_to_host`, which takes the same slots; ``fence_every`` is the core's fence period
    (the CUDA clock's ``copy_fence_every``)."""

    native_copy_type = _FakePinnedSlot

    def __init__(self, gpu: FakeGpu | None = None, pool_size: int = 64, *,
                 buffers: int = 16, capacity: int = 64, native: bool = True,
                 fence_every: int = 16) -> None:
        import ctypes

        super().__init__(gpu, pool_size)
        self.native = native
        self.fence_every = fence_every
        self.capacity = capacity
        self.low = max(1, buffers // 4)
        self.memcpy_rc = 0
        self.record_rc = 0
        self.memcpy_calls = self.record_calls = self.lasterr_calls = self.event_fallbacks = 0
        self.free: list[_FakePinnedSlot] = []
        self._by_handle: dict[int, FakeEvent] = {}
        for i in range(buffers):
            event = FakeEvent()
            self._by_handle[1000 + i] = event
            self.free.append(_FakePinnedSlot(capacity, event, 1000 + i, self.free))
        gpu_ = self.gpu

        def memcpy(dst: int, src: int, count: int, kind: int, stream: int) -> int:
            self.memcpy_calls += 1
            if self.memcpy_rc:
                return self.memcpy_rc
            assert kind == 2 and stream == 77  # device to host, on the "current stream"
            gpu_.enqueue_copy(dst, ctypes.string_at(src, count))
            return 0

        def record(handle: int, stream: int) -> int:
            self.record_calls += 1
            if self.record_rc:
                return self.record_rc
            event = self._by_handle[handle]
            event.ts = gpu_.now_ns
            event.recorded = True
            return 0

        def lasterr() -> int:
            self.lasterr_calls += 1
            return 0

        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self._fns = (
            ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, sz, ctypes.c_int, vp)(memcpy),
            ctypes.CFUNCTYPE(ctypes.c_int, vp, vp)(record),
            ctypes.CFUNCTYPE(ctypes.c_int)(lasterr),
        )

    def native_copy_args(self) -> tuple[Any, ...] | None:
        import ctypes

        if not self.native:
            return None
        addresses = [int(ctypes.cast(f, ctypes.c_void_p).value or 0) for f in self._fns]
        return (*addresses, lambda device: 77, 0, {FAKE_INT64: self.free}, self.capacity,
                self.low, self.fence_every)

    def copy_to_host(self, tensor: Any) -> PendingCopy | None:
        import ctypes

        n = tensor.numel()
        if n > self.capacity or getattr(tensor, "dtype", None) != FAKE_INT64 or not self.free:
            return None
        slot = self.free.pop()
        if len(self.free) < self.low:
            self.buffers_low = True
        self.gpu.enqueue_copy(slot.ptr, ctypes.string_at(tensor.data_ptr(), n * 8))
        slot.length = n
        slot.fenced = True
        slot.sentinel = False
        self.record_fn(slot.event, self.stream)
        self.copies += 1
        return slot

    def copy_event_failed(self, slot: Any) -> None:
        self.event_fallbacks += 1
        self.record_fn(slot.event, self.stream)


class FakeNativeEventClock(FakeEventClock):
    """A fake clock whose sampled cycles' GPU times the ring can read itself, as it does on a
    GPU once the CUDA clock's direct path is checked: ``native_event_args()`` hands it a fake
    runtime's ``cudaEventElapsedTime``, ``cudaGetLastError`` and ``cudaEventQuery`` written in
    C (the walk calls them with the GIL let go, the poll without Python). ``elapsed_ns``
    reads as the runtime does: milliseconds as a 32-bit float, rounded to integer ns.
    ``native=False``: the same clock, read in Python only.
    """

    def __init__(self, gpu: FakeGpu | None = None, pool_size: int = 64, *,
                 native: bool = True) -> None:
        super().__init__(gpu, pool_size)
        EventPool.__init__(self, [FakeNativeEvent(self.gpu) for _ in range(pool_size)])
        self.native = native

    def elapsed_ns(self, start: Any, end: Any) -> int:
        if not (self.query(start) and self.query(end)):
            raise RuntimeError("elapsed_ns on an event that has not completed")
        return round(ctypes.c_float((end.ts - start.ts) / 1e6).value * 1e6)

    def native_event_args(self) -> tuple[int, int, int] | None:
        if not self.native:
            return None
        try:
            import specobs._core as _core
        except ImportError:
            return None
        fns: tuple[int, int, int] = _core._fake_event_fns()
        return fns
