"""Where a vLLM thread that specobs hooks sits: one class per topology, chosen once per thread.

vLLM runs its model runner (the worker) on the engine core's own thread or in a process of its
own. That decides where specobs learns what vLLM's scheduler counted of a step
(``Scheduler.update_from_output``), and so where each cycle ends and is settled:

- :class:`InlineWorker`: the worker on the engine core's thread (one worker,
  ``UniProcExecutor``). Without async scheduling (V1's host rows) the cycle stays open until
  the thread's ``update_from_output`` begins and is settled with the rows it counts. With async
  scheduling, or model runner V2, the next step begins before this one's output is taken: the
  cycle ends at ``sample_tokens`` deferred and is settled by that step's ``update_from_output``.
- :class:`WorkerProcess`: a worker in a process of its own (``MultiprocExecutor``: tensor
  parallelism, pipeline stages, the CPU build's OpenAI server; Ray). The cycle ends at
  ``sample_tokens`` deferred and is settled when a later scheduler output brings the engine
  core's counts of its step. Where the engine core does not number its steps (specobs not
  loaded there), the cycle ends with its counts as sampled.
- :class:`EngineCore`: the engine core whose worker is elsewhere. It numbers each scheduler
  output it sends, keeps what ``update_from_output`` counted of each speculative step, and puts
  that on the next output, which vLLM pickles to the workers. It records nothing itself.

The hooks never ask which one they run in: each calls its thread's object. The first hook on a
thread chooses the object from what runs there (:func:`choose`); the engine core's thread
chooses again, once, when its worker's first step runs on it (it schedules before that step).
"""

from __future__ import annotations

import threading
from typing import Any, cast

from specobs.instrument import _base
from specobs.instrument._vllm_reads import is_plain
from specobs.instrument._vllm_step import (
    Counted,
    Deferred,
    Step,
    failed,
    settle_as_sampled,
    settle_with,
)

__all__ = [
    "COUNTED_ATTRIBUTE", "PLACES", "STEP_ATTRIBUTE", "EngineCore", "InlineWorker", "RunnerPlace",
    "SchedulerPlace", "WorkerProcess", "choose", "forget_thread", "here", "runner_thread",
    "scheduler_thread",
]  # fmt: skip

STEP_ATTRIBUTE = "specobs_step"
"""Set by the engine core on each ``SchedulerOutput``: the step's number in that process. A
worker of its own keys the cycle it defers by it."""
COUNTED_ATTRIBUTE = "specobs_counted"
"""Set by the engine core on a ``SchedulerOutput``: a tuple of
:data:`~specobs.instrument._vllm_step.Counted`, one per speculative step whose output
``update_from_output`` took since the previous schedule."""


class InlineWorker(Step):
    """The worker on the engine core's own thread: its scheduler counts each step right here."""

    __slots__ = ("collect", "waits")

    runs_runner = True
    runs_scheduler = True

    def __init__(self, instrumentor: _base.BaseInstrumentor) -> None:
        super().__init__()
        self.instrumentor = instrumentor
        # The open cycle waits for this thread's update_from_output to take the step's output.
        self.waits = False
        # The rows vLLM counts, while update_from_output runs (``counting_rows``).
        self.collect: list[tuple[int, int, Any]] | None = None

    # -- the runner's side ------------------------------------------------------------------

    def before_step(self, scheduler_output: Any) -> None:
        """A step begins: a previous one that never reached ``sample_tokens`` ends now."""
        if self.tracker is not None:
            self.end()

    def end(self) -> None:
        """End the step's cycle with its counts as sampled: no ``update_from_output`` will take
        it (the runner sampled inside ``execute_model``, or skipped ``sample_tokens``)."""
        self.waits = False
        self.finish()

    def sampled(self) -> None:
        """``sample_tokens`` returned. A step with host rows (no async scheduling) waits for
        this thread's ``update_from_output``, which comes next, after vLLM applied the aborts
        that arrived meanwhile. Without them the next step may launch before this one's output
        is taken: the times are final now, the counts come with its ``update_from_output``."""
        if self.rows is not None:
            self.waits = True
        else:
            self.defer(self.scheduled, None)

    def abort(self) -> None:
        """The runner raised mid-step: discard the open cycle, which waits no more."""
        self.waits = False
        super().abort()

    # -- the scheduler's side ---------------------------------------------------------------

    def on_schedule(self, output: Any) -> None:
        """The worker reads this thread's own scheduler output: nothing to tag."""

    def settles(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Deferred | None:
        """``update_from_output`` begins: the deferred cycle of the step whose output it takes,
        if any. A cycle still waiting for it ends here, before vLLM takes the step's output; it
        is settled with what vLLM counts of its rows (not those of requests aborted while it
        ran, nor a stale output or a failed KV load), its host rows the fallback."""
        if self.tracker is not None and self.waits:
            try:
                self.waits = False
                self.defer(self.scheduled, None)
            except Exception:
                failed("the cycle end (update_from_output)")
        pending = self.pending
        if not pending:
            return None
        try:
            scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
            for entry in pending:
                if entry.key is scheduler_output:
                    pending.remove(entry)
                    return entry
        except Exception:
            failed("the deferred step (update_from_output)")
        return None

    def counted(self, entry: Any, counts: Any) -> None:
        """Settle ``entry`` with the rows vLLM counted (as sampled where they could not be
        read)."""
        try:
            if counts is None:
                settle_as_sampled(entry)
            else:
                settle_with(entry, (0, *counts), self.instrumentor)
        except Exception:
            failed("the cycle end (update_from_output)")

    def lost(self, entry: Any) -> None:
        """``update_from_output`` raised: settle ``entry`` as sampled."""
        try:
            settle_as_sampled(entry)
        except Exception:
            failed("the cycle end (update_from_output)")


class WorkerProcess(Step):
    """A worker in a process of its own: the engine core's counts of a step reach it on a later
    scheduler output, keyed by the number the engine core gave the step."""

    __slots__ = ("key",)

    runs_runner = True

    def __init__(self, instrumentor: _base.BaseInstrumentor) -> None:
        super().__init__()
        self.instrumentor = instrumentor
        # The engine core's number of the step in flight (its tag on the scheduler output);
        # None where the engine core does not number its steps.
        self.key: int | None = None

    def before_step(self, scheduler_output: Any) -> None:
        """A step's scheduler output arrives: settle the cycles its counts are for, end a
        previous step that never reached ``sample_tokens``, note this step's number."""
        if self.pending:
            # Every output carries the engine core's counts of earlier steps, the empty one
            # after the last step included.
            try:
                self.settle_counted(scheduler_output)
            except Exception:
                failed("the engine core's counts (execute_model)")
        if self.tracker is not None:
            self.end()
        self.key = getattr(scheduler_output, STEP_ATTRIBUTE, None)

    def end(self) -> None:
        """End the step's cycle: deferred when the engine core numbered the step (it sends the
        counts), else with the counts as sampled."""
        key = self.key
        if key is None:
            self.finish()
            return
        scheduled = getattr(self.scheduled, "num_scheduled_tokens", None)
        self.defer(key, set(scheduled) if scheduled else None)

    sampled = end
    """``sample_tokens`` returned: the step's cycle ends (no scheduler on this thread)."""

    def settle_counted(self, scheduler_output: Any) -> None:
        """Settle the deferred cycles with the counts the engine core sent for them on
        ``scheduler_output``, and those whose every request the output lists as finished.

        The engine core sends a step's counts on the first output it schedules after its
        ``update_from_output`` took the step (there is always one: a request it handed tokens
        is still running, or finished and listed in ``finished_req_ids``, which keeps the
        engine core stepping). Counts arrive in step order, so a cycle older than one counted
        never gets its own (a failure in the engine core's hook): it is settled as sampled. A
        cycle still waiting after this output's counts was not taken when the output was
        scheduled, so a request the output lists as finished ended before vLLM took the step:
        vLLM skips its row. When every row is skipped so, the cycle is settled with no tokens
        now: with async scheduling that is the last step before the engine goes idle (every
        row finished in the step before), whose counts would come with no later output."""
        pending = self.pending
        counted = getattr(scheduler_output, COUNTED_ATTRIBUTE, None)
        for counts in counted or ():
            key = counts[0]
            while pending and isinstance(pending[0].key, int) and pending[0].key < key:
                settle_as_sampled(pending.popleft())
            if pending and pending[0].key == key:
                settle_with(pending.popleft(), counts, self.instrumentor)
        finished = getattr(scheduler_output, "finished_req_ids", None)
        if finished:
            for entry in list(pending):
                if entry.waiting is not None:
                    entry.waiting.difference_update(finished)
                    if not entry.waiting:
                        pending.remove(entry)
                        entry.handle.settle(None)


class EngineCore(Step):
    """The engine core whose worker runs elsewhere: it numbers the scheduler outputs it sends
    and sends on each the counts of the speculative steps taken since the last one."""

    __slots__ = ("collect", "counts", "next_step")

    runs_scheduler = True

    def __init__(self, instrumentor: _base.BaseInstrumentor) -> None:
        super().__init__()
        self.instrumentor = instrumentor
        # The number the next scheduler output is tagged with.
        self.next_step = 0
        # What update_from_output counted of the speculative steps since the last schedule,
        # for the next one to carry.
        self.counts: list[Counted] = []
        # The rows vLLM counts, while update_from_output runs (``counting_rows``).
        self.collect: list[tuple[int, int, Any]] | None = None

    def on_schedule(self, output: Any) -> None:
        """Tag the scheduler output before the executor sends it: its step number
        (:data:`STEP_ATTRIBUTE`) and what ``update_from_output`` counted of the speculative
        steps taken since the last schedule (:data:`COUNTED_ATTRIBUTE`). vLLM pickles the object
        to the workers (``MultiprocExecutor``'s broadcast queue, Ray's channels), attributes
        included."""
        try:
            setattr(output, STEP_ATTRIBUTE, self.next_step)
            self.next_step += 1
            if self.counts:
                setattr(output, COUNTED_ATTRIBUTE, tuple(self.counts))
                self.counts.clear()
        except Exception:
            failed("the step tag (schedule)")

    def settles(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """``update_from_output`` begins: the number of the step whose counts it makes for the
        worker, or ``None`` for a step that is not a cycle (no drafts, not a plain step)."""
        try:
            scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
            key = getattr(scheduler_output, STEP_ATTRIBUTE, None)
            if scheduler_output.scheduled_spec_decode_tokens or is_plain(scheduler_output):
                return key
        except Exception:
            failed("the counts for the worker (update_from_output)")
        return None

    def counted(self, key: Any, counts: Any) -> None:
        """Keep what vLLM counted of step ``key`` for the next scheduler output to carry."""
        if counts is not None:
            self.counts.append((key, *counts))

    def lost(self, key: Any) -> None:
        """``update_from_output`` raised: the worker settles the step as sampled."""


RunnerPlace = InlineWorker | WorkerProcess
"""The object of a thread that runs a model runner."""
SchedulerPlace = InlineWorker | EngineCore
"""The object of a thread that runs vLLM's scheduler."""

PLACES: dict[tuple[bool, bool], type[InlineWorker | WorkerProcess | EngineCore]] = {
    (True, True): InlineWorker,
    (True, False): WorkerProcess,
    (False, True): EngineCore,
}
"""(a runner runs on the thread, the scheduler runs on it) -> the thread's topology."""


def choose(*, runner: bool, scheduler: bool) -> type[InlineWorker | WorkerProcess | EngineCore]:
    """The topology of a thread that runs a model runner, vLLM's scheduler, or both."""
    place = PLACES.get((runner, scheduler))
    if place is None:
        raise ValueError(
            "a vLLM thread has a topology only where a model runner or the scheduler runs on it; "
            f"expected runner=True or scheduler=True, got runner={runner}, scheduler={scheduler}"
        )
    return place


here = threading.local()
"""This thread's topology object: ``step`` whatever it is, ``runner`` once a model runner ran
on the thread, ``scheduler`` once vLLM's scheduler did (the same object under each name)."""


def _move(
    instrumentor: _base.BaseInstrumentor, *, runner: bool, scheduler: bool
) -> InlineWorker | WorkerProcess | EngineCore:
    """Choose this thread's topology now that a runner or the scheduler runs on it, keeping
    what the one it had kept."""
    held: Step | None = here.__dict__.get("step")
    if held is not None:
        runner = runner or held.runs_runner
        scheduler = scheduler or held.runs_scheduler
    place = choose(runner=runner, scheduler=scheduler)(instrumentor)
    if held is not None:
        place.take_over(held)
    here.step = place
    if place.runs_runner:
        here.runner = place
    if place.runs_scheduler:
        here.scheduler = place
    return place


def runner_thread(instrumentor: _base.BaseInstrumentor) -> RunnerPlace:
    """This thread's topology, chosen on its first model runner hook."""
    return cast("RunnerPlace", _move(instrumentor, runner=True, scheduler=False))


def scheduler_thread(instrumentor: _base.BaseInstrumentor) -> SchedulerPlace:
    """This thread's topology, chosen on its first scheduler hook."""
    return cast("SchedulerPlace", _move(instrumentor, runner=False, scheduler=True))


def forget_thread() -> None:
    """Drop this thread's topology; its deferred cycles are settled as sampled."""
    held: Step | None = None
    for name in ("step", "runner", "scheduler"):
        held = here.__dict__.pop(name, None) or held
    while held is not None and held.pending:
        try:
            settle_as_sampled(held.pending.popleft())
        except Exception:
            failed("the cycle end (uninstrument)")
