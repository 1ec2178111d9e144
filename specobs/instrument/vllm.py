"""vLLM: a ``vllm.general_plugins`` plugin timing every speculative step of the model runner.

Turn it on with ``SPECOBS_VLLM=1`` (``pip install specobs`` registers the entry point). vLLM's
``load_general_plugins()`` runs :func:`vllm_plugin` in every process it starts (API server,
engine core, workers, a model-inspection subprocess). The plugin imports nothing of vLLM: it
registers post-import hooks, and the runner classes are patched, in place and restorably, when
vLLM itself imports them -- which only the processes that run the model do (the scheduler's
``update_from_output`` too, where vLLM imports the scheduler: one wrapper call per step there).

Up to 0.33 vLLM has two model runners, and which one a worker builds is decided at run time
(``VllmConfig.use_v2_model_runner``; model runner V2 is the default for eagle, eagle3, ngram,
draft_model and mtp whenever Triton is usable, already in 0.32.0); 0.34 deleted V1, and V2 is
the only runner, on the CPU too. specobs instruments both, and checks the runner the worker
actually built (``Worker.load_model``): anything else logs one warning and exports
``specobs_info{integration="unsupported"}``. Whether it attaches at all is decided by the
declared hook points (:mod:`specobs.instrument._package_vllm`), checked against the installed
vLLM before anything is patched, not by a version ceiling.

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
  (**bookkeeping**). Drafters that run a model forward (EAGLE, draft models, the GPU n-gram)
  propose before bookkeeping; the others (n-gram on the host, suffix) after it. The order is read
  from the speculative config, so the first step is recorded like every other. Accepted drafts
  per request: sampled tokens that are not ``PLACEHOLDER_TOKEN_ID`` (-1), minus the bonus token.
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
  counts, in the engine core, which skips the rows of requests aborted (or finished) while the
  step was in flight:
  - the worker on the engine core's own thread without async scheduling (one worker,
    ``UniProcExecutor``): the cycle stays open until that thread's ``update_from_output``
    begins, and is settled with the rows it counts, as ``make_spec_decoding_stats`` observes
    them (:func:`around_update_from_output`);
  - on that thread with async scheduling (or model runner V2), where the next step begins
    before this one's output is taken: the cycle ends at ``sample_tokens`` with its acceptance
    deferred and is settled there with the rows vLLM counts;
  - a worker in a process of its own (``MultiprocExecutor``: tensor parallelism, pipeline
    stages, the CPU build's OpenAI server; Ray): the cycle ends at ``sample_tokens`` deferred;
    the engine core numbers each scheduler output it sends (:func:`around_schedule`), keeps
    what ``update_from_output`` counted of each speculative step -- vLLM's own rows, as
    ``make_spec_decoding_stats`` observes them, and the tokens it handed on -- and puts it on
    the next scheduler output, which vLLM pickles to the workers; the worker settles the cycle
    when that output arrives (:func:`_settle_counted`). The engine core records nothing itself:
    the worker's process alone exports, as before.
- Topology: the TP rank 0 of the last pipeline stage of each data-parallel replica records
  (other ranks see no sampling); replicas carry ``dp_rank`` and use port + ``dp_rank``.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specobs._config import env_flag
from specobs.instrument import _base
from specobs.instrument._package_vllm import PACKAGE

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

PLACEHOLDER_TOKEN_ID = -1
"""What vLLM's V1 rejection sampler writes where a draft token was rejected."""

V2_PHASES = ("verify", "bookkeeping", "draft")
"""Model runner V2 always updates its state before it proposes the next drafts."""

_failed = _base.LogOnce()
_log = logging.getLogger("specobs.instrument")


def _enabled() -> bool:
    return env_flag(SPECOBS_VLLM)


def v1_phase_order(spec_config: Any) -> tuple[str, ...]:
    """The order V1's ``sample_tokens`` runs the phases in, from the speculative config.

    Mirrors the branch in ``GPUModelRunner.sample_tokens``: a drafter that runs a model forward
    (or the GPU n-gram) reads the sampled tokens on the device and proposes before bookkeeping,
    unless ``disable_padded_drafter_batch``; every other drafter needs the host tokens and runs
    after it.
    """

    def flag(name: str) -> bool:
        fn = getattr(spec_config, name, None)
        try:
            return bool(fn()) if callable(fn) else False
        except Exception:
            return False

    if getattr(spec_config, "disable_padded_drafter_batch", False):
        return ("verify", "bookkeeping", "draft")
    forward = (
        flag("use_eagle") or flag("uses_draft_model") or flag("uses_extract_hidden_states")
    )
    if not forward and not any(
        hasattr(spec_config, n) for n in ("use_eagle", "uses_draft_model")
    ):
        # A config without the predicates (older releases): decide by the method's name.
        method = str(getattr(spec_config, "method", "") or "")
        forward = method not in ("ngram", "suffix", "")
    if forward or flag("use_ngram_gpu"):
        return ("verify", "draft", "bookkeeping")
    return ("verify", "bookkeeping", "draft")


def topology(runner: Any) -> _base.Topology:
    """Where this runner's process sits: TP rank, last pipeline stage, data-parallel replica."""
    tp_rank = pp_rank = 0
    tp_size = 1
    last_stage = True
    try:
        from vllm.distributed import parallel_state

        tp = parallel_state.get_tp_group()
        pp = parallel_state.get_pp_group()
        tp_rank, tp_size = int(tp.rank_in_group), int(tp.world_size)
        pp_rank, last_stage = int(pp.rank_in_group), bool(pp.is_last_rank)
    except Exception:
        last_stage = bool(getattr(runner, "is_last_pp_rank", True))
    parallel = getattr(runner, "parallel_config", None)
    replicas = int(getattr(parallel, "data_parallel_size", 1) or 1)
    replica = int(getattr(parallel, "data_parallel_rank", 0) or 0) if replicas > 1 else None
    return _base.Topology(
        leader=last_stage and tp_rank == 0,
        rank=pp_rank * tp_size + tp_rank,
        replica=replica,
        replicas=replicas,
    )


class _Step:
    """The per-thread state of the runner's step in flight (and, on the engine core's thread,
    of the scheduler's steps whose counts go to a worker of its own)."""

    __slots__ = (
        "accepted", "batch_size", "collect", "counted", "draft_length", "emitted", "grammar",
        "key", "next_step", "off", "pending", "req_ids", "requests", "rows", "runner_here",
        "scheduled", "scheduler_here", "tracker", "waits",
    )  # fmt: skip

    def __init__(self) -> None:
        self.tracker: _base.PhaseTracker | None = None
        # Cycles deferred at sample_tokens, oldest first, awaiting the counts of their step:
        # from this thread's update_from_output (the engine core's thread: async scheduling, or
        # no host rows), or from the engine core's tags on a later scheduler output (a worker
        # of its own).
        self.pending: collections.deque[_Deferred] = collections.deque()
        # This thread runs the scheduler's update_from_output (the engine core's thread).
        self.scheduler_here = False
        # This thread runs a model runner (the engine core's thread too: one worker in it).
        self.runner_here = False
        self.off = False  # this process does not record (not the leader, or a failed start)
        # The engine core's thread, its worker elsewhere: the number the next scheduler output
        # is tagged with, what update_from_output counted of the speculative steps since the
        # last schedule (for the next one to carry), and the rows of the update in progress.
        self.next_step = 0
        self.counted: list[Counted] = []
        self.collect: list[tuple[int, int, Any]] | None = None
        # The engine core's thread: per request still running, [drafted, accepted] as vLLM's
        # scheduler counted its rows (its per-request figures), until the request finishes.
        self.requests: dict[Any, list[int]] = {}
        self.clear()

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
        # The open cycle waits for this thread's update_from_output to take the step's output.
        self.waits = False
        # The runner's request ids of the step, in its row order.
        self.req_ids: Any = None
        # The engine core's number of the step (its tag on the scheduler output), when it will
        # send the step's counts: the key of the deferred cycle.
        self.key: int | None = None


_local = threading.local()


def _step() -> _Step:
    step = _local.__dict__.get("step")
    if step is None:
        step = _local.step = _Step()
    return step


class _AsSampled:
    """The step's acceptance as the runner sampled it, on the GPU: computed (a few tiny
    kernels queued on the runner's stream, no sync) only where specobs counts it, not on every
    step. Wherever vLLM's own counts reach specobs (the host rows of ``_bookkeeping_sync``, a
    deferred step's ``update_from_output``, the engine core's counts for a worker of its own)
    nothing is launched: on an H200 host these kernels cost the runner 15-25 us a step
    (benchmarks/acceptance_paths.py), several times the acceptance copy itself."""

    __slots__ = ("fn", "tensor")

    def __init__(self, fn: Callable[[Any], Any], tensor: Any) -> None:
        self.fn = fn
        self.tensor = tensor

    def __call__(self) -> Any:
        return self.fn(self.tensor)


def _v1_accepted(sampled: Any) -> Any:
    """V1: valid tokens per request minus the bonus token."""
    return ((sampled != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1).clamp_(min=0)


def _v2_accepted(num_sampled: Any) -> Any:
    """V2: sampled tokens are the accepted drafts plus the bonus token (0 for a request still
    in chunked prefill)."""
    return (num_sampled - 1).clamp_(min=0)


def _as_sampled(accepted: Any) -> Any:
    return accepted() if type(accepted) is _AsSampled else accepted


def _finish(step: _Step) -> None:
    tracker = step.tracker
    if tracker is not None:
        step.tracker = None
        if step.accepted is not None:
            tracker.accept(_as_sampled(step.accepted), step.draft_length, step.batch_size,
                           step.emitted)  # fmt: skip
        tracker.finish()
    step.clear()


def _end(step: _Step) -> None:
    """End the step's cycle where no scheduler on this thread takes its output: deferred when
    the engine core tagged the step (it sends the counts), else with the counts as sampled."""
    if step.key is not None:
        _defer(step)
    else:
        _finish(step)


def _abort(step: _Step | None) -> None:
    if step is not None and step.tracker is not None:
        step.tracker.abort()
        step.tracker = None
        step.rows = None
        step.waits = False


def _start(
    step: _Step, runner: Any, batch_size: int, phases: tuple[str, ...], integration: str,
    draft_length: int | None = None,
) -> None:
    instrumentor = VllmInstrumentor()
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
        step.off = True
        return
    tracker = _base.PhaseTracker(observer)
    tracker.start(batch_size, draft_length)
    step.tracker = tracker


PLAIN_ATTRIBUTE = "specobs_plain"
"""Set by the engine core on a ``SchedulerOutput`` that schedules no drafts but decodes at least
one request (:func:`around_schedule`): a plain decode step under the speculative config -- a
batch-size band with k = 0 in ``num_speculative_tokens_per_batch_size`` -- which specobs records
as a cycle with draft length 0."""


def is_plain(scheduler_output: Any) -> bool:
    """Whether the engine core marked this scheduler output a plain decode step."""
    return getattr(scheduler_output, PLAIN_ATTRIBUTE, False) is True


def decodes(scheduler: Any, scheduler_output: Any) -> bool:
    """Whether a scheduler output without drafts decodes at least one request: a request that
    already has output tokens (or placeholders for them, with async scheduling) and is scheduled
    for exactly one token. A prefill chunk -- the prompt's last included, whose sampled token is
    the request's first -- and the recomputation of a preempted request are not decode rows."""
    requests = scheduler.requests
    for req_id, n in scheduler_output.num_scheduled_tokens.items():
        if n != 1:
            continue
        request = requests.get(req_id)
        if request is None:
            continue
        outputs = request.num_output_tokens + int(
            getattr(request, "num_output_placeholders", 0) or 0
        )
        if outputs > 0:
            return True
    return False


def drafted_length(runner: Any, scheduler_output: Any) -> int | None:
    """The k the step drafts for the next one: the scheduler's pick under a batch-size schedule
    (``num_spec_tokens_to_schedule``, vLLM 0.32 and later), else the configured
    ``num_speculative_tokens``. The drafts a step verifies are the previous step's, so the two
    differ where the batch crosses a band of the schedule."""
    k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
    if k is None:
        k = getattr(runner.speculative_config, "num_speculative_tokens", None)
    return k if type(k) is int and k >= 0 else None


def _make_execute_model(
    phases_of: Callable[[Any], tuple[str, ...]], integration: str
) -> Callable[..., Any]:
    def around_execute_model(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The target forward: a speculative step's cycle starts here, in the verify phase."""
        step = _step()
        step.runner_here = True
        if step.off or kwargs.get("dummy_run"):
            return original(*args, **kwargs)
        try:
            runner = args[0]
            scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
            if step.pending and not step.scheduler_here:
                # A worker of its own: the engine core's counts of earlier steps ride on this
                # scheduler output (every output, the empty one after the last step included).
                try:
                    _settle_counted(step, scheduler_output)
                except Exception:
                    _failed("the engine core's counts (execute_model)")
            if step.tracker is not None:
                _end(step)  # the previous step never reached sample_tokens
            drafts = scheduler_output.scheduled_spec_decode_tokens
            if runner.speculative_config is not None and (drafts or is_plain(scheduler_output)):
                batch = getattr(scheduler_output, "num_scheduled_tokens", None) or drafts
                _start(step, runner, len(batch), phases_of(runner), integration,
                       drafted_length(runner, scheduler_output))  # fmt: skip
                step.scheduled = scheduler_output
                if not drafts:
                    # Nothing to verify: every row's draft length is 0 (V1's host rows read it).
                    step.draft_length = [0] * len(batch)
                if not step.scheduler_here:
                    step.key = getattr(scheduler_output, STEP_ATTRIBUTE, None)
        except Exception:
            _failed("the cycle start (execute_model)")
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _abort(step)
            raise
        if result is not None and step.tracker is not None:
            try:
                _end(step)  # sampled inside execute_model, or nothing to sample here
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
            step = _local.__dict__.get("step")
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
        step.accepted = _AsSampled(_v1_accepted, result.sampled_token_ids)
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
        step.accepted = _AsSampled(_v2_accepted, result[1])
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
        step = _local.__dict__.get("step")
        if step is not None and step.tracker is not None:
            try:
                step.tracker.enter(phase)
            except Exception:
                _failed(f"the {phase} phase start")
        return original(*args, **kwargs)

    return hook


around_propose_draft_token_ids = _around_phase("draft")
_enter_bookkeeping = _around_phase("bookkeeping")


def valid_draft_lengths(
    draft_lengths: list[int], req_ids: Any, scheduled: Any, grammar: Any
) -> list[int]:
    """Drafts per request as vLLM counts them: without those a grammar rejected.

    With async scheduling and structured outputs the scheduler validates a step's drafts only
    after the step was launched: it pads the rejected ones with -1 in its own scheduler output
    and subtracts them from what it counts (``Scheduler.update_draft_token_ids_in_output``,
    ``num_invalid_spec_tokens``, then ``make_spec_decoding_stats``); the runner still verifies
    the padded length. In the engine core's process (one worker) the runner's
    ``scheduler_output`` is that same object, so the count is vLLM's own. A worker in a process
    of its own gets a copy made before the padding; there the grammar output that
    ``sample_tokens`` receives says how many leading drafts of each structured request the
    grammar accepted (``num_acceptable_drafts``), which is the same number. Without structured
    outputs, or without async scheduling (drafts validated before they are scheduled), the
    lengths are returned as they are.
    """
    invalid = getattr(scheduled, "num_invalid_spec_tokens", None)
    if invalid is not None:  # the engine core's own count (an empty dict: none rejected)
        if not invalid or req_ids is None or len(req_ids) != len(draft_lengths):
            return draft_lengths
        pairs = zip(draft_lengths, req_ids, strict=True)
        return [max(d - int(invalid.get(r, 0)), 0) for d, r in pairs]
    ids = getattr(grammar, "structured_output_request_ids", None)
    acceptable = getattr(grammar, "num_acceptable_drafts", None)
    if not ids or acceptable is None or req_ids is None or len(req_ids) != len(draft_lengths):
        return draft_lengths
    cap = dict(zip(ids, acceptable, strict=False))
    pairs = zip(draft_lengths, req_ids, strict=True)
    return [min(d, int(cap[r])) if r in cap else d for d, r in pairs]


def _repetition_check() -> Callable[[Any, Any], bool] | None:
    """vLLM's own test for a repeating tail (``check_sequence_repetition``, 0.33), or ``None``
    where the running release has none."""
    try:
        from vllm.v1.core.sched.utils import check_sequence_repetition
    except Exception:
        return None
    return check_sequence_repetition  # type: ignore[no-any-return]


def kept_tokens(tokens: list[int], state: Any, max_model_len: int) -> int:
    """How many of one request's sampled ``tokens`` vLLM keeps: its scheduler appends them one
    by one and stops at the first that ends the request (``check_stop`` in
    ``vllm/v1/core/sched/utils.py``: the EOS token unless ``ignore_eos``, a stop token, the
    request's ``max_tokens``, the model's length, and once ``min_tokens`` are out a repeating
    tail where the request asked for ``repetition_detection``, tested by vLLM's own function),
    dropping the rest. ``state`` is the runner's ``CachedRequestState``, whose
    ``output_token_ids`` already hold ``tokens``."""
    params = getattr(state, "sampling_params", None)
    if params is None:
        return len(tokens)
    out = len(state.output_token_ids) - len(tokens)
    prompt = int(getattr(state, "num_prompt_tokens", 0) or 0)
    eos = params.eos_token_id
    stops = params.stop_token_ids or ()
    max_tokens = params.max_tokens
    repetition = getattr(params, "repetition_detection", None)
    repeats = _repetition_check() if repetition is not None else None
    min_tokens = int(getattr(params, "min_tokens", 0) or 0)
    for j, token in enumerate(tokens, 1):
        out += 1
        if token == eos or token in stops:
            return j
        if prompt + out >= max_model_len or (max_tokens is not None and out >= max_tokens):
            return j
        if repeats is not None and out >= min_tokens and repeats(
            state.output_token_ids[:out], repetition
        ):
            return j
    return len(tokens)


HostRow = tuple[Any, int, int, int]
"""One request that decoded in a step: (request id, accepted, drafted, tokens vLLM keeps)."""


def host_rows(
    runner: Any, valid: list[list[int]], draft_lengths: list[int]
) -> list[HostRow] | None:
    """The rows that decoded, from the host token lists ``_bookkeeping_sync`` returns (one list
    per request of the batch, empty for a request still in chunked prefill, whose sampled token
    vLLM discards): request id, accepted and drafted tokens, and the tokens vLLM keeps. ``None``
    when there are none (async scheduling keeps them on the GPU) or they do not match the
    batch."""
    if not valid or len(valid) != len(draft_lengths):
        return None
    req_ids = runner.input_batch.req_ids
    requests = runner.requests
    max_model_len = int(runner.max_model_len)
    rows: list[HostRow] = []
    for i, tokens in enumerate(valid):
        n = len(tokens)
        if not n:
            continue
        req_id = req_ids[i] if i < len(req_ids) else None
        state = requests.get(req_id) if req_id is not None else None
        kept = kept_tokens(tokens, state, max_model_len) if state is not None else n
        rows.append((req_id, n - 1, draft_lengths[i], kept))
    return rows


def host_counts(
    runner: Any, valid: list[list[int]], draft_lengths: list[int]
) -> tuple[list[int], list[int], int] | None:
    """Accepted and drafted tokens of the rows that decoded, and the tokens vLLM keeps
    (:func:`host_rows`, summed)."""
    rows = host_rows(runner, valid, draft_lengths)
    if rows is None:
        return None
    return [r[1] for r in rows], [r[2] for r in rows], sum(r[3] for r in rows)


def _take_rows(step: _Step, rows: list[HostRow]) -> None:
    step.rows = rows
    step.accepted = [r[1] for r in rows]
    step.draft_length = [r[2] for r in rows]
    step.emitted = sum(r[3] for r in rows)
    step.batch_size = len(rows)


def around_bookkeeping_sync(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """V1's host-side update (**bookkeeping**). Without async scheduling it returns every
    request's sampled tokens as host lists: acceptance is read from those (no device copy), the
    rows still in chunked prefill are left out of the batch, and the tokens the scheduler will
    cut (``max_tokens``, EOS, stop tokens) are not counted as emitted."""
    result = _enter_bookkeeping(original, *args, **kwargs)
    step = _local.__dict__.get("step")
    if step is not None and step.tracker is not None and step.draft_length is not None:
        try:
            valid = result[3] if type(result) is tuple and len(result) > 3 else None
            if type(valid) is list:
                rows = host_rows(args[0], valid, step.draft_length)
                if rows is not None:
                    _take_rows(step, rows)
        except Exception:
            _failed("acceptance (_bookkeeping_sync)")
    return result


def around_sample_tokens(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Sampling, bookkeeping and drafting of the step; the cycle ends when it returns."""
    step = _local.__dict__.get("step")
    if step is not None and step.tracker is not None:
        step.grammar = args[1] if len(args) > 1 else kwargs.get("grammar_output")
    try:
        result = original(*args, **kwargs)
    except BaseException:
        _abort(_local.__dict__.get("step"))
        raise
    step = _local.__dict__.get("step")
    if step is not None and step.tracker is not None:
        if step.scheduler_here and step.rows is not None:
            # The engine core's thread, no async scheduling: its update_from_output for this
            # step comes next, after it applied the aborts that arrived meanwhile.
            step.waits = True
        elif step.scheduler_here:
            # The engine core's thread without host rows (async scheduling: the next step may
            # be launched before this one's output is taken; or model runner V2): the times
            # are final, the rows vLLM counts are settled by its update_from_output.
            try:
                _defer(step)
            except Exception:
                _failed("the cycle end (sample_tokens)")
        else:
            # A worker of its own: deferred until the engine core's counts of this step arrive
            # on a later scheduler output (when it tags its steps), else ended as sampled.
            try:
                _end(step)
            except Exception:
                _failed("the cycle end (sample_tokens)")
    return result


def around_schedule(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The engine core schedules a step: this thread takes the outputs too. Known before its
    first step runs (with async scheduling two steps run before the first output is taken).

    Where no model runner runs on this thread (the workers are processes of their own), the
    scheduler output is tagged before the executor sends it: its step number
    (:data:`STEP_ATTRIBUTE`) and what ``update_from_output`` counted of the speculative steps
    taken since the last schedule (:data:`COUNTED_ATTRIBUTE`). vLLM pickles the object to the
    workers (``MultiprocExecutor``'s broadcast queue, Ray's channels), attributes included."""
    step = _step()
    step.scheduler_here = True
    output = original(*args, **kwargs)
    try:
        scheduler = args[0]
        if (
            not output.scheduled_spec_decode_tokens
            and output.num_scheduled_tokens
            and _speculates(scheduler)
            and decodes(scheduler, output)
        ):
            setattr(output, PLAIN_ATTRIBUTE, True)
    except Exception:
        _failed("the plain step mark (schedule)")
    if not step.runner_here:
        try:
            setattr(output, STEP_ATTRIBUTE, step.next_step)
            step.next_step += 1
            if step.counted:
                setattr(output, COUNTED_ATTRIBUTE, tuple(step.counted))
                step.counted.clear()
        except Exception:
            _failed("the step tag (schedule)")
    return output


def _speculates(scheduler: Any) -> bool:
    """Whether the scheduler runs with a speculative config (vLLM keeps ``num_spec_tokens``; a
    batch-size schedule may set it per step, to 0 included)."""
    return bool(getattr(scheduler, "num_spec_tokens", 0)) or (
        getattr(scheduler, "dynamic_sd_lookup", None) is not None
    )


STEP_ATTRIBUTE = "specobs_step"
"""Set by the engine core on each ``SchedulerOutput``: the step's number in that process. A
worker of its own keys the cycle it defers by it."""
COUNTED_ATTRIBUTE = "specobs_counted"
"""Set by the engine core on a ``SchedulerOutput``: a tuple of :data:`Counted`, one per
speculative step whose output ``update_from_output`` took since the previous schedule."""

Counted = tuple[int, "list[int]", "list[int]", int, int, "list[tuple[int, int]]"]
"""What vLLM counted of one speculative step, made in the engine core for a worker of its own:
(step number, drafts per counted draft, accepted per counted draft -- the rows
``make_spec_decoding_stats`` observed, as it observed them --, rows handed tokens, tokens
handed, and (drafted, accepted) of each request the step finished, over its whole life)."""


class _Deferred:
    """A step whose cycle ended with its acceptance to come."""

    __slots__ = ("accepted", "batch_size", "drafts", "emitted", "handle", "key", "waiting")

    def __init__(self, handle: Any, key: Any, step: _Step) -> None:
        self.handle = handle
        # The scheduler output (the engine core's thread) or the engine core's step number.
        self.key = key
        # As the runner sampled them: the fallback where no count of vLLM's comes.
        self.drafts: Any = step.draft_length
        self.accepted: Any = step.accepted
        self.batch_size = step.batch_size
        self.emitted = step.emitted
        # A worker of its own: the step's requests not yet known to be finished before the
        # engine core took the step's output (it skips those rows).
        self.waiting: set[Any] | None = None
        if not step.scheduler_here:
            scheduled = getattr(step.scheduled, "num_scheduled_tokens", None)
            self.waiting = set(scheduled) if scheduled else None


_MAX_PENDING = 32
"""Deferred steps a thread holds at most (vLLM's batch queue holds two steps with async
scheduling, one per stage with pipeline parallelism); an older one is settled as sampled."""


def _defer(step: _Step) -> None:
    tracker = step.tracker
    if tracker is None:
        return
    step.tracker = None
    key = step.key if step.key is not None else step.scheduled
    entry = _Deferred(tracker.defer(), key, step)
    step.clear()
    step.pending.append(entry)
    if len(step.pending) > _MAX_PENDING:
        _settle_as_sampled(step.pending.popleft())


def _settle_as_sampled(entry: _Deferred) -> None:
    """Every row of the step, as the runner sampled it (what specobs counted before)."""
    if entry.accepted is None:
        entry.handle.settle(None)
    else:
        entry.handle.settle(_as_sampled(entry.accepted), draft_length=entry.drafts,
                            batch_size=entry.batch_size, emitted=entry.emitted)  # fmt: skip


def _take_pending(step: _Step, scheduler_output: Any) -> _Deferred | None:
    for entry in step.pending:
        if entry.key is scheduler_output:
            step.pending.remove(entry)
            return entry
    return None


def _settle_counted(step: _Step, scheduler_output: Any) -> None:
    """A worker of its own, at a scheduler output: settle its deferred cycles with the counts
    the engine core sent for them, and those whose every request the output lists as finished.

    The engine core sends a step's counts on the first output it schedules after its
    ``update_from_output`` took the step (there is always one: a request it handed tokens is
    still running, or finished and listed in ``finished_req_ids``, which keeps the engine core
    stepping). Counts arrive in step order, so a cycle older than one counted never gets its
    own (a failure in the engine core's hook): it is settled as sampled. A cycle still waiting
    after this output's counts was not taken when the output was scheduled, so a request the
    output lists as finished ended before vLLM took the step: vLLM skips its row. When every row
    is skipped so, the cycle is settled with no tokens now: with async scheduling that is the
    last step before the engine goes idle (every row finished in the step before), whose counts
    would come with no later output."""
    pending = step.pending
    counted = getattr(scheduler_output, COUNTED_ATTRIBUTE, None)
    for counts in counted or ():
        key = counts[0]
        while pending and isinstance(pending[0].key, int) and pending[0].key < key:
            _settle_as_sampled(pending.popleft())
        if pending and pending[0].key == key:
            _settle_with(pending.popleft(), counts)
    finished = getattr(scheduler_output, "finished_req_ids", None)
    if finished:
        for entry in list(pending):
            if entry.waiting is not None:
                entry.waiting.difference_update(finished)
                if not entry.waiting:
                    pending.remove(entry)
                    entry.handle.settle(None)


def _settle_with(entry: _Deferred, counts: Counted) -> None:
    """Settle a worker's deferred cycle with what the engine core counted of its step, then
    report the requests the step finished."""
    _, drafted, accepted, rows, emitted, finished = counts
    if finished:
        VllmInstrumentor().report_requests(finished)
    if not rows and not accepted:
        entry.handle.settle(None)
        return
    lengths = list(accepted)
    drafts = list(drafted)
    extra = max(rows - len(lengths), 0)  # rows handed tokens without a draft
    lengths += [0] * extra
    drafts += [0] * extra
    entry.handle.settle(lengths, draft_length=drafts, batch_size=len(lengths), emitted=emitted)


def counting_rows(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.make_spec_decoding_stats`` wrapped: vLLM's scheduler calls it once per row of
    a speculative step it counts, inside ``update_from_output``. While the engine core counts a
    step for a worker of its own, the row is kept as vLLM counts it: its drafts less those a
    grammar rejected, its accepted drafts (:func:`counted_row`). A plain closure, not
    :func:`~specobs.instrument._base.wrap_around`: it runs per row on the engine core's thread
    (measured on the 2-core VM: +0.4 us a row against +1.4 us through the generic wrapper)."""

    @functools.wraps(original)
    def make_spec_decoding_stats(*args: Any, **kwargs: Any) -> Any:
        step = _local.__dict__.get("step")
        if step is not None and step.collect is not None:
            try:
                row = counted_row(args, kwargs)
                if row is not None:
                    step.collect.append((*row, _row_request(args, kwargs)))
            except Exception:
                _failed("a counted row (make_spec_decoding_stats)")
        return original(*args, **kwargs)

    make_spec_decoding_stats.__specobs_hook__ = counting_rows  # type: ignore[attr-defined]
    return make_spec_decoding_stats


def _row_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The request id of one ``make_spec_decoding_stats`` call (``None`` before releases that
    pass it)."""
    return kwargs.get("request_id") if len(args) < 6 else args[5]


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


def counted_row(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(drafted, accepted) of one call ``make_spec_decoding_stats(self, stats, num_draft_tokens,
    num_accepted_tokens[, num_invalid_spec_tokens, request_id])`` as its body counts it; ``None``
    for a row without drafts, which it does not observe."""
    drafted = kwargs["num_draft_tokens"] if "num_draft_tokens" in kwargs else args[2]
    if not drafted:
        return None
    accepted = kwargs["num_accepted_tokens"] if "num_accepted_tokens" in kwargs else args[3]
    invalid = kwargs.get("num_invalid_spec_tokens") if len(args) < 5 else args[4]
    if invalid:
        request_id = kwargs.get("request_id") if len(args) < 6 else args[5]
        drafted -= int(invalid.get(request_id, 0))
    return max(int(drafted), 0), int(accepted)


def _counted_by_vllm(
    step: _Step, original: Callable[..., Any], args: Any, kwargs: Any
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


def _count_for_worker(
    step: _Step, key: int, original: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """The engine core takes a speculative step's output for a worker of its own: what vLLM
    counted of it (:func:`_counted_by_vllm`), kept for the next scheduler output to carry
    (:func:`around_schedule`)."""
    out, counts = _counted_by_vllm(step, original, args, kwargs)
    if counts is not None:
        step.counted.append((key, *counts))
    return out


def around_update_from_output(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The engine core takes a step's output. On a thread that runs the worker too, the open
    cycle of that step ends here and, like a cycle deferred at ``sample_tokens`` (async
    scheduling), is settled with the rows this call counts (:func:`_counted_by_vllm`). With the
    worker in a process of its own, what vLLM counts of a speculative step is kept here for the
    next scheduler output to carry to it."""
    step = _step()
    step.scheduler_here = True
    if not step.runner_here:
        key = None
        try:
            scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
            key = getattr(scheduler_output, STEP_ATTRIBUTE, None)
            if not scheduler_output.scheduled_spec_decode_tokens and not is_plain(
                scheduler_output
            ):
                key = None
        except Exception:
            _failed("the counts for the worker (update_from_output)")
        if key is None:
            return original(*args, **kwargs)
        return _count_for_worker(step, key, original, args, kwargs)
    if step.tracker is not None and step.waits:
        # The step's times end here, before vLLM takes its output; its rows are settled below
        # with what vLLM counts of them (not those of requests aborted while it ran, nor a
        # stale output or a failed KV load), its host rows the fallback.
        try:
            _defer(step)
        except Exception:
            _failed("the cycle end (update_from_output)")
    if not step.pending:
        return original(*args, **kwargs)
    entry = None
    try:
        entry = _take_pending(step, args[1] if len(args) > 1 else kwargs["scheduler_output"])
    except Exception:
        _failed("the deferred step (update_from_output)")
    if entry is None:
        return original(*args, **kwargs)
    try:
        # The rows vLLM counts, as it counts them (a row gone, finished, stale or whose KV load
        # failed is never observed), and the tokens it hands on.
        out, counts = _counted_by_vllm(step, original, args, kwargs)
    except BaseException:
        try:
            _settle_as_sampled(entry)
        except Exception:
            _failed("the cycle end (update_from_output)")
        raise
    try:
        if counts is None:
            _settle_as_sampled(entry)
        else:
            _settle_with(entry, (0, *counts))
    except Exception:
        _failed("the cycle end (update_from_output)")
    return out


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
            for method, hook in RUNNERS[name].items():
                if method == "sample_tokens" and not hasattr(runner, method):
                    continue  # releases that sample inside execute_model
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
        step = _local.__dict__.pop("step", None)
        while step is not None and step.pending:
            try:
                _settle_as_sampled(step.pending.popleft())
            except Exception:
                _failed("the cycle end (uninstrument)")

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
