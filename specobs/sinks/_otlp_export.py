"""The OTLP sink's export machinery: the gate that keeps ``fork()`` out of gRPC calls, the span
exporter wrapper that counts what it received, and a flush request for the export thread.

:mod:`specobs.sinks.otlp` builds and drives these; nothing here reads a setting or a variable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from specobs._errors import require

require("opentelemetry.sdk", feature="OTLP export", extra="otlp")

from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

__all__ = ["CountingSpanExporter", "FlushRequest", "GrpcForkGate"]

_log = logging.getLogger("specobs")


class GrpcForkGate:
    """Keeps ``fork()`` out of specobs's own gRPC calls.

    gRPC core's fork handlers reset its poller in the child only when no thread is inside gRPC
    at the moment of the fork; otherwise they are skipped ("Other threads are currently calling
    into gRPC, skipping fork() handlers") and the child inherits a poller owned by a thread that
    does not exist: its first gRPC call may abort the process (``ev_epoll1_linux.cc Check
    failed``) or hang. (``GRPC_ENABLE_FORK_SUPPORT=1`` does not help here: with exports in
    flight, children and the parent hung.) So every gRPC export and shutdown of this module
    passes through this gate; before a fork the gate waits up to ``wait_seconds()`` (read at
    each fork: ``SPECOBS_OTLP_FORK_WAIT_SECONDS``, as the sink module holds it) for the calls in
    progress to end and holds new ones back until the fork is done. A child forked
    while a call was still in progress is told so (:meth:`unsafe_here`) and does not touch
    gRPC at all.
    """

    def __init__(self, wait_seconds: Callable[[], float]) -> None:
        self._wait_seconds = wait_seconds
        self._reinit()
        self.child_unsafe = False
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=self._before_fork, after_in_parent=self._after_in_parent,
                                after_in_child=self._after_in_child)

    def _reinit(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._busy_at_fork = False

    def __enter__(self) -> None:
        with self._cond:
            self._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def _before_fork(self) -> None:
        self._cond.acquire()  # held through fork(): no call starts meanwhile
        if self._active:
            self._busy_at_fork = not self._cond.wait_for(
                lambda: self._active == 0, self._wait_seconds())

    def _after_in_parent(self) -> None:
        self._busy_at_fork = False
        self._cond.release()

    def _after_in_child(self) -> None:
        # Also called from OtlpSink.after_fork_in_child: the observer's fork hook may have been
        # registered before this one, and so run first. Once per process.
        if self._pid == os.getpid():
            return
        self.child_unsafe = self.child_unsafe or self._busy_at_fork
        self._reinit()

    def unsafe_here(self) -> bool:
        """Whether this process descends from a fork that landed inside a gRPC call."""
        self._after_in_child()
        return self.child_unsafe




class CountingSpanExporter(SpanExporter):
    """Wraps the OTLP span exporter: counts what it received and what failed, and its CPU.

    ``received`` is read by the sink's admission check (in flight = submitted - received). Once
    ``close()`` ran, later exports (a processor thread that outlived a timed-out shutdown) return
    FAILURE at once and are not counted again: the sink already counted them as lost.
    """

    def __init__(self, inner: SpanExporter, exported: Callable[[int, bool, int], None],
                 gate: AbstractContextManager[Any]) -> None:
        self._inner = inner
        self._exported = exported  # (spans, delivered, CPU ns) of each export, to the sink
        self._gate = gate
        self.received = 0
        self.exporting = 0  # spans of the export in progress
        self._abandoned = False
        self._closed = False
        self._shut = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        n = len(spans)
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            self.received += n
            self.exporting = n
        t0 = time.thread_time_ns()
        try:
            with self._gate:
                result = self._inner.export(spans)
        except Exception as exc:  # the processor would only log it; we count it too
            _log.warning("specobs: OTLP span export raised: %r", exc)
            result = SpanExportResult.FAILURE
        with self._lock:
            self.exporting = 0
            abandoned = self._abandoned
        if not abandoned:  # else shutdown() already counted this batch as lost
            self._exported(n, result is SpanExportResult.SUCCESS, time.thread_time_ns() - t0)
        return result

    def abandon(self) -> int:
        """Shutdown ran out of time: refuse further exports and return the spans of the
        export still in progress (lost: the process may end before it returns)."""
        with self._lock:
            self._closed = True
            self._abandoned = True
            lost, self.exporting = self.exporting, 0
        return lost

    def close(self) -> None:
        with self._lock:
            self._closed = True

    @property
    def inner(self) -> SpanExporter:
        return self._inner

    def reset_in_child(self, inner: SpanExporter) -> None:
        self._lock = threading.Lock()
        self._inner = inner
        self.received = 0
        self._closed = False
        self._shut = False

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        with self._lock:
            self._closed = True
            if self._shut:
                return
            self._shut = True
        try:
            with self._gate:
                self._inner.shutdown()
        except Exception as exc:
            _log.warning("specobs: OTLP span exporter shutdown failed: %r", exc)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class FlushRequest:
    """A ``force_flush`` waiting for the export thread: set ``done`` once ``ok`` is final."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
