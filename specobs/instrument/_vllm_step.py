"""The per-step bookkeeping every vLLM topology shares.

:class:`Step` holds the runner's step in flight (its tracker and what the hooks read of it), the
cycles deferred until vLLM's counts of their step arrive, and the engine core's per-request
figures. It starts, ends, defers and aborts a cycle the same way for every topology. The
topologies (:mod:`specobs.instrument._vllm_topologies`) subclass it and add only what their
place needs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, ClassVar

from specobs.instrument import _base
from specobs.instrument._vllm_reads import HostRow, topology

__all__ = [
    "MAX_PENDING", "AsSampled", "Counted", "Deferred", "Step", "as_sampled", "failed",
    "settle_as_sampled", "settle_with",
]  # fmt: skip

failed = _base.LogOnce()
"""Logs the first failure of each kind in a vLLM hook; the engine never sees it."""

MAX_PENDING = 32
"""Deferred steps a thread holds at most (vLLM's batch queue holds two steps with async
scheduling, one per stage with pipeline parallelism); an older one is settled as sampled."""

Counted = tuple[int, "list[int]", "list[int]", int, int, "list[tuple[int, int]]"]
"""What vLLM counted of one speculative step, made in the engine core for a worker of its own:
(step number, drafts per counted draft, accepted per counted draft -- the rows
``make_spec_decoding_stats`` observed, as it observed them --, rows handed tokens, tokens
handed, and (drafted, accepted) of each request the step finished, over its whole life)."""


class AsSampled:
    """The step's acceptance as the runner sampled it, on the GPU. It is computed (a few tiny
    kernels queued on the runner's stream, no sync) only where specobs counts it, not on every
    step. Wherever vLLM's own counts reach specobs (the host rows of ``_bookkeeping_sync``, a
    deferred step's ``update_from_output``, the engine core's counts for a worker of its own)
    nothing is launched: those kernels cost the runner more than the acceptance copy itself."""

    __slots__ = ("fn", "tensor")

    def __init__(self, fn: Callable[[Any], Any], tensor: Any) -> None:
        self.fn = fn
        self.tensor = tensor

    def __call__(self) -> Any:
        return self.fn(self.tensor)


def as_sampled(accepted: Any) -> Any:
    """``accepted`` as the observer takes it: an :class:`AsSampled` is computed now."""
    return accepted() if type(accepted) is AsSampled else accepted


class Deferred:
    """A step whose cycle ended with its acceptance to come."""

    __slots__ = ("accepted", "batch_size", "drafts", "emitted", "handle", "key", "waiting")

    def __init__(self, handle: Any, key: Any, step: Step, waiting: set[Any] | None) -> None:
        self.handle = handle
        # What the counts of the step are matched by: the scheduler output (the engine core's
        # thread) or the engine core's number of the step (a worker of its own).
        self.key = key
        # As the runner sampled them: the fallback where no count of vLLM's comes.
        self.drafts: Any = step.draft_length
        self.accepted: Any = step.accepted
        self.batch_size = step.batch_size
        self.emitted = step.emitted
        # A worker of its own: the step's requests not yet known to be finished before the
        # engine core took the step's output (it skips those rows).
        self.waiting = waiting


def settle_as_sampled(entry: Deferred) -> None:
    """Every row of the step, as the runner sampled it (what specobs counted before)."""
    if entry.accepted is None:
        entry.handle.settle(None)
    else:
        entry.handle.settle(as_sampled(entry.accepted), draft_length=entry.drafts,
                            batch_size=entry.batch_size, emitted=entry.emitted)  # fmt: skip


def settle_with(entry: Deferred, counts: Counted, instrumentor: _base.BaseInstrumentor) -> None:
    """Settle a deferred cycle with what vLLM's scheduler counted of its step, then report the
    requests the step finished to ``instrumentor``'s observer."""
    _, drafted, accepted, rows, emitted, finished = counts
    if finished:
        instrumentor.report_requests(finished)
    if not rows and not accepted:
        entry.handle.settle(None)
        return
    lengths = list(accepted)
    drafts = list(drafted)
    extra = max(rows - len(lengths), 0)  # rows handed tokens without a draft
    lengths += [0] * extra
    drafts += [0] * extra
    entry.handle.settle(lengths, draft_length=drafts, batch_size=len(lengths), emitted=emitted)


class Step:
    """One thread's share of the bookkeeping that every topology does the same way.

    A topology subclasses it and is built with the instrumentor it records for. A bare
    ``Step`` has none: it keeps the same state but cannot open a cycle.
    """

    __slots__ = (
        "accepted", "batch_size", "draft_length", "emitted", "grammar", "instrumentor", "off",
        "pending", "req_ids", "requests", "rows", "scheduled", "tracker",
    )  # fmt: skip

    runs_runner: ClassVar[bool] = False
    """A model runner runs on this thread."""
    runs_scheduler: ClassVar[bool] = False
    """vLLM's scheduler runs on this thread (the engine core's)."""

    instrumentor: _base.BaseInstrumentor

    def __init__(self) -> None:
        self.tracker: _base.PhaseTracker | None = None
        self.off = False  # this process does not record (not the leader, or a failed start)
        # Cycles ended with their acceptance to come, oldest first.
        self.pending: collections.deque[Deferred] = collections.deque()
        # Where the scheduler runs: per request still running, [drafted, accepted] as vLLM's
        # scheduler counted its rows (its per-request figures), until the request finishes.
        self.requests: dict[Any, list[int]] = {}
        self.clear()

    def take_over(self, held: Step) -> None:
        """Carry what ``held`` (this thread's previous topology) kept: its step in flight, its
        deferred cycles and its per-request figures."""
        for name in Step.__slots__:
            setattr(self, name, getattr(held, name))

    def clear(self) -> None:
        """Forget what the last step read (its cycle ended)."""
        self.draft_length: Any = None
        self.accepted: Any = None
        # The step's scheduler output and the grammar output sample_tokens got: where vLLM says
        # which drafts a grammar rejected (async scheduling with structured outputs).
        self.scheduled: Any = None
        self.grammar: Any = None
        # From the host token lists (V1 without async scheduling): the rows that decoded and
        # the tokens vLLM keeps of them; None leaves specobs's defaults (every row, 1 + accepted).
        self.batch_size: int | None = None
        self.emitted: int | None = None
        # The host rows behind those counts: (request id, accepted, drafted, emitted kept).
        self.rows: list[HostRow] | None = None
        # The runner's request ids of the step, in its row order.
        self.req_ids: Any = None

    def start(
        self, runner: Any, batch_size: int, phases: tuple[str, ...], integration: str,
        draft_length: int | None,
    ) -> None:  # fmt: skip
        """Open the step's cycle (its first phase starts now). The first cycle of the process
        builds the observer, in ``phases`` order, for where ``runner``'s process sits."""
        instrumentor = self.instrumentor
        observer = instrumentor.current_observer
        if observer is None:
            k = int(getattr(runner.speculative_config, "num_speculative_tokens", 0) or 0)
            observer = instrumentor.observer(
                phases=phases,
                max_draft_length=k if k > 8 else None,
                topology=topology(runner),
                integration=integration,
            )
        if not observer.settings.enabled:
            self.off = True
            return
        tracker = _base.PhaseTracker(observer)
        tracker.start(batch_size, draft_length)
        self.tracker = tracker

    def take_rows(self, rows: list[HostRow]) -> None:
        """The step's counts are its host rows (V1 without async scheduling)."""
        self.rows = rows
        self.accepted = [r[1] for r in rows]
        self.draft_length = [r[2] for r in rows]
        self.emitted = sum(r[3] for r in rows)
        self.batch_size = len(rows)

    def finish(self) -> None:
        """End the step's cycle with its counts as the runner sampled them."""
        tracker = self.tracker
        if tracker is not None:
            self.tracker = None
            if self.accepted is not None:
                tracker.accept(as_sampled(self.accepted), self.draft_length, self.batch_size,
                               self.emitted)  # fmt: skip
            tracker.finish()
        self.clear()

    def defer(self, key: Any, waiting: set[Any] | None) -> None:
        """End the step's cycle with its acceptance to come, to be settled by ``key``."""
        tracker = self.tracker
        if tracker is None:
            return
        self.tracker = None
        entry = Deferred(tracker.defer(), key, self, waiting)
        self.clear()
        pending = self.pending
        pending.append(entry)
        if len(pending) > MAX_PENDING:
            settle_as_sampled(pending.popleft())

    def abort(self) -> None:
        """The runner raised mid-step: discard the open cycle."""
        if self.tracker is not None:
            self.tracker.abort()
            self.tracker = None
            self.rows = None
