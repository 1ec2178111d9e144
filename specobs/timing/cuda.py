"""CUDA events as a clock: pooled, pre-recorded, recorded on a cached stream, never synchronized.

Costs measured on an H200 VM (torch 2.11): ``Event.record(stream)`` with the stream object cached
2.05 µs, without it 7.4 µs (``torch.cuda.current_stream()`` alone is 4.7 µs); constructing an
Event 0.9 µs, and the driver event itself is created lazily on first record. So the pool is built
and every event recorded once up front, the stream object is cached, and the hot path calls the
base-class ``record`` directly with that stream.

Nothing here calls ``synchronize()``: the resolver thread asks ``query()`` (0.38 µs) and only calls
``elapsed_time`` on completed events.

The resolver's reads go to the CUDA runtime directly (``cudaEventQuery``,
``cudaEventElapsedTime`` through ``ctypes``, on the runtime library torch itself loaded) once
the resolver thread has bound itself to the clock's device (:meth:`CudaEventClock.bind_thread`).
torch's ``Event.elapsed_time`` queries both events again and sets the device around the
call: five runtime calls for every phase of a sampled cycle, each under the GIL, and inside a
busy GPU loop each runtime call costs microseconds (benchmarks/RESULTS.md, issue 15). The
direct path makes one call per phase with the GIL released. It is checked once against torch's
own reading before it is used, and any other thread, or a process where the runtime library
cannot be found, keeps torch's calls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from specobs._errors import ConfigurationError, require
from specobs.timing._base import EventPool, PendingCopy

__all__ = ["CudaEventClock", "cuda_ready"]

_PINNED_DTYPES = ("int64", "int32")
_NOT_READY = 600  # cudaErrorNotReady
_log = logging.getLogger("specobs")


def _runtime_library() -> Any:
    """The CUDA runtime library this process has loaded (torch's), through ``ctypes``, or None.

    Found in ``/proc/self/maps`` so that no second copy is loaded: the events belong to the
    runtime that made them. Each call through ``ctypes.CDLL`` releases the GIL.
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
        lib = ctypes.CDLL(path)
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


class _PinnedSlot(PendingCopy):
    """A pinned host buffer with its own event: a :class:`PendingCopy` that is reused.

    Made once per buffer, so a copy allocates nothing the garbage collector tracks (a copy a
    cycle used to make a ``PendingCopy``, a closure and an event list). The views
    ``buffer[:n]`` are cached per length (a slice of a tensor costs about a microsecond).
    """

    __slots__ = ("_free", "_views")

    def __init__(self, buffer: Any, event: Any, free: list[_PinnedSlot]) -> None:
        super().__init__(buffer, 0, event, self._give_back)
        self._free = free
        self._views: dict[int, Any] = {}

    def view(self, n: int) -> Any:
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = self.buffer[:n]
        return v

    def read(self) -> list[int]:
        try:
            values: list[int] = self.view(self.length).tolist()
        finally:
            self.release()
        return values

    def _give_back(self) -> None:
        self._free.append(self)


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
    """An :class:`~specobs.timing.EventClock` backed by ``torch.cuda.Event``."""

    name = "cuda"

    def __init__(
        self,
        pool_size: int = 1024,
        *,
        device: Any = None,
        stream: Any = None,
        pinned_buffers: int = 64,
        pinned_capacity: int = 4096,
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
        base = torch.cuda.Event.__mro__[1]
        base_record = getattr(base, "record", None)
        # The base-class record takes the stream positionally and skips the Python wrapper that
        # would look the current stream up when none is given.
        self.record_fn: Callable[[Any, Any], None] = (
            base_record if callable(base_record) else torch.cuda.Event.record
        )
        # The resolver's calls too skip the Python wrappers (one call layer each, per sampled
        # cycle: a query and one elapsed_time per phase).
        base_query = getattr(base, "query", None)
        base_elapsed = getattr(base, "elapsed_time", None)
        self._query: Callable[[Any], bool] = (
            base_query if callable(base_query) else torch.cuda.Event.query
        )
        self._elapsed: Callable[[Any, Any], float] = (
            base_elapsed if callable(base_elapsed) else torch.cuda.Event.elapsed_time
        )
        def new_event() -> Any:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            # Pre-record so the driver event exists before the hot path ever touches it.
            ev.record(self.stream)
            return ev

        with torch.cuda.device(self.device):
            events = [new_event() for _ in range(pool_size)]
            self._pinned: dict[Any, list[_PinnedSlot]] = {}
            for dtype_name in _PINNED_DTYPES:
                free: list[_PinnedSlot] = []
                dtype = getattr(torch, dtype_name)
                free.extend(
                    _PinnedSlot(torch.empty(pinned_capacity, dtype=dtype, pin_memory=True),
                                new_event(), free)
                    for _ in range(pinned_buffers)
                )
                self._pinned[dtype] = free
        EventPool.__init__(self, events)
        self._capturing = torch.cuda.is_current_stream_capturing
        self._pinned_capacity = pinned_capacity
        self._pinned_low = max(1, pinned_buffers // 4)
        # The direct runtime path (see the module docstring): the thread bound to it, the
        # library, and each event's handle (``cudaEvent_t`` as an int), looked up once.
        self.stream_switched = False
        self._direct_thread: int | None = None
        self._direct_checked = False
        self._lib: Any = None
        self._ms: Any = None
        self._ms_ref: Any = None
        self._handles: dict[int, int] = {}
        try:
            every = events + [slot.event for slots in self._pinned.values() for slot in slots]
            self._handles = {id(ev): int(ev.cuda_event) for ev in every}
        except Exception:  # a torch without Event.cuda_event: torch's calls only
            self._handles = {}

    # Worker thread -------------------------------------------------------------------------
    def capturing(self) -> bool:
        return bool(self._capturing())

    def copy_to_host(self, tensor: Any) -> PendingCopy | None:
        """Copy a CUDA tensor into a pinned host buffer on the cached stream, asynchronously.

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
        slot.view(n).copy_(tensor if tensor.dim() == 1 else tensor.reshape(-1),
                           non_blocking=True)
        self.record_fn(slot.event, self.stream)
        slot.length = n
        return slot

    def refresh_stream(self) -> None:
        stream = self._torch.cuda.current_stream(self.device)
        if stream != self.stream:
            # Events on two streams need not complete in the order they were recorded: the
            # resolver then queries every record instead of searching for the completed prefix.
            self.stream_switched = True
        self.stream = stream

    # Resolver thread -----------------------------------------------------------------------
    def bind_thread(self) -> bool:
        """Make the calling thread read events through the runtime directly; True if it does.

        Called by the resolver on its own thread: it sets that thread's current device to the
        clock's (so the runtime makes no context on another device) and finds the runtime
        library. The first reading on this thread is compared with torch's before the direct
        path is trusted.
        """
        if self._direct_thread == threading.get_ident():
            return True
        if not self._handles:
            return False
        try:
            lib = _runtime_library()
            if lib is None:
                return False
            import ctypes

            self._torch.cuda.set_device(self.device)
            self._ms = ctypes.c_float()
            self._ms_ref = ctypes.byref(self._ms)
            self._lib = lib
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
            _log.info("specobs: the CUDA runtime read directly disagreed with torch; CUDA "
                      "events are read through torch")
            self._direct_thread = None
        return round(ms * 1e6)

