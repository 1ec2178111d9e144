"""vLLM: a ``vllm.general_plugins`` plugin timing every speculative step of the model runner.

Turn it on with ``SPECOBS_VLLM=1`` (``pip install specobs`` registers the entry point). vLLM's
``load_general_plugins()`` runs :func:`vllm_plugin` in every process it starts (API server,
engine core, workers, a model-inspection subprocess). The plugin imports nothing of vLLM: it
registers post-import hooks, and the runner classes are patched, in place and restorably, when
vLLM itself imports them -- which only the processes that run the model do (the scheduler's
``update_from_output`` too, where vLLM imports the scheduler: one wrapper call per step there).

Up to 0.33 vLLM has two model runners, and which one a worker builds is decided at run time
(``VllmConfig.use_v2_model_runner``: V2 is the default for speculative decoding whenever Triton
is usable); 0.34 deleted V1. specobs instruments both, and checks the runner the worker built
(``Worker.load_model``): anything else logs one warning and exports
``specobs_info{integration="unsupported"}``. The declared hook points
(:mod:`specobs.instrument._package_vllm`), checked against the installed vLLM before anything is
patched, decide whether it attaches; the seams a runner class has decide its hooks
(:func:`runner_hooks`).

Seams, read from the pinned releases (0.33.0 and 0.34.0) -- see docs/integrations.md for what
each phase covers:

- **V2** (``vllm.v1.worker.gpu.model_runner.GPUModelRunner``): ``execute_model`` runs the target
  forward over each request's last token and drafts (**verify** starts); ``sample_tokens`` calls
  ``sample()`` (the rejection sampler, returning ``(sampler_output, num_sampled,
  num_rejected)``), then the host-side output and state update (**bookkeeping**, from where
  ``sample()`` returns to where ``postprocess_sampled()`` returns), then
  ``self.speculator.propose(...)`` for the next step (**draft**, to the end of
  ``sample_tokens``). Accepted drafts per request are ``num_sampled - 1``, on the GPU; drafts per
  request are ``input_batch.num_draft_tokens_per_req``, on the host.
- **V1** (``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, and the CPU build's
  ``CPUModelRunner``): ``execute_model`` (**verify**), ``sample_tokens`` -> ``_sample`` (the
  rejection sampler), ``propose_draft_token_ids`` (**draft**) and ``_bookkeeping_sync``
  (**bookkeeping**), drafting before or after bookkeeping as the speculative config says
  (:func:`v1_phase_order`). Accepted drafts per request: sampled tokens that are not
  ``PLACEHOLDER_TOKEN_ID`` (-1), minus the bonus token.
- Drafts a grammar rejected after the step was launched (async scheduling with structured
  outputs) are not counted as drafted, as vLLM's scheduler does not count them
  (:func:`valid_draft_lengths`).
- Under a batch-size schedule of k (``num_speculative_tokens_per_batch_size``) a band may draft
  nothing: a step that decodes at least one request without drafts is a plain step, marked by
  the engine core (:func:`around_schedule`, :data:`PLAIN_ATTRIBUTE`) and recorded as a cycle
  with draft length 0. Each cycle's draft length is the k the step drafts for the next one
  (``num_spec_tokens_to_schedule``); the drafts it verifies, and so its acceptance, are the
  previous step's.
- Per request, the engine core adds up the rows vLLM counts (``make_spec_decoding_stats``, as
  vLLM's own ``--per-request-spec-decode-metrics`` does) and reports a request's drafted and
  accepted tokens when the step that finishes it is settled (``Observer.request_finished``).
- A step is a cycle when the scheduler sent draft tokens to verify
  (``scheduler_output.scheduled_spec_decode_tokens``), or is a plain step. Its times end when
  ``sample_tokens`` returns (or when ``execute_model`` returns an output itself, as releases
  before the split did); its counts are the rows vLLM's ``Scheduler.update_from_output``
  counts in the engine core, which skips the rows of requests aborted (or finished) while the
  step was in flight. Where those counts reach the cycle depends on where the worker runs; each
  thread's topology is an object chosen on the first hook that runs there
  (:mod:`specobs.instrument._vllm_topologies`), which the hooks below call without asking
  which one it is.
- Topology of the process: the TP rank 0 of the last pipeline stage of each data-parallel
  replica records (other ranks see no sampling); replicas carry ``dp_rank`` and use
  port + ``dp_rank``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specobs._config import env_flag
from specobs.instrument import _base
from specobs.instrument._package_vllm import PACKAGE
from specobs.instrument._vllm_reads import PLACEHOLDER_TOKEN_ID as PLACEHOLDER_TOKEN_ID
from specobs.instrument._vllm_reads import (
    PLAIN_ATTRIBUTE,
    V2_PHASES,
    counted_row,
    decodes,
    drafted_length,
    host_rows,
    is_plain,
    row_request,
    speculates,
    topology,
    v1_accepted,
    v1_phase_order,
    v2_accepted,
    valid_draft_lengths,
)
from specobs.instrument._vllm_reads import HostRow as HostRow
from specobs.instrument._vllm_reads import host_counts as host_counts
from specobs.instrument._vllm_reads import kept_tokens as kept_tokens
from specobs.instrument._vllm_step import AsSampled, Counted, Deferred, settle_with
from specobs.instrument._vllm_step import Step as _Step
from specobs.instrument._vllm_step import failed as _failed
from specobs.instrument._vllm_topologies import COUNTED_ATTRIBUTE as COUNTED_ATTRIBUTE
from specobs.instrument._vllm_topologies import STEP_ATTRIBUTE as STEP_ATTRIBUTE
from specobs.instrument._vllm_topologies import (
    SchedulerPlace,
    forget_thread,
    runner_thread,
    scheduler_thread,
)
from specobs.instrument._vllm_topologies import here as _here

if TYPE_CHECKING:
    from specobs import Observer

__all__ = ["SPECOBS_VLLM", "VllmInstrumentor", "vllm_plugin"]

SPECOBS_VLLM = "SPECOBS_VLLM"
"""``1`` turns the vLLM plugin on (default off: installing specobs changes nothing)."""

RUNNER_CLASS = "GPUModelRunner"
V1_MODULE = "vllm.v1.worker.gpu_model_runner"
"""Model runner V1 (and, through subclassing, the CPU build's runner)."""
V2_MODULE = "vllm.v1.worker.gpu.model_runner"
"""Model runner V2, the default for speculative decoding since vLLM 0.33."""
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
WORKER_CLASS = "Worker"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
SCHEDULER_CLASS = "Scheduler"
"""Where the engine core takes a step's output (``update_from_output``) and skips the rows of
requests aborted while the step ran."""
RUNNER_MODULE = V1_MODULE  # the name earlier releases of specobs exported

_log = logging.getLogger("specobs.instrument")


def _enabled() -> bool:
    return env_flag(SPECOBS_VLLM)


def _step() -> _Step | None:
    """This thread's topology object, ``None`` before a hook ran on the thread."""
    return _here.__dict__.get("step")


def _settle_with(entry: Deferred, counts: Counted) -> None:
    """Settle a deferred cycle with the engine core's counts of its step (see ``settle_with``)."""
    settle_with(entry, counts, VllmInstrumentor())


# -- the runner's hooks ----------------------------------------------------------------------


def _make_execute_model(
    phases_of: Callable[[Any], tuple[str, ...]], integration: str
) -> Callable[..., Any]:
    def around_execute_model(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The target forward: a speculative step's cycle starts here, in the verify phase."""
        step = _here.__dict__.get("runner")
        if step is None:
            step = runner_thread(VllmInstrumentor())
        if step.off or kwargs.get("dummy_run"):
            return original(*args, **kwargs)
        try:
            runner = args[0]
            scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
            step.before_step(scheduler_output)
            drafts = scheduler_output.scheduled_spec_decode_tokens
            if runner.speculative_config is not None and (drafts or is_plain(scheduler_output)):
                batch = getattr(scheduler_output, "num_scheduled_tokens", None) or drafts
                step.start(runner, len(batch), phases_of(runner), integration,
                           drafted_length(runner, scheduler_output))  # fmt: skip
                step.scheduled = scheduler_output
                if not drafts:
                    # Nothing to verify: every row's draft length is 0 (V1's host rows read it).
                    step.draft_length = [0] * len(batch)
        except Exception:
            _failed("the cycle start (execute_model)")
        try:
            result = original(*args, **kwargs)
        except BaseException:
            step.abort()
            raise
        if result is not None and step.tracker is not None:
            try:
                step.end()  # sampled inside execute_model, or nothing to sample here
            except Exception:
                _failed("the cycle end (execute_model)")
        return result

    return around_execute_model


def _v1_phases(runner: Any) -> tuple[str, ...]:
    return v1_phase_order(runner.speculative_config)


def _v2_phases(runner: Any) -> tuple[str, ...]:
    return V2_PHASES


around_execute_model_v1 = _make_execute_model(_v1_phases, "vllm_v1")
around_execute_model_v2 = _make_execute_model(_v2_phases, "vllm_v2")


_Reader = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], None]


def _after_original(what: str) -> Callable[[_Reader], Callable[..., Any]]:
    """A hook that calls the original, then ``read(step, result, args, kwargs)`` when a traced
    step is under way; a failure of ``read`` is logged once as ``what``, never raised into the
    engine. The hook takes the reader's name and docstring."""

    def make(read: _Reader) -> Callable[..., Any]:
        def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            step = _here.__dict__.get("runner")
            if step is not None and step.tracker is not None:
                try:
                    read(step, result, args, kwargs)
                except Exception:
                    _failed(what)
            return result

        hook.__name__ = hook.__qualname__ = read.__name__
        hook.__doc__ = read.__doc__
        return hook

    return make


@_after_original("acceptance (_sample)")
def around_sample_v1(step: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """V1's rejection sampler: still verify; acceptance per request is read from its output."""
    metadata = args[2] if len(args) > 2 else kwargs.get("spec_decode_metadata")
    if metadata is not None:
        # Computed only if no count of vLLM's replaces it (the host rows, most often).
        step.accepted = AsSampled(v1_accepted, result.sampled_token_ids)
        step.req_ids = args[0].input_batch.req_ids
        step.draft_length = valid_draft_lengths(
            list(metadata.num_draft_tokens), step.req_ids, step.scheduled, step.grammar,
        )  # fmt: skip


@_after_original("acceptance (sample)")
def around_sample_v2(step: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """V2's ``sample()``: verify ends where it returns; bookkeeping starts."""
    input_batch = args[2] if len(args) > 2 else kwargs["input_batch"]
    drafts = input_batch.num_draft_tokens_per_req
    if drafts is not None:
        # Computed only if no count of vLLM's replaces it (a deferred step's, most often).
        step.accepted = AsSampled(v2_accepted, result[1])
        grammar = args[3] if len(args) > 3 else kwargs.get("grammar_output")
        step.req_ids = getattr(input_batch, "req_ids", None)
        step.draft_length = valid_draft_lengths(
            [int(d) for d in drafts], step.req_ids, step.scheduled, grammar,
        )  # fmt: skip
    step.tracker.enter("bookkeeping")


@_after_original("the draft phase start (postprocess_sampled)")
def around_postprocess_sampled(
    step: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """V2's request-state update: bookkeeping ends where it returns; the draft starts."""
    step.tracker.enter("draft")


def _around_phase(phase: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        step = _here.__dict__.get("runner")
        if step is not None and step.tracker is not None:
            try:
                step.tracker.enter(phase)
            except Exception:
                _failed(f"the {phase} phase start")
        return original(*args, **kwargs)

    return hook


around_propose_draft_token_ids = _around_phase("draft")
_enter_bookkeeping = _around_phase("bookkeeping")


def around_bookkeeping_sync(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """V1's host-side update (**bookkeeping**). Without async scheduling it returns every
    request's sampled tokens as host lists: acceptance is read from those (no device copy), the
    rows still in chunked prefill are left out of the batch, and the tokens the scheduler will
    cut (``max_tokens``, EOS, stop tokens) are not counted as emitted."""
    result = _enter_bookkeeping(original, *args, **kwargs)
    step = _here.__dict__.get("runner")
    if step is not None and step.tracker is not None and step.draft_length is not None:
        try:
            valid = result[3] if type(result) is tuple and len(result) > 3 else None
            if type(valid) is list:
                rows = host_rows(args[0], valid, step.draft_length)
                if rows is not None:
                    step.take_rows(rows)
        except Exception:
            _failed("acceptance (_bookkeeping_sync)")
    return result


def around_sample_tokens(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Sampling, bookkeeping and drafting of the step; the cycle ends when it returns, where
    the thread's topology ends it."""
    step = _here.__dict__.get("runner")
    if step is not None and step.tracker is not None:
        step.grammar = args[1] if len(args) > 1 else kwargs.get("grammar_output")
    try:
        result = original(*args, **kwargs)
    except BaseException:
        step = _here.__dict__.get("runner")
        if step is not None:
            step.abort()
        raise
    step = _here.__dict__.get("runner")
    if step is not None and step.tracker is not None:
        try:
            step.sampled()
        except Exception:
            _failed("the cycle end (sample_tokens)")
    return result


# -- the scheduler's hooks (the engine core) -------------------------------------------------


def around_schedule(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The engine core schedules a step (known before its first step runs). An output without
    drafts that decodes is marked a plain step; the thread's topology may tag it for a worker
    elsewhere (``EngineCore.on_schedule``)."""
    step: SchedulerPlace | None = _here.__dict__.get("scheduler")
    if step is None:
        step = scheduler_thread(VllmInstrumentor())
    output = original(*args, **kwargs)
    try:
        scheduler = args[0]
        if (
            not output.scheduled_spec_decode_tokens
            and output.num_scheduled_tokens
            and speculates(scheduler)
            and decodes(scheduler, output)
        ):
            setattr(output, PLAIN_ATTRIBUTE, True)
    except Exception:
        _failed("the plain step mark (schedule)")
    step.on_schedule(output)
    return output


def around_update_from_output(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The engine core takes a step's output. Where the thread's topology says this call
    settles a step, what vLLM counts of it (:func:`_counted_by_vllm`) goes to the topology."""
    step: SchedulerPlace | None = _here.__dict__.get("scheduler")
    if step is None:
        step = scheduler_thread(VllmInstrumentor())
    taken = step.settles(args, kwargs)
    if taken is None:
        return original(*args, **kwargs)
    try:
        out, counts = _counted_by_vllm(step, original, args, kwargs)
    except BaseException:
        step.lost(taken)
        raise
    step.counted(taken, counts)
    return out


# -- what the engine core counts -------------------------------------------------------------


def counting_rows(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.make_spec_decoding_stats`` wrapped: vLLM's scheduler calls it once per row of
    a speculative step it counts, inside ``update_from_output``. While the engine core counts a
    step for a worker of its own, the row is kept as vLLM counts it: its drafts less those a
    grammar rejected, its accepted drafts (:func:`counted_row`). A plain closure, not
    :func:`~specobs.instrument._base.wrap_around`: it runs once per row on the engine core's
    thread, so it skips the generic wrapper's extra call."""

    @functools.wraps(original)
    def make_spec_decoding_stats(*args: Any, **kwargs: Any) -> Any:
        step = _here.__dict__.get("scheduler")
        if step is not None and step.collect is not None:
            try:
                row = counted_row(args, kwargs)
                if row is not None:
                    step.collect.append((*row, row_request(args, kwargs)))
            except Exception:
                _failed("a counted row (make_spec_decoding_stats)")
        return original(*args, **kwargs)

    make_spec_decoding_stats.__specobs_hook__ = counting_rows  # type: ignore[attr-defined]
    return make_spec_decoding_stats


_MAX_REQUESTS = 1 << 16
"""Running requests whose figures the engine core keeps at most; past it, those vLLM no longer
holds (aborted: they never finish with an output) are forgotten."""


def _finished_requests(step: _Step, scheduler: Any, rows: list[tuple[int, int, Any]],
                       ended: list[Any]) -> list[tuple[int, int]]:
    """Add a step's counted rows to their requests' figures; return and forget the figures of
    the requests the step finished (``ended``: those whose output has a finish reason), as
    vLLM's own per-request metrics count them (``RequestSpecDecodeMetrics``: every verify
    step's drafts, less those a grammar rejected, and accepted drafts)."""
    requests = step.requests
    for drafted, accepted, request_id in rows:
        if request_id is not None:
            figures = requests.setdefault(request_id, [0, 0])
            figures[0] += drafted
            figures[1] += accepted
    finished: list[tuple[int, int]] = []
    for request_id in ended:
        if request_id in requests:
            drafted, accepted = requests.pop(request_id)
            finished.append((drafted, accepted))
    if len(requests) > _MAX_REQUESTS:
        held = getattr(scheduler, "requests", None) or {}
        for request_id in [r for r in requests if r not in held]:
            del requests[request_id]
    return finished


def _counted_by_vllm(
    step: SchedulerPlace, original: Callable[..., Any], args: Any, kwargs: Any
) -> tuple[Any, tuple[list[int], list[int], int, int, list[tuple[int, int]]] | None]:
    """Run ``update_from_output`` and keep what it counted of the step: vLLM's own rows
    (:func:`counting_rows`: drafts per counted draft, accepted per counted draft), the rows it
    handed tokens, the tokens it handed on, and the figures of the requests it finished
    (:func:`_finished_requests`). Returns its result and those counts (``None`` when they could
    not be read)."""
    rows: list[tuple[int, int, Any]] = []
    step.collect = rows
    try:
        out = original(*args, **kwargs)
    finally:
        step.collect = None
    try:
        scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
        scheduled = scheduler_output.num_scheduled_tokens
        handed = emitted = 0
        ended: list[Any] = []
        for outputs in out.values():
            for output in outputs.outputs:
                n = len(output.new_token_ids or ())
                if n and output.request_id in scheduled:
                    handed += 1
                    emitted += n
                if getattr(output, "finish_reason", None) is not None:
                    ended.append(output.request_id)
        finished = _finished_requests(step, args[0], rows, ended)
        return out, ([r[0] for r in rows], [r[1] for r in rows], handed, emitted, finished)
    except Exception:
        _failed("the counted rows (update_from_output)")
        return out, None


# -- the hook tables ---------------------------------------------------------------------------


HOOKS_V1: dict[str, Callable[..., Any]] = {
    "execute_model": around_execute_model_v1,
    "_sample": around_sample_v1,
    "propose_draft_token_ids": around_propose_draft_token_ids,
    "_bookkeeping_sync": around_bookkeeping_sync,
    "sample_tokens": around_sample_tokens,
}
"""Model runner V1 method -> AROUND hook ``hook(original, *args, **kwargs)``."""

HOOKS_V2: dict[str, Callable[..., Any]] = {
    "execute_model": around_execute_model_v2,
    "sample": around_sample_v2,
    "postprocess_sampled": around_postprocess_sampled,
    "sample_tokens": around_sample_tokens,
}
"""Model runner V2 method -> AROUND hook."""

HOOKS = HOOKS_V1  # the name earlier releases of specobs exported

RUNNERS: dict[str, dict[str, Callable[..., Any]]] = {V1_MODULE: HOOKS_V1, V2_MODULE: HOOKS_V2}
"""Module of each instrumented ``GPUModelRunner`` -> its hooks."""

INTEGRATIONS = {V1_MODULE: "vllm_v1", V2_MODULE: "vllm_v2"}

OPTIONAL_SEAMS = frozenset({"sample_tokens"})
"""Seams a runner may lack (releases that sample inside ``execute_model``: the cycle ends there)."""


def runner_hooks(module: str, runner: type) -> dict[str, Callable[..., Any]]:
    """The hooks ``module``'s runner class gets, chosen from the seams it has: V1's or V2's
    table, less the optional seams it lacks. ``ValueError`` naming what is missing when
    ``module`` is no runner specobs times or the class lacks a seam the hooks need."""
    table = RUNNERS.get(module)
    if table is None:
        raise ValueError(
            f"{module} is not a model runner module specobs times; expected one of "
            f"{', '.join(RUNNERS)}"
        )
    missing = [m for m in table if m not in OPTIONAL_SEAMS and not hasattr(runner, m)]
    if missing:
        raise ValueError(
            f"{module}.{runner.__qualname__} has no {', '.join(missing)}; specobs times this "
            f"runner through {', '.join(table)}"
        )
    return {method: hook for method, hook in table.items() if hasattr(runner, method)}


# -- the plugin and the instrumentor -----------------------------------------------------------


def vllm_plugin() -> None:
    """The ``vllm.general_plugins`` entry point: instruments the runners when SPECOBS_VLLM=1.

    vLLM calls it several times per process and in every process; it imports nothing of vLLM
    (the runners are patched when vLLM imports them), and the observer is built on the first
    speculative step, in the worker process only. It never raises: vLLM does not guard plugins.
    """
    try:
        if not _enabled():
            return
        VllmInstrumentor().instrument()
    except Exception:
        _log.exception("specobs could not instrument vLLM; vLLM runs unchanged.")


class VllmInstrumentor(_base.BaseInstrumentor):
    """Patches vLLM's model runners V1 and V2 when vLLM imports them; ``uninstrument`` restores."""

    package = PACKAGE
    integration = "vllm"  # observers built on a step say which runner: vllm_v1 or vllm_v2

    def instrument(self, *, observer: Observer | None = None, skip_dep_check: bool = False) -> bool:
        """Patch the runners (now if vLLM imported them, else when it does).

        ``False`` (one warning) when the vLLM version is unsupported. With an ``observer`` its
        phase order must be the one of the runner the engine builds (:data:`V2_PHASES`, or
        :func:`v1_phase_order`); without one an observer is built from SPECOBS_* on the first
        speculative step, in that order.
        """
        return self._instrument_checked(observer, skip_dep_check)

    def _instrument(self) -> None:
        self._watch((*RUNNERS, WORKER_MODULE, SCHEDULER_MODULE))

    def _patch_module(self, module: Any) -> None:
        name = module.__name__
        if name in RUNNERS:
            runner = getattr(module, RUNNER_CLASS)
            for method, hook in runner_hooks(name, runner).items():
                self._patch_around(runner, method, hook)
        elif name == WORKER_MODULE:
            worker = getattr(module, WORKER_CLASS)
            self._patch_around(worker, "load_model", _check_runner)
        elif name == SCHEDULER_MODULE:
            scheduler = getattr(module, SCHEDULER_CLASS)
            self._patch_around(scheduler, "update_from_output", around_update_from_output)
            if hasattr(scheduler, "make_spec_decoding_stats"):
                self._patch(scheduler, "make_spec_decoding_stats", counting_rows)
            if "schedule" in vars(scheduler):
                self._patch_around(scheduler, "schedule", around_schedule)

    def _uninstrument(self) -> None:
        forget_thread()

    def runner_integration(self, runner: Any) -> str | None:
        """``vllm_v1`` / ``vllm_v2`` when ``runner`` is one specobs times, else ``None``."""
        for cls in type(runner).__mro__:
            module = cls.__module__
            patched = module in RUNNERS and module in self._patched_modules
            if patched and cls.__name__ == RUNNER_CLASS:
                # A subclass that overrides a seam without calling it would run unobserved.
                for method, hook in RUNNERS[module].items():
                    bound = getattr(type(runner), method, None)
                    if bound is not None and _base.hook_of(bound) is not hook:
                        return None
                return INTEGRATIONS[module]
        return None


def _check_runner(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """After ``Worker.load_model``: say which runner is timed, or warn that none is."""
    result = original(*args, **kwargs)
    try:
        worker = args[0]
        runner = getattr(worker, "model_runner", None)
        config = getattr(worker, "vllm_config", None) or getattr(runner, "vllm_config", None)
        if runner is not None and getattr(config, "speculative_config", None) is not None:
            instrumentor = VllmInstrumentor()
            kind = instrumentor.runner_integration(runner)
            cls = type(runner)
            name = f"{cls.__module__}.{cls.__qualname__}"
            if kind is None:
                instrumentor.report_unsupported(
                    f"this worker built {name}, a model runner specobs does not instrument",
                    "vLLM runs unchanged. specobs times vLLM's GPUModelRunner (model runner "
                    "V2, the only one from vLLM 0.34; V1 too on earlier releases) and the CPU "
                    "build's CPUModelRunner, which subclasses it; see docs/integrations.md.",
                    topology=topology(runner),
                )
            else:
                _log.info("specobs times vLLM's model runner %s (%s)", kind[-2:].upper(), name)
    except Exception:
        _failed("the model runner check (Worker.load_model)")
    return result
