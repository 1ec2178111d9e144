"""CUDA events as a clock: pooled, pre-recorded, recorded on a cached stream, never synchronized.

``Event.record(stream)`` with the stream object cached costs a fraction of a record that looks
the stream up (``torch.cuda.current_stream()`` alone costs more than the record), constructing
an Event is not free, and the driver event itself is created lazily on first record
(benchmarks/RESULTS.md has the figures). So the pool is built and every event recorded once up
front, the stream object is cached, and the hot path records with that stream.

Nothing here calls ``synchronize()``: the resolver thread asks ``query()`` and only reads the
elapsed time of completed events.

**The CUDA runtime, called directly and with the GIL held.** Every call this clock makes on the hot
path and on the resolver is one the runtime answers at once: ``cudaEventRecord`` and
``cudaMemcpyAsync`` enqueue work, ``cudaEventQuery`` and ``cudaEventElapsedTime`` read an event's
state (well under a microsecond when the process is idle). torch's wrappers release the GIL around
each of them, and inside a busy GPU loop that release is what costs: a resolver thread waiting for
the GIL takes it at every release, and the thread that released it then waits for a handoff (an OS
wake-up, microseconds to tens of microseconds) to get it back; a worker loses it at each sampled
cycle's event records, the resolver at each read (benchmarks/RESULTS.md). So the calls go to the
runtime library torch itself loaded (found in ``/proc/self/maps``, so the events belong to the
runtime that made them) through ``ctypes.PyDLL``, which keeps the GIL for the call: one runtime call
per record, per copy and per phase read, no wrapper, no handoff. torch's calls remain where that
library cannot be found, where a test record fails, or when ``release_gil=True`` (a benchmark's
comparison). A direct call that fails is cleared from the runtime's "last error" (torch checks it
after its own launches and would raise in the engine), counted, and redone through torch. The first
reading on the resolver's thread is compared with torch's own before the direct reads are trusted.

Holding the GIL through an enqueue is safe as long as the enqueue does not wait for the GPU: it
waits only when the stream's launch queue is full (the host thousands of launches ahead), and
then only for the GPU to make progress, which nothing here blocks unless the engine enqueued a
host function that itself needs the GIL (``cudaLaunchHostFunc`` with a Python callback; torch
does not). An engine that does both can pass ``release_gil=True`` to the clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from specobs._errors import ConfigurationError, require
from specobs.timing._base import EventPool, PendingCopy, PinnedSlot

__all__ = ["CudaEventClock", "cuda_ready"]

_PINNED_DTYPES = ("int64", "int32")
_NOT_READY = 600  # cudaErrorNotReady
_log = logging.getLogger("specobs")


def _runtime_library(*, hold_gil: bool = True) -> Any:
    """The CUDA runtime library this process has loaded (torch's), through ``ctypes``, or None.

    Found in ``/proc/self/maps`` so that no second copy is loaded: the events belong to the
    runtime that made them. ``hold_gil``: call through ``ctypes.PyDLL`` (the GIL kept for the
    call) rather than ``ctypes.CDLL`` (released and taken back around each call).
    """
    import ctypes

    path = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudart.so" in line:
                    path = line.split()[-1]
                    break
    except OSError:
        return None
    if path is None:
        return None
    try:
        lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)(path)
        vp = ctypes.c_void_p
        lib.cudaEventRecord.argtypes = [vp, vp]
        lib.cudaEventRecord.restype = ctypes.c_int
        lib.cudaMemcpyAsync.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, vp]
        lib.cudaMemcpyAsync.restype = ctypes.c_int
        lib.cudaEventQuery.argtypes = [ctypes.c_void_p]
        lib.cudaEventQuery.restype = ctypes.c_int
        lib.cudaEventElapsedTime.argtypes = [
            ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p
        ]
        lib.cudaEventElapsedTime.restype = ctypes.c_int
        lib.cudaGetLastError.argtypes = []
        lib.cudaGetLastError.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


class _PinnedSlot(PinnedSlot):
    """A pinned host buffer with its own event, made once per buffer, so a copy allocates
    nothing the garbage collector tracks (a copy a cycle used to make a ``PendingCopy``, a
    closure and an event list). The views ``buffer[:n]`` are cached per length (a slice of a
    tensor costs about a microsecond).
    """

    __slots__ = ("_views",)

    def __init__(self, buffer: Any, event: Any, free: list[_PinnedSlot]) -> None:
        # The same pinned memory as a ctypes array: slicing it reads the values as a list of
        # ints at C speed, without a tensor view and torch's tolist (microseconds a read).
        import ctypes

        ptr: int = buffer.data_ptr()
        itemsize: int = buffer.element_size()
        ctype = {8: ctypes.c_int64, 4: ctypes.c_int32}[itemsize]  # _PINNED_DTYPES
        host = (ctype * buffer.numel()).from_address(ptr)
        super().__init__(buffer, host, ptr, itemsize, event, 0, free)
        self._views: dict[int, Any] = {}

    def view(self, n: int) -> Any:
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = self.buffer[:n]
        return v


def cuda_ready() -> bool:
    """Whether torch is imported and has initialised CUDA, without importing or initialising it.

    ``clock="auto"`` only turns CUDA timing on once the engine itself has started CUDA: specobs
    must never be the one that initialises a device (or imports torch into a CPU process).
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


class CudaEventClock(EventPool):
    """An :class:`~specobs.timing.EventClock` backed by ``torch.cuda.Event``.

    ``release_gil=True`` keeps torch's calls on the hot path and reads events through the
    runtime with the GIL released around each call (see the module docstring).
    """

    name = "cuda"

    def __init__(
        self,
        pool_size: int = 1024,
        *,
        device: Any = None,
        stream: Any = None,
        pinned_buffers: int = 256,
        pinned_capacity: int = 4096,
        release_gil: bool = False,
        copy_fence_every: int = 16,
    ) -> None:
        require("torch", feature="CUDA event timing", extra="torch")
        import torch

        if not torch.cuda.is_available():
            raise ConfigurationError(
                "clock='cuda' needs a CUDA device, but torch.cuda.is_available() is False; "
                "use clock='host' or 'auto'"
            )
        self._torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else (
            torch.device(device)
        )
        self.stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        self.pool_size = pool_size
        self._bind_torch_calls()
        with torch.cuda.device(self.device):
            events = [self._new_event() for _ in range(pool_size)]
            self._pinned = self._pinned_slots(pinned_buffers, pinned_capacity)
        EventPool.__init__(self, events)
        self._capturing = torch.cuda.is_current_stream_capturing
        self._pinned_capacity = pinned_capacity
        self._pinned_low = max(1, pinned_buffers // 4)
        #: The native core records the event of one acceptance copy in this many (see
        #: ``native_copy_args``); 1: every copy's, as the Python path does.
        self.copy_fence_every = max(1, int(copy_fence_every))
        self.stream_switched = False
        #: Direct calls the runtime refused (each redone through torch).
        self.direct_errors = 0
        self._bind_runtime(events, release_gil)

    def _bind_torch_calls(self) -> None:
        """Torch's event calls, taken from the base class where it has them."""
        event_class = self._torch.cuda.Event
        base = event_class.__mro__[1]
        base_record = getattr(base, "record", None)
        # The base-class record takes the stream positionally and skips the Python wrapper that
        # would look the current stream up when none is given.
        self._torch_record: Callable[[Any, Any], None] = (
            base_record if callable(base_record) else event_class.record
        )
        self.record_fn: Callable[[Any, Any], None] = self._torch_record
        #: What ``record_fn`` takes as its stream: the stream object, or on the direct path
        #: the raw ``cudaStream_t``.
        self.record_stream: Any = self.stream
        base_query = getattr(base, "query", None)
        base_elapsed = getattr(base, "elapsed_time", None)
        self._query: Callable[[Any], bool] = (
            base_query if callable(base_query) else event_class.query
        )
        self._elapsed: Callable[[Any, Any], float] = (
            base_elapsed if callable(base_elapsed) else event_class.elapsed_time
        )

    def _new_event(self) -> Any:
        ev = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        # Pre-record so the driver event exists before the hot path ever touches it.
        ev.record(self.stream)
        return ev

    def _pinned_slots(self, buffers: int, capacity: int) -> dict[Any, list[_PinnedSlot]]:
        """The free pinned slots of each dtype acceptance copies use, on the clock's device."""
        torch = self._torch
        pinned: dict[Any, list[_PinnedSlot]] = {}
        for dtype_name in _PINNED_DTYPES:
            free: list[_PinnedSlot] = []
            dtype = getattr(torch, dtype_name)
            # One pinned allocation per dtype, its buffers views of it: one host
            # registration at the clock's start, not one per buffer.
            arena = torch.empty(buffers * capacity, dtype=dtype, pin_memory=True)
            free.extend(
                _PinnedSlot(arena[i * capacity:(i + 1) * capacity], self._new_event(), free)
                for i in range(buffers)
            )
            pinned[dtype] = free
        return pinned

    def _bind_runtime(self, events: list[Any], release_gil: bool) -> None:
        """The direct runtime path (see the module docstring): the library, each event's handle
        (``cudaEvent_t`` as an int), the resolver thread bound to it; the hot path records
        through it when a test record works and the GIL is held around its calls."""
        self.release_gil = release_gil
        self._direct_thread: int | None = None
        self._direct_checked = False
        self._ms: Any = None
        self._ms_ref: Any = None
        self._handles: dict[int, int] = {}
        self._lib: Any = None
        self._raw_stream: Callable[[int], int] | None = None
        #: Whether the hot path records (and copies) through the runtime directly.
        self.direct_hot_path = False
        try:
            every = events + [slot.event for slots in self._pinned.values() for slot in slots]
            self._handles = {id(ev): int(ev.cuda_event) for ev in every}
            self._lib = _runtime_library(hold_gil=not release_gil)
            for slots in self._pinned.values():
                for slot in slots:
                    slot.handle = self._handles[id(slot.event)]
        except Exception:  # a torch without Event.cuda_event: torch's calls only
            self._handles = {}
        if self._lib is not None and self._handles and not release_gil:
            self._use_direct_hot_path(events[0])

    def _use_direct_hot_path(self, probe: Any) -> None:
        """Record (and copy) through the runtime directly if a test record on the stream works."""
        lib = self._lib
        try:
            stream = int(self.stream.cuda_stream)
            if lib.cudaEventRecord(self._handles[id(probe)], stream) != 0:
                lib.cudaGetLastError()
                return
        except Exception as exc:
            _log.info("specobs: CUDA events recorded through torch (%r)", exc)
            return
        raw = getattr(self._torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw if callable(raw) else None
        self._device_index: int = self.device.index if self.device.index is not None else 0
        self.record_stream = stream
        self.record_fn = self._direct_record_fn()
        self.direct_hot_path = True

    def _direct_record_fn(self) -> Callable[[Any, Any], None]:
        handles = self._handles
        record = self._lib.cudaEventRecord
        fallback = self._record_through_torch

        def record_fn(event: Any, stream: int) -> None:
            if record(handles[id(event)], stream):
                fallback(event)

        return record_fn

    def _record_through_torch(self, event: Any) -> None:
        self._lib.cudaGetLastError()  # never left for the engine's next launch check to raise
        self.direct_errors += 1
        self._torch_record(event, self.stream)

    # Worker thread -------------------------------------------------------------------------
    def capturing(self) -> bool:
        return bool(self._capturing())

    #: The ring's drain reads completed copies of this type straight from pinned memory
    #: (``ptr``, ``itemsize``, ``length``: member slots, read without running Python code).
    native_copy_type = _PinnedSlot

    def native_copy_args(self) -> tuple[Any, ...] | None:
        """What the native core needs to start acceptance copies itself (``Ring.set_native_copy``):
        the runtime's ``cudaMemcpyAsync``, ``cudaEventRecord`` and ``cudaGetLastError``, the raw
        current-stream lookup, the device, the free pinned slots by dtype, their capacity, the
        low-water mark and the fence period. ``None`` unless the hot path records through the
        runtime directly. The core takes the same slots and wakes the resolver at the same mark
        as :meth:`copy_to_host`, which stays the path for every other tensor; it records the
        slot's event only on one copy in ``copy_fence_every`` (and on a new stream or a low
        pool), filling the other slots with the sentinel first: one runtime call a copy instead
        of two."""
        if not self.direct_hot_path or self._raw_stream is None or self._lib is None:
            return None
        import ctypes

        lib = self._lib

        def address(fn: Any) -> int:
            return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)

        return (address(lib.cudaMemcpyAsync), address(lib.cudaEventRecord),
                address(lib.cudaGetLastError), self._raw_stream, self._device_index,
                self._pinned, self._pinned_capacity, self._pinned_low, self.copy_fence_every)

    def native_event_args(self) -> tuple[int, int, int] | None:
        """The runtime's ``cudaEventElapsedTime``, ``cudaGetLastError`` and ``cudaEventQuery``
        by address, for the ring to read sampled cycles' GPU times itself, with the GIL let go,
        and to ask their events in its poll without Python (``Ring.set_native_events``): only
        on the thread bound here (its current device is the clock's), once the direct path was
        checked there against torch's reading; else None."""
        if (self._direct_thread != threading.get_ident() or not self._direct_checked
                or self._lib is None):
            return None
        import ctypes

        def address(fn: Any) -> int:
            return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)

        lib = self._lib
        return (address(lib.cudaEventElapsedTime), address(lib.cudaGetLastError),
                address(lib.cudaEventQuery))

    def copy_event_failed(self, slot: Any) -> None:
        """The native core's event record after a copy was refused: record it through torch."""
        self._record_through_torch(slot.event)

    def copy_to_host(self, tensor: Any) -> PendingCopy | None:
        """Copy a CUDA tensor into a pinned host buffer on the stream it is current on, async.

        Ordered after the kernels that produced ``tensor`` on the same stream; the caching
        allocator will not hand the source memory to a later kernel before the copy ran, because
        that kernel is ordered after it on the same stream.
        """
        n = tensor.numel()
        if n > self._pinned_capacity:
            return None
        pool = self._pinned.get(tensor.dtype)
        if not pool:
            return None
        try:
            slot = pool.pop()
        except IndexError:
            return None
        if len(pool) < self._pinned_low:
            # A buffer comes back only once the resolver has read it: the recorder sees this
            # and wakes the resolver now rather than at its next poll.
            self.buffers_low = True
        slot.length = n
        slot.fenced = True  # this path records every copy's event
        slot.sentinel = False
        raw = self._raw_stream
        if raw is not None and tensor.is_contiguous() and tensor.get_device() == self._device_index:
            # One enqueue on the current stream, with the GIL held: no dispatcher, no handoff.
            lib = self._lib
            stream = raw(self._device_index)
            if not lib.cudaMemcpyAsync(slot.ptr, tensor.data_ptr(), n * slot.itemsize, 2, stream):
                if lib.cudaEventRecord(self._handles[id(slot.event)], stream):
                    self._record_through_torch(slot.event)
                return slot
            lib.cudaGetLastError()
            self.direct_errors += 1
        slot.view(n).copy_(tensor if tensor.dim() == 1 else tensor.reshape(-1),
                           non_blocking=True)
        self._torch_record(slot.event, self.stream)
        return slot

    def refresh_stream(self) -> None:
        stream = self._torch.cuda.current_stream(self.device)
        if stream != self.stream:
            # Events on two streams need not complete in the order they were recorded: the
            # resolver then queries every record instead of searching for the completed prefix.
            self.stream_switched = True
        self.stream = stream
        self.record_stream = int(stream.cuda_stream) if self.direct_hot_path else stream

    # Resolver thread -----------------------------------------------------------------------
    def bind_thread(self) -> bool:
        """Make the calling thread read events through the runtime directly; True if it does.

        Called by the resolver on its own thread: it sets that thread's current device to the
        clock's (so the runtime makes no context on another device). The first reading on this
        thread is compared with torch's before the direct path is trusted.
        """
        if self._direct_thread == threading.get_ident():
            return True
        if not self._handles or self._lib is None:
            return False
        try:
            import ctypes

            self._torch.cuda.set_device(self.device)
            self._ms = ctypes.c_float()
            self._ms_ref = ctypes.byref(self._ms)
        except Exception as exc:
            _log.info("specobs: CUDA events read through torch (%r)", exc)
            return False
        self._direct_thread = threading.get_ident()
        return True

    def query(self, event: Any) -> bool:
        if self._direct_thread == threading.get_ident() and self._direct_checked:
            rc = self._lib.cudaEventQuery(self._handles[id(event)])
            if rc == 0:
                return True
            if rc == _NOT_READY:
                self._lib.cudaGetLastError()  # not sticky, but the runtime keeps it as "last"
                return False
            self._lib.cudaGetLastError()
            raise RuntimeError(f"cudaEventQuery failed with CUDA error {rc}")
        return bool(self._query(event))

    def elapsed_ns(self, start: Any, end: Any) -> int:
        # elapsed_time is milliseconds, with about half a microsecond of resolution.
        if self._direct_thread == threading.get_ident():
            if self._direct_checked:
                rc = self._lib.cudaEventElapsedTime(
                    self._ms_ref, self._handles[id(start)], self._handles[id(end)]
                )
                if rc:
                    self._lib.cudaGetLastError()
                    raise RuntimeError(f"cudaEventElapsedTime failed with CUDA error {rc}")
                value: float = self._ms.value
                return round(value * 1e6)
            return self._check_direct(start, end)
        ms: float = self._elapsed(start, end)
        return round(ms * 1e6)

    def _check_direct(self, start: Any, end: Any) -> int:
        """torch's reading, and the direct path switched on if it reads the same."""
        ms: float = self._elapsed(start, end)
        try:
            rc = self._lib.cudaEventElapsedTime(
                self._ms_ref, self._handles[id(start)], self._handles[id(end)]
            )
            q = self._lib.cudaEventQuery(self._handles[id(end)])
            ok = rc == 0 and q == 0 and self._ms.value == ms
        except Exception:
            ok = False
        if ok:
            self._direct_checked = True
        else:
            self._lib.cudaGetLastError()
            _log.info("specobs: the CUDA runtime read directly disagreed with torch; CUDA "
                      "events are read through torch")
            self._direct_thread = None
        return round(ms * 1e6)

