"""The observer: the explicit handle ``configure()`` returns.

One observer per engine (per worker thread that runs cycles). Several can coexist — there is no
process-global that can be set only once — and each owns its recorder, resolver thread,
aggregation and sinks.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec

import specobs._ring as _ring
from specobs._acceptance import MAX_TOKENS, bounded_count, integer_or_none
from specobs._aggregation import Aggregation
from specobs._config import (
    Settings,
    exporters,
    prometheus_addr,
    prometheus_port,
    resolve_settings,
)
from specobs._errors import ConfigurationError, ObserverClosedError
from specobs._lifetime import install_hooks
from specobs._lifetime import live as _live
from specobs._model import CycleHandle, Snapshot
from specobs._recorder import NULL_CYCLE, Recorder, short_repr
from specobs._resolver import Resolver
from specobs._signalsafe import GuardedLock
from specobs._version import __version__ as _version
from specobs.sinks._base import Sink
from specobs.timing import EventClock
from specobs.timing._base import record_stream_of
from specobs.timing.host import WallAnchor

#: Makes the CUDA clock once the engine has initialised CUDA (``None`` until then).
ClockFactory = Callable[[], "EventClock | None"]

__all__ = ["Observer", "configure"]

_log = logging.getLogger("specobs")


_P = ParamSpec("_P")


def _on_current_cycle(
    method: Callable[Concatenate[CycleHandle, _P], None], kind: str
) -> Callable[Concatenate[Observer, _P], None]:
    """``Observer.<method>``: the method called on the observer's current cycle, taking what the
    protocol's takes; with no cycle open, the no-op handle's (a call Python cannot bind raises
    there too), counted as ``errors{kind}``."""
    name = method.__name__
    no_cycle = f"{name}() with no open cycle"

    def on_current(self: Observer, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        c = self._recorder.current
        if c is None:
            getattr(NULL_CYCLE, name)(*args, **kwargs)
            if self._recorder.enabled:
                self._recorder.misuse(kind, no_cycle)
            return
        getattr(c, name)(*args, **kwargs)

    functools.update_wrapper(on_current, method)  # help() shows the protocol's signature
    on_current.__module__ = __name__
    on_current.__qualname__ = f"Observer.{name}"
    on_current.__doc__ = f"On the current cycle (:meth:`CycleHandle.{name}`): {method.__doc__}"
    return on_current


class Observer:
    """Times and counts speculative decoding cycles; see :func:`specobs.configure`.

    Hot path (never raises, never synchronises the GPU, a cheap no-op after ``shutdown``)::

        with obs.cycle(batch_size=8) as c:    # "draft" starts
            ...
            c.mark("verify")
            ...
            c.mark("bookkeeping")
            c.accept(accepted_lengths, draft_length=4)

    or, when the boundaries live in different functions, ``obs.begin()``, ``obs.mark(phase)``,
    ``obs.accept(...)`` and ``obs.end()``, which act on the observer's current cycle.

    An observer belongs to one engine thread: configure one per thread. Shared, it still counts
    each begun cycle once, but a ``begin()`` discards the cycle another thread has open
    (``errors{kind="begin_while_open"}``, ``dropped_records_total{reason="misuse"}``).

    Args:
        settings: the validated settings (:func:`configure` builds them).
        sinks: where resolved data goes.
        clock: the GPU clock to use (tests); default chosen by ``settings.clock``.
        clock_factory: builds the clock once the engine has initialised CUDA (``"auto"``).
        clock_name: the clock's name in ``specobs_info``.
    """

    def __init__(
        self,
        settings: Settings,
        sinks: Sequence[Sink] = (),
        *,
        clock: EventClock | None = None,
        clock_factory: ClockFactory | None = None,
        clock_name: str = "none",
    ) -> None:
        self.settings = settings
        self.phases = settings.phases
        self.sinks = list(sinks)
        self.anchor = WallAnchor()
        self._closed = False
        self._lock = GuardedLock()
        self.aggregation = _aggregation_for(settings, clock_name, self.anchor.wall_ns)
        self._recorder = Recorder(
            settings.phases,
            queue_size=settings.queue_size,
            sample_every=settings.sample_every,
            clock=clock,
            clock_factory=clock_factory,
            max_draft_length=settings.max_draft_length,
            duration_bounds=self.aggregation.duration_bounds,
        )
        self._recorder.enabled = settings.enabled
        self._recorder.ring.idle_gap_ns = round(settings.idle_gap_seconds * 1e9)
        self._recorder.ring.max_cycle_sequences = settings.max_cycle_sequences
        self._recorder.ring.max_queue_bytes = settings.max_queue_bytes
        self.aggregation.attach_ring(self._recorder.ring, self.anchor.offset_ns)
        self._resolver = Resolver(
            self._recorder,
            self.aggregation,
            self.sinks,
            self.anchor,
            poll_interval_seconds=settings.poll_interval_seconds,
            overhead_budget=settings.overhead_budget,
            trace_head_rate=settings.trace_head_rate,
            trace_slow_cycle_seconds=settings.trace_slow_cycle_seconds,
            want_traces=any(s.wants_traces for s in self.sinks),
            want_cycles=any(s.wants_cycles for s in self.sinks),
        )
        self._resolver.settle_timeout_ns = int(settings.settle_timeout_seconds * 1e9)
        self._recorder.wake = self._resolver.wake
        # The hot path skips one call layer: ``obs.begin`` *is* the recorder's bound method.
        # The methods below stay for documentation, and a subclass that overrides them keeps
        # its override.
        if type(self).begin is Observer.begin:
            self.begin = self._recorder.begin  # type: ignore[method-assign]
        if type(self).cycle is Observer.cycle:
            self.cycle = self._recorder.begin  # type: ignore[method-assign]
        self._attach_sinks()
        if settings.enabled:
            self._resolver.start()
            _live[id(self)] = self
            install_hooks()

    def _attach_sinks(self) -> None:
        """Attach every sink to the aggregation; if one fails, stop the ones started before."""
        attached: list[Sink] = []
        try:
            for sink in self.sinks:
                sink.attach(self.aggregation)
                attached.append(sink)
        except BaseException:
            # A later sink failed (a taken port, say): stop the ones already started, or their
            # threads and sockets would outlive the failed configure().
            for sink in reversed(attached):
                try:
                    sink.shutdown(1.0)
                except Exception as exc:
                    _log.warning("specobs: could not stop sink %r: %r", sink, exc)
            raise

    # -- hot path ------------------------------------------------------------------------------
    def begin(self, batch_size: int | None = None, draft_length: int | None = None
              ) -> CycleHandle:
        """Start a cycle (and its first phase).

        The per-k series (``specobs_draft_length``, ``specobs_*_by_draft_length``) count the
        cycle under ``draft_length``; without it, under the draft length ``accept`` names (an
        int, or the largest of one per sequence), or not at all. A bad value is counted as
        ``errors{kind="bad_draft_length"}`` and the cycle is kept without a k; nothing raises.

        Args:
            batch_size: the sequences in the batch (default: what ``accept`` names).
            draft_length: the k the engine scheduled for this cycle's draft phase, an int in
                0..``max_draft_length`` (0: a step that drafts nothing under the engine's
                schedule, a cycle all the same; numpy / torch integer scalars are taken).

        Returns:
            The cycle's handle, also kept as ``current``."""
        c: CycleHandle = self._recorder.begin(batch_size, draft_length)
        return c

    def cycle(self, batch_size: int | None = None, draft_length: int | None = None
              ) -> CycleHandle:
        """``begin`` for use as a context manager: the cycle ends when the block exits.

        Args:
            batch_size: as :meth:`begin` takes it.
            draft_length: as :meth:`begin` takes it.

        Returns:
            The cycle's handle, a context manager."""
        c: CycleHandle = self._recorder.begin(batch_size, draft_length)
        return c

    @property
    def current(self) -> CycleHandle | None:
        """The open cycle, if any: the handle :meth:`begin` returned."""
        c: CycleHandle | None = self._recorder.current
        return c

    def mark(self, phase: str) -> None:
        """End the running phase of the current cycle and start the next.

        Args:
            phase: the phase that starts now (see :meth:`CycleHandle.mark`)."""
        c = self._recorder.current
        if c is None:
            if self._recorder.enabled:
                self._recorder.misuse_value("mark_without_begin", "mark(", phase,
                                            ") with no open cycle")
            return
        c.mark(phase)

    # The current cycle's own methods, so their arguments are the protocol's by construction.
    accept = _on_current_cycle(CycleHandle.accept, "bad_acceptance")
    end = _on_current_cycle(CycleHandle.end, "end_without_begin")

    def set_requests(self, *, running: float | None = None, waiting: float | None = None) -> None:
        """Report the engine's running and waiting request counts (for the stall alert).

        Called from engine loops, so like the hot path it never raises: a value that is not a
        finite number >= 0 (text and bools are not numbers here, however they read) is ignored
        (the gauge keeps its last value) and counted as ``errors{kind="bad_request_counts"}``.

        Args:
            running: requests the engine is running now.
            waiting: requests queued for a slot.
        """
        rec = self._recorder
        if not rec.enabled:
            return
        valid: dict[str, float] = {}
        for name, value in (("running", running), ("waiting", waiting)):
            if value is None:
                continue
            try:
                # Text is refused unread: float() would parse all of it, and its error message
                # copies it whole (a megabyte string cost the engine's loop milliseconds). A
                # bool is a flag, not a count of requests.
                ok = not isinstance(value, (str, bytes, bytearray, memoryview, bool))
                v = float(value) if ok else 0.0
                ok = ok and v >= 0.0 and v != float("inf")  # also False for NaN
            except Exception:
                ok = False
            if not ok:
                rec.misuse_value("bad_request_counts", f"set_requests({name}=...) must be a "
                                 "count >= 0, got ", value, "; ignored")
                continue
            valid[name] = v
        if valid:
            self.aggregation.set_requests(valid.get("running"), valid.get("waiting"))

    def drafts_unverified(self, tokens: int) -> None:
        """Report draft tokens the engine proposed and then left out of verification (an
        adaptive verify budget trimmed them), which ``accept()``'s drafted counts leave out:
        ``specobs_draft_tokens_unverified_total``. From any thread; never raises: a count that
        is not an integer in 0..2**32 is ignored and counted as
        ``errors{kind="bad_acceptance"}``.

        Args:
            tokens: draft tokens left out of verification since the last call."""
        rec = self._recorder
        if not rec.enabled:
            return
        n = bounded_count(tokens, MAX_TOKENS)
        if n is None:
            rec.misuse_value("bad_acceptance", "drafts_unverified() needs a count of draft "
                             f"tokens, an int between 0 and {MAX_TOKENS}, got ", tokens,
                             "; ignored")
            return
        if n:
            self.aggregation.drafts_unverified(n)

    def request_finished(
        self, *, drafted: int, accepted: int, trace_id: int | str | None = None
    ) -> None:
        """Report one finished request: the draft tokens proposed for it (``drafted``) and
        those verification accepted (``accepted``, the bonus tokens not counted), summed over
        its whole life. Its acceptance rate, accepted / drafted, goes into
        ``specobs_request_acceptance``; a request that drafted nothing is counted in
        ``specobs_requests_finished_total`` only. ``trace_id``: the request's trace (an
        OpenTelemetry trace id as an int, or its 32 hex digits as in ``traceparent``); the
        worst requests keep it as an exemplar. Call it when the request finishes, from any
        thread; it takes a lock of its own, never the ring.

        Like the hot path it never raises: counts that are not integers with ``0 <= accepted
        <= drafted`` are ignored, and a trace id that is neither is dropped (the request still
        counts); each is counted as ``errors{kind="bad_request_acceptance"}`` and logged once.

        Args:
            drafted: draft tokens proposed for the request over its life.
            accepted: those verification accepted, bonus tokens not counted.
            trace_id: the request's trace, an int or 32 hex digits; ``None``: none.
        """
        rec = self._recorder
        if not rec.enabled:
            return
        d: int | None = drafted
        a: int | None = accepted
        if type(d) is not int or type(a) is not int:
            d, a = integer_or_none(drafted), integer_or_none(accepted)
        if d is None or a is None or not 0 <= a <= d:
            rec.misuse("bad_request_acceptance", lambda: (
                "request_finished() needs counts with 0 <= accepted <= drafted, got drafted="
                f"{short_repr(drafted)}, accepted={short_repr(accepted)}; request not counted"))
            return
        tid: int | None = None
        if trace_id is not None:
            tid = _trace_id_or_none(trace_id)
            if tid is None:
                rec.misuse("bad_request_acceptance", lambda: (
                    "request_finished(trace_id=...) needs a nonzero 128-bit int or 32 hex "
                    f"digits, got {short_repr(trace_id)}; request counted without it"))
        self.aggregation.request_finished(d, a, tid)

    def refresh_stream(self) -> None:
        """Look up the current CUDA stream again, after the engine switched streams."""
        clock = self._recorder.clock
        if clock is not None:
            clock.refresh_stream()
            self._recorder.stream = record_stream_of(clock)

    # -- read back & lifecycle -------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def clock(self) -> EventClock | None:
        """The event clock in use, or ``None`` (host clock only, or CUDA not started yet)."""
        return self._recorder.clock

    def snapshot(self) -> Snapshot:
        """A consistent copy of the aggregation (``force_flush()`` first to include everything)."""
        return self.aggregation.snapshot()

    def force_flush(self, timeout_seconds: float = 5.0) -> bool:
        """Resolve everything recorded so far and flush the sinks.

        Args:
            timeout_seconds: how long the call may take in all.

        Returns:
            Whether everything was resolved and every sink flushed in time."""
        if self._closed:
            raise ObserverClosedError(
                "Cannot flush: the observer has been shut down. Call specobs.configure() again."
            )
        if not self.settings.enabled:
            return True
        return self._resolver.force_flush(timeout_seconds)

    def shutdown(self, timeout_seconds: float = 5.0) -> None:
        """Stop recording, resolve what can be resolved within the timeout, stop the sinks.

        Idempotent. Afterwards every hot-path call is a cheap no-op. Safe in a signal handler
        (as are ``force_flush`` and the hot path): it never waits for a lock the interrupted
        code holds, and a call that interrupts this observer's own ``shutdown`` returns at
        once, leaving it to finish.

        Args:
            timeout_seconds: how long the call may take in all.
        """
        if not self._lock.acquire():
            return  # a signal handler's call inside this thread's own shutdown: that one goes on
        try:
            if self._closed:
                return
            self._closed = True
        finally:
            self._lock.release()
        self._recorder.enabled = False
        if self.settings.enabled:
            self._resolver.shutdown(timeout_seconds)
        _live.pop(id(self), None)

    def _after_fork_in_child(self) -> None:
        if self._closed or not self.settings.enabled:
            return
        rec = self._recorder
        if rec.clock is not None and rec.clock.name == "cuda":
            # CUDA cannot be used in a forked child; keep counting on the host clock.
            rec.drop_clock()
        self._lock = GuardedLock()
        self._resolver.after_fork_in_child(start=False)
        for sink in self.sinks:
            try:
                sink.after_fork_in_child()
            except Exception as exc:
                _log.warning("specobs: sink %r could not restart after fork: %r", sink, exc)
        self._resolver.start()

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *args: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<specobs.Observer phases={','.join(self.phases)} {state}>"


def _aggregation_for(settings: Settings, clock_name: str, created_unix_nano: int) -> Aggregation:
    """The observer's aggregation, its ``specobs_info`` labels said from the settings."""
    # The mode is configuration text; the budget a number (its gauge), given only where
    # the adaptive sampler holds the cost under it.
    fixed = settings.sample_every is not None
    sampling_desc = f"every_{settings.sample_every}" if fixed else "adaptive"
    return Aggregation(
        settings.phases,
        settings.max_draft_length,
        labels=dict(settings.labels),
        info={
            "version": _version,
            "phases": ",".join(settings.phases),
            "gpu_clock": clock_name,
            "sampling": sampling_desc,
            "integration": settings.integration,
            "core": "native" if _ring.NATIVE else "python",
        },
        baseline_tokens_per_second=settings.baseline_tokens_per_second,
        # Cumulative series start when the observer was created (OTLP start time, _created).
        created_unix_nano=created_unix_nano,
        sampling_budget_ratio=None if fixed else settings.overhead_budget,
        max_label_value_length=settings.max_label_value_length,
    )


_TRACE_ID_MAX = (1 << 128) - 1


def _trace_id_or_none(value: Any) -> int | None:
    """A nonzero 128-bit trace id from an int or 32 hex digits, else ``None``."""
    if type(value) is int:
        return value if 0 < value <= _TRACE_ID_MAX else None
    if isinstance(value, str) and len(value) == 32 and value.isascii() and value.isalnum():
        try:
            tid = int(value, 16)
        except ValueError:
            return None
        return tid if tid > 0 else None
    return None


def _make_clock(
    settings: Settings, clock: Any
) -> tuple[EventClock | None, ClockFactory | None, str]:
    """Returns (clock, lazy factory, name for specobs_info)."""
    if clock is not None and not isinstance(clock, str):
        return clock, None, getattr(clock, "name", "custom")
    mode = settings.clock if clock is None else clock
    if mode not in ("auto", "cuda", "host"):
        raise ConfigurationError(f"clock must be 'auto', 'cuda', 'host' or a clock, got {mode!r}")
    if mode == "host":
        return None, None, "none"
    from specobs.timing import cuda as cuda_timing

    if mode == "cuda":
        return cuda_timing.CudaEventClock(settings.event_pool_size), None, "cuda"

    pool = settings.event_pool_size

    def factory() -> EventClock | None:
        if not cuda_timing.cuda_ready():
            return None
        try:
            return cuda_timing.CudaEventClock(pool)
        except Exception as exc:
            _log.warning("specobs: CUDA timing unavailable, host clock only: %r", exc)
            return None

    return None, factory, "auto"


def _port_offset(settings: Settings) -> int:
    """Where this process's default Prometheus port lies above the configured one."""
    replica = settings.replica or 0
    rank = settings.rank if settings.all_ranks else 0
    return replica + settings.replicas * rank


def _with_rank_labels(settings: Settings) -> Settings:
    """``dp_rank`` on the series of a replica of several, ``rank`` on every rank's when all
    record."""
    extra: dict[str, str] = {}
    if settings.replica is not None and settings.replicas > 1:
        extra["dp_rank"] = str(settings.replica)
    if settings.all_ranks:
        extra["rank"] = str(settings.rank)
    if not extra:
        return settings
    from dataclasses import replace

    return replace(settings, labels={**settings.labels, **extra})


def _sinks_from_env(settings: Settings, env: Mapping[str, str]) -> list[Sink]:
    """The sinks ``SPECOBS_EXPORTERS`` names; the Prometheus port moved by the process's
    offset (:func:`_port_offset`)."""
    built: list[Sink] = []
    for name in exporters(env):
        if name == "prometheus":
            from specobs.sinks.prometheus import PrometheusSink

            port = prometheus_port(env)
            if port:
                port += _port_offset(settings)
            built.append(PrometheusSink(port=port, addr=prometheus_addr(env)))
        elif name == "otlp":
            from specobs.sinks.otlp import OtlpSink

            built.append(OtlpSink())
    return built


def configure(
    settings: Settings | None = None,
    *,
    sinks: Sequence[Sink] | None = None,
    clock: Any = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Observer:
    """Create an observer. Arguments win over ``SPECOBS_*`` variables, which win over defaults.

    Every :class:`~specobs.Settings` field is a keyword argument, validated by its row of
    ``specobs._config.SETTINGS`` (docs/configuration.md lists them). ``sample_every``: GPU-time
    one cycle in N; default adaptive under ``overhead_budget``.

    Multi-process servers: only rank 0 records unless ``all_ranks`` (then each rank gets a
    ``rank`` label and, for the default Prometheus endpoint, port + rank). A server of
    ``replicas`` data-parallel replicas gives each its ``replica`` index: ``rank`` is then the
    rank inside the replica, series carry ``dp_rank``, and the default Prometheus port of replica
    *d* is port + *d* (with ``all_ranks``: port + *d* + ``replicas`` x rank), so replicas on one
    host never compete for a port. ``leader`` says whether this process is the one of its
    replica that records (default: ``rank == 0``); engines whose sampling runs on the last
    pipeline stage pass it. ``integration`` names who records (``specobs_info``).

    Args:
        settings: start from these settings instead of the variables and defaults.
        sinks: where data goes; default from ``SPECOBS_EXPORTERS`` (``prometheus``,
            ``otlp``), else none (read back with :meth:`Observer.snapshot`).
        clock: ``"auto"`` (CUDA events once the engine has initialised CUDA), ``"cuda"``,
            ``"host"``, or a clock object (tests).
        env: the environment to read ``SPECOBS_*`` from (default ``os.environ``).
        **overrides: any :class:`~specobs.Settings` field.

    Returns:
        The observer, recording.

    Raises:
        ConfigurationError: an invalid or unknown setting.
    """
    if settings is not None and not isinstance(settings, Settings):
        raise ConfigurationError(
            f"settings must be a specobs.Settings, got {type(settings).__name__}"
        )
    if isinstance(clock, str):
        overrides["clock"] = clock
    settings = resolve_settings(env=env, base=settings, **overrides)
    if sinks is not None:
        for s in sinks:
            if not isinstance(s, Sink):
                raise ConfigurationError(
                    f"sinks must be specobs sinks (MemorySink, PrometheusSink, OtlpSink, or a "
                    f"Sink subclass), got {type(s).__name__}"
                )
    is_leader = settings.rank == 0 if settings.leader is None else settings.leader
    if not is_leader and not settings.all_ranks:
        _log.info("specobs: rank %d does not record (one process per replica records; set "
                  "SPECOBS_ALL_RANKS=1 for all)", settings.rank)
        from dataclasses import replace

        return Observer(replace(settings, enabled=False))
    settings = _with_rank_labels(settings)
    if not settings.enabled:
        return Observer(settings)
    if sinks is None:
        sinks = _sinks_from_env(settings, os.environ if env is None else env)
    clk, factory, clock_name = _make_clock(settings, clock)
    return Observer(settings, sinks, clock=clk, clock_factory=factory, clock_name=clock_name)

