"""SGLang: an ``sglang.srt.plugins`` plugin timing every speculative decoding step.

Turn it on with ``SPECOBS_SGLANG=1`` (``pip install specobs`` registers the entry point). SGLang's
``load_plugins()`` runs :func:`sglang_plugin` early in every process it starts (API server,
detokenizer, data-parallel controller, schedulers). The plugin imports nothing of SGLang's worker
code: it registers post-import hooks, so a worker class is patched in the moment SGLang itself
imports its module -- which only the scheduler processes that run the model do. The same code
path serves ``SGLangInstrumentor().instrument()`` (releases before 0.5.11, which have no plugin
framework, and tests), and ``uninstrument()`` puts every original back.

Coverage, per worker class ``SpeculativeAlgorithm.create_worker`` returns (0.5.23; see
docs/integrations.md for what each phase covers per class):

- hooked: ``EAGLEWorkerV2`` (EAGLE, EAGLE3, NEXTN), ``StandaloneWorkerV2`` (inherits it),
  ``MultiLayerEagleWorkerV2``, ``FrozenKVMTPWorkerV2``, ``NGRAMWorker``, ``DFlashWorkerV2``,
  ``UnoWorkerV2``, ``DSparkWorkerV2``, and the V1 ``EAGLEWorker`` of releases up to 0.5.12. A
  decode step is one cycle; the draft phase runs until the draft returns, verify is the target
  forward with acceptance, and bookkeeping is the draft model's extend forward over the accepted
  tokens (NGRAM: the n-gram corpus update). DFLASH: verify starts at
  ``DFlashVerifyInput.prepare_for_verify``, bookkeeping (the draft-KV commit) at
  ``_update_target_mamba_state_after_verify`` or ``_append_target_hidden_to_draft_kv_by_loc``.
  UNO: verify starts where it builds its ``UNO_VERIFY`` pass (linear) or calls
  ``run_eagle_verify`` (tree); it has no bookkeeping to run. DSPARK: the draft ends where
  ``DraftBlockProposer.propose`` returns, bookkeeping starts at
  ``_commit_target_mamba_states_after_verify``;
- reported as unsupported (one warning per class and ``specobs_info{integration="unsupported"}``
  on its first step): :data:`UNSUPPORTED_WORKERS`, and any other class ``create_worker`` returns
  (an out-of-tree platform's worker, a custom algorithm) whose decode step is not hooked.

Drafted tokens per request: the draft tree verifies ``speculative_num_draft_tokens - 1`` tokens
(``topk > 1``); a chain (``topk == 1``) verifies ``speculative_num_steps``, which adaptive
speculation changes at run time and may set to 0 (drafting off); DFLASH ``block_size - 1``; UNO
its proposals (linear ``F - 1``, tree ``Q - 1``); DSPARK each row's admitted verify window less
its anchor (``cap_lens - 1``, ragged verify), else ``gamma``. Acceptance comes from the returned
``GenerationBatchResult``: the per-request CPU list under its three names, else the GPU
``accept_lens`` (accepted drafts plus the step's non-draft tokens: the bonus, and UNO's clean
root), handed to specobs as a CUDA tensor: no sync. Emitted tokens are accepted plus those
non-draft tokens (UNO: 2 per row). Per-row values still on the GPU when a step returns (DSPARK's
windows, UNO's counts outside result processing) are not read: that cycle keeps its times only.
Prefill (extend) and idle batches are not speculative cycles and pass straight through;
with DP attention and ``SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1`` a decode rank's step on a
batch where a peer prefills is a cycle (it drafts, verifies and extends its own rows).

Counted rows: under overlap scheduling (the default) a request that finished while its step was
in flight is verified once more in the next step; result processing skips that row. With one
pipeline stage and 0.5.23's ``SchedulerBatchResultProcessor``, a decode step's cycle ends when
the worker's step returns with its acceptance deferred, and is settled in
``process_batch_result_decode`` with the rows SGLang counts and the tokens it keeps
(:func:`around_process_batch_result_decode`).

Topology (:func:`topology_of`): the process that records is the TP rank 0 of the last pipeline
stage of each data-parallel replica (with DP attention: of each attention-DP group); replicas are
told apart by ``dp_rank`` and get port + ``dp_rank``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specobs._config import env_flag
from specobs.instrument import _base
from specobs.instrument._package_sglang import PACKAGE

if TYPE_CHECKING:
    from specobs import Observer

__all__ = ["SPECOBS_SGLANG", "SGLangInstrumentor", "sglang_plugin"]

SPECOBS_SGLANG = "SPECOBS_SGLANG"
"""``1`` turns the SGLang plugin on (default off: installing specobs changes nothing)."""

_SPEC = "sglang.srt.speculative."
V2_MODULE = _SPEC + "eagle_worker_v2"
V1_MODULE = _SPEC + "eagle_worker"
MULTI_LAYER_MODULE = _SPEC + "multi_layer_eagle_worker_v2"
FROZEN_KV_MTP_MODULE = _SPEC + "frozen_kv_mtp_worker_v2"
NGRAM_MODULE = _SPEC + "ngram_worker"
DFLASH_MODULE = _SPEC + "dflash_worker_v2"
DFLASH_INFO_MODULE = _SPEC + "dflash_info"
"""Where ``DFlashVerifyInput`` lives (its ``prepare_for_verify`` starts DFLASH's verify)."""
UNO_MODULE = _SPEC + "uno_worker_v2"
DSPARK_MODULE = _SPEC + "dspark_components.dspark_worker_v2"
DSPARK_DRAFT_MODULE = _SPEC + "dspark_components.dspark_draft"
"""Where DSPARK's ``DraftBlockProposer`` lives (its ``propose`` is the draft)."""
SPEC_INFO_MODULE = _SPEC + "spec_info"
RESULT_PROCESSOR_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"
"""Where the scheduler processes a decode step's result (0.5.23: ``SchedulerBatchResultProcessor.
process_batch_result_decode``), on the worker's thread: under overlap scheduling after the next
step was launched. A step's cycle is settled there (:func:`around_process_batch_result_decode`)."""
_PENDING = "_specobs_pending"
"""The attribute of a step's ``GenerationBatchResult`` holding its deferred cycle."""
SPEC_REGISTRY_MODULE = _SPEC + "spec_registry"
WORKER_FACTORIES = (
    (SPEC_INFO_MODULE, "SpeculativeAlgorithm"),
    (SPEC_REGISTRY_MODULE, "CustomSpecAlgo"),
)
"""The classes whose ``create_worker`` picks the worker class the scheduler builds (built-in
algorithms, and algorithms registered by plugins)."""

ACCEPTED_PER_REQUEST_FIELDS = (
    "num_correct_drafts_per_req_cpu",  # 0.5.12 and later
    "num_accepted_drafts_per_req_cpu",  # 0.5.11
    "accept_length_per_req_cpu",  # up to 0.5.10 (since 0.5.19 also a dLLM field, never EAGLE's)
)
"""Names, newest first, of the per-request accepted-draft counts (bonus token excluded)."""

PP_PHASES = ("verify", "bookkeeping", "draft")
"""Phase order of ``EAGLEWorkerV2`` on the last pipeline stage when ``pp_size > 1``: the
scheduler hands it the verify input relayed from earlier stages, and it drafts the next round's
chain after the draft extend (the PP tail draft)."""

_failed = _base.LogOnce()
_log = logging.getLogger("specobs.instrument")
_local = threading.local()


def _enabled(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    return env_flag(SPECOBS_SGLANG, env)


# -- topology --------------------------------------------------------------------------------------


def topology_from(
    *,
    tp_rank: int,
    tp_size: int,
    pp_rank: int = 0,
    pp_size: int = 1,
    dp_rank: int | None = None,
    dp_ranks: int = 1,
    attn_dp_size: int = 1,
) -> _base.Topology:
    """Where a scheduler process sits, from SGLang's ranks and widths.

    ``dp_ranks`` counts the data-parallel units that each run their own batches: replicas
    (``--dp-size``, each with its own WORLD, so their WORLD ranks repeat) or attention-DP groups
    (``--enable-dp-attention``: one WORLD, TP ranks laid out DP-major). ``dp_rank`` is this
    process's unit, as SGLang's launcher hands it to the scheduler. The leader is the first TP
    rank of the unit on the last pipeline stage -- the only stage that runs the speculative
    worker's draft, verify and acceptance.
    """
    group = max(tp_size // max(attn_dp_size, 1), 1)
    local_tp = tp_rank % group
    last_stage = pp_rank == pp_size - 1
    replicas = max(dp_ranks, 1)
    replica = None
    if replicas > 1:
        replica = dp_rank if dp_rank is not None else tp_rank // group
        replica = min(max(replica, 0), replicas - 1)
    return _base.Topology(
        leader=local_tp == 0 and last_stage,
        rank=pp_rank * group + local_tp,
        replica=replica,
        replicas=replicas,
    )


def _parallel_context() -> Any:
    """SGLang's published parallel context (0.5.23: ``runtime_context.get_parallel()``)."""
    import sys

    module = sys.modules.get("sglang.srt.runtime_context")
    if module is None:
        return None
    try:
        parallel = module.get_parallel()
        int(parallel.tp_rank)  # raises when this process published no ranks
    except Exception:
        return None
    return parallel


def topology_of(worker: Any) -> _base.Topology:
    """The topology of the process running ``worker`` (a speculative worker of any release).

    Reads SGLang's runtime context when it is published (0.5.23), else the ranks the target
    ``TpModelWorker`` holds and the server arguments (older releases), else torch.distributed.
    """
    parallel = _parallel_context()
    if parallel is not None:

        def read(name: str, default: Any) -> Any:
            try:
                value = getattr(parallel, name)
            except Exception:
                return default
            return default if value is None else value

        dp_size = int(read("dp_size", 1))
        attn_dp = int(read("attn_dp_size", 1))
        return topology_from(
            tp_rank=int(parallel.tp_rank), tp_size=int(read("tp_size", 1)),
            pp_rank=int(read("pp_rank", 0)), pp_size=int(read("pp_size", 1)),
            dp_rank=parallel.dp_rank if _has(parallel, "dp_rank") else None,
            dp_ranks=int(read("num_dp_ranks", dp_size * attn_dp)), attn_dp_size=attn_dp,
        )  # fmt: skip
    target = getattr(worker, "target_worker", None) or getattr(worker, "_target_worker", None)
    args = getattr(worker, "server_args", None) or getattr(target, "server_args", None)

    def rank(name: str) -> int | None:
        for holder in (worker, target):
            value = getattr(holder, name, None)
            if isinstance(value, int):
                return value
        return None

    tp_rank = rank("tp_rank")
    if tp_rank is None:
        tp_rank = _world_rank()
    dp_size = int(getattr(args, "dp_size", 1) or 1)
    attn_dp = dp_size if getattr(args, "enable_dp_attention", False) else 1
    return topology_from(
        tp_rank=tp_rank, tp_size=int(getattr(args, "tp_size", 0) or tp_rank + 1),
        pp_rank=rank("pp_rank") or 0, pp_size=int(getattr(args, "pp_size", 1) or 1),
        dp_rank=rank("dp_rank"), dp_ranks=dp_size, attn_dp_size=attn_dp,
    )  # fmt: skip


def _has(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except Exception:
        return False
    return True


def _world_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def _pp_size(worker: Any) -> int:
    parallel = _parallel_context()
    if parallel is not None:
        try:
            return int(parallel.pp_size)
        except Exception:
            return 1
    args = getattr(worker, "server_args", None)
    return int(getattr(args, "pp_size", 1) or 1)


# -- draft length ----------------------------------------------------------------------------------


def eagle_draft_length(worker: Any) -> int:
    """Tokens verified per request by one EAGLE-family step (tree or chain)."""
    steps = getattr(worker, "speculative_num_steps", None)
    if steps is not None and int(steps) == 0:
        return 0  # adaptive speculation turned drafting off for this batch size
    topk = int(getattr(worker, "topk", 1) or 1)
    tokens = getattr(worker, "speculative_num_draft_tokens", None)
    if tokens is not None and (topk > 1 or steps is None):
        return max(int(tokens) - 1, 0)
    return int(steps or 0)


def ngram_draft_length(worker: Any) -> int:
    """NGRAM verifies a tree of ``draft_token_num`` nodes, the first being the last real token."""
    tokens = getattr(worker, "draft_token_num", None)
    if tokens is None:
        tokens = getattr(worker, "speculative_num_draft_tokens", None)
    return max(int(tokens if tokens is not None else 1) - 1, 0)


def dflash_draft_length(worker: Any) -> int:
    """DFLASH verifies its whole block: ``block_size`` tokens, the first the last real token."""
    return max(int(worker.block_size) - 1, 0)


def uno_draft_length(worker: Any) -> int:
    """UNO's proposals per request. Linear: the forward width ``F`` holds the clean root (an
    exact target token, not a draft) and ``F - 1`` proposals, all verified. Tree
    (``tree_mode``): EAGLE's verify over ``Q`` nodes rooted at the clean root: ``Q - 1``."""
    if getattr(worker, "tree_mode", False):
        return max(int(worker.verify_width) - 1, 0)
    return max(int(worker.forward_width) - 1, 0)


def dspark_draft_length(worker: Any) -> int:
    """DSPARK's full verify window less the anchor: ``gamma``. A step whose result carries
    ``cap_lens`` (ragged verify) verified fewer per request; those widths replace this one
    (:func:`_verified_widths`)."""
    return max(int(worker.verify_num_draft_tokens) - 1, 0)


_MAX_DRAFT_LENGTH_LIMIT = 64  # specobs' own bound on max_draft_length


def _max_draft_length(worker: Any, now: int) -> int | None:
    configured = getattr(worker, "speculative_num_draft_tokens", None)
    longest = max(now, int(configured) - 1 if configured is not None else 0)
    return min(longest, _MAX_DRAFT_LENGTH_LIMIT) if longest > 8 else None


# -- the hooks: hook(original_fn, *args, **kwargs) -------------------------------------------------


def _is_decode(batch: Any) -> bool:
    """A decode step the worker's own step runs as draft, verify, draft extend.

    With DP attention a batch is flagged ``is_extend_in_batch`` when any rank of the group
    prefills; the worker then runs the step as prefill, except with
    ``SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1``, where a decode rank's cycle goes through
    ``_forward_dp_spec_prefill_coordination`` (its own hook: :func:`_has_decode_rows`).
    """
    if getattr(batch, "is_extend_in_batch", False):
        return False
    return _has_decode_rows(batch)


def _has_decode_rows(batch: Any) -> bool:
    """Neither prefill nor idle on this rank, whatever the peers of its DP group do."""
    mode = batch.forward_mode
    if mode.is_extend():
        return False
    is_idle = getattr(mode, "is_idle", None)
    return not (is_idle is not None and is_idle())


def _non_draft(result: Any) -> int:
    """Tokens per request a step emits that were not drafts: the bonus token, and UNO's clean
    root too (``GenerationBatchResult.num_non_draft_tokens_per_req``: 1, UNO 2)."""
    n = getattr(result, "num_non_draft_tokens_per_req", 1)
    return n if type(n) is int and n >= 0 else 1


def _accepted(result: Any) -> Any:
    for name in ACCEPTED_PER_REQUEST_FIELDS:
        value = getattr(result, name, None)
        if value is not None:
            return value
    accept_lens = getattr(result, "accept_lens", None)
    if accept_lens is not None:
        # Includes the non-draft tokens. On the GPU this is one tiny kernel queued on the
        # worker's stream; specobs copies the result to pinned memory asynchronously and reads
        # it later.
        return accept_lens - _non_draft(result)
    return None


def _host_list(value: Any, *, processed: bool = False) -> list[int] | None:
    """``value``'s per-request counts as a host list; ``None`` when they are still on the GPU
    (reading them would synchronize the worker's stream). ``processed``: the scheduler's result
    processing has already synchronized and read them (``.tolist()``), so reading is free."""
    if type(value) is list:
        return value
    if type(value) is tuple:
        return list(value)
    if not processed and getattr(value, "is_cuda", False):
        return None
    tolist = getattr(value, "tolist", None)
    out = tolist() if tolist is not None else None
    return out if type(out) is list else None


def _verified_widths(result: Any, k: int, *, processed: bool = False) -> int | list[int] | None:
    """Drafts verified per request: ``k`` for every row, else, when the step planned a ragged
    verify (DSPARK's ``cap_lens``: each row's verify window, the anchor included), each row's
    window less the anchor. ``None``: the windows are still on the GPU."""
    caps = getattr(result, "cap_lens", None)
    if caps is None:
        return k
    widths = _host_list(caps, processed=processed)
    return None if widths is None else [max(int(w) - 1, 0) for w in widths]


def _exact(
    result: Any, k: int, *, processed: bool = False
) -> tuple[Any, int | list[int], int | None] | None:
    """``(accepted, draft lengths, emitted)`` of every row of a step's result, as ``accept``
    takes them (``emitted`` ``None``: accepted + 1 per row); ``None`` when counting them exactly
    would need values still on the GPU (the cycle keeps its times, without tokens)."""
    accepted = _accepted(result)
    if accepted is None:
        return None
    n = _non_draft(result)
    widths = _verified_widths(result, k, processed=processed)
    if n == 1 and type(widths) is int:
        return accepted, widths, None
    counts = _host_list(accepted, processed=processed)
    if counts is None or widths is None:
        return None
    if type(widths) is list and len(widths) != len(counts):
        return None
    return counts, widths, sum(counts) + n * len(counts)


def _first_batch(kwargs: dict[str, Any]) -> Any:
    for name in ("batch", "model_worker_batch"):
        if name in kwargs:
            return kwargs[name]
    raise TypeError("forward_batch_generation() called without a batch")


def _observer_for(worker: Any, draft_length: int, pp_order: bool) -> Observer:
    instrumentor = SGLangInstrumentor()
    observer = instrumentor.current_observer
    if observer is None:
        phases = PP_PHASES if pp_order and _pp_size(worker) > 1 else _base.DEFAULT_PHASES
        observer = instrumentor.observer(
            phases=phases,
            max_draft_length=_max_draft_length(worker, draft_length),
            topology=topology_of(worker),
        )
    return observer


def _cycle_hook(
    draft_length: Callable[[Any], int],
    pp_order: bool = False,
    is_cycle: Callable[[Any], bool] = _is_decode,
) -> Callable[..., Any]:
    """The hook for a worker's decode step: one cycle, acceptance read from its result."""

    def around_step(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        worker, batch = args[0], (args[1] if len(args) > 1 else _first_batch(kwargs))
        tracker = None
        try:
            # The guard: a subclass's step that calls super() is still one cycle.
            if _local.__dict__.get("tracker") is None and is_cycle(batch):
                observer = _observer_for(worker, draft_length(worker), pp_order)
                tracker = _base.PhaseTracker(observer)
                tracker.start(int(batch.seq_lens.shape[0]))
                _local.tracker = tracker
        except Exception:
            _failed("the cycle start (forward_batch_generation)")
            tracker = None
        if tracker is None:
            return original(*args, **kwargs)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _local.tracker = None
            tracker.abort()
            raise
        _local.tracker = None
        try:
            # Read after the step: adaptive speculation may have changed it for this step.
            k = draft_length(worker)
            pending = getattr(result, "__dict__", None)
            if pending is not None and _defers(worker, batch):
                # Times final now; the rows the scheduler's result processing counts (not
                # those of requests that finished while the step was in flight) come later,
                # and so does the acceptance: that processing copies it to the host itself,
                # so nothing is launched on the worker's stream for it here.
                pending[_PENDING] = (tracker.defer(), k)
            else:
                exact = _exact(result, k)
                if exact is not None:
                    tracker.accept(exact[0], exact[1], emitted=exact[2])
                tracker.finish()
        except Exception:
            _failed("the cycle end (forward_batch_generation)")
        return result

    return around_step


def _defers(worker: Any, batch: Any) -> bool:
    """Whether this step's cycle waits for the scheduler's result processing: it is hooked in
    this process, the batch is one it processes as decode, and there is one pipeline stage
    (under PP the last stage's result reaches the processing as another object)."""
    if RESULT_PROCESSOR_MODULE not in SGLangInstrumentor()._patched_modules:
        return False
    if not batch.forward_mode.is_decode():
        return False
    return _pp_size(worker) == 1


def _output_len(req: Any) -> int:
    """The request's output tokens as SGLang returns them: through its stop, when it has one."""
    through_stop = getattr(req, "output_ids_through_stop", None)
    return len(through_stop if through_stop is not None else req.output_ids)


def _settle(handle: Any, result: Any, k: int, rows: list[tuple[Any, bool, int]] | None) -> None:
    """Give a deferred step the rows SGLang's result processing counted: their accepted drafts
    (the host list it made), the drafts each verified (``k``, or DSPARK's ragged window less
    the anchor) and the tokens their outputs grew by (bonus, and UNO's clean root, included)."""
    exact = _exact(result, k, processed=rows is not None)
    if exact is None:
        handle.settle(None)
        return
    accepted, widths, emitted = exact
    if rows is None or type(accepted) is not list or len(accepted) != len(rows):
        # What the step returned, every row.
        handle.settle(accepted, draft_length=widths, emitted=emitted)
        _report_unverified(k, widths)
        return
    live = [i for i, row in enumerate(rows) if row[1]]
    if not live:
        handle.settle(None)  # every row finished in flight: a cycle without tokens
        return
    kept = widths if isinstance(widths, int) else [widths[i] for i in live]
    emitted = sum(_output_len(rows[i][0]) - rows[i][2] for i in live)
    handle.settle([accepted[i] for i in live], draft_length=kept, batch_size=len(live),
                  emitted=emitted)  # fmt: skip
    _count_requests([rows[i][0] for i in live], [accepted[i] for i in live], kept)
    _report_unverified(k, kept)


def _report_unverified(k: int, widths: Any) -> None:
    """DSPARK's ragged verify: each row verified its window, the rest of the ``k`` drafts it
    proposed were left out (``specobs_draft_tokens_unverified_total``)."""
    if isinstance(widths, int):
        return
    unverified = sum(max(k - int(w), 0) for w in widths)
    observer = SGLangInstrumentor().current_observer if unverified else None
    if observer is not None:
        observer.drafts_unverified(unverified)


_REQUEST_FIGURES = "_specobs_request"
"""The attribute of a running ``Req`` holding [drafted, accepted] of the rows specobs counted."""


def _count_requests(reqs: list[Any], accepted: list[Any], widths: Any) -> None:
    """Add a settled step's rows to their requests' figures, and report each request the step
    finished (``Req.finished()`` once the processing ran) with its drafted and accepted drafts
    over its life. Accepted is what SGLang's own ``spec_num_correct_drafts`` counts; drafted is
    what specobs counted per row (SGLang's ``spec_num_proposed_drafts`` is verify passes times
    the configured k, wrong under adaptive steps and ragged windows)."""
    finished: list[tuple[int, int]] = []
    for j, req in enumerate(reqs):
        figures = getattr(req, _REQUEST_FIGURES, None)
        if figures is None:
            figures = [0, 0]
            setattr(req, _REQUEST_FIGURES, figures)
        figures[0] += int(widths if isinstance(widths, int) else widths[j])
        figures[1] += int(accepted[j])
        if req.finished():
            finished.append((figures[0], figures[1]))
            delattr(req, _REQUEST_FIGURES)
    if finished:
        SGLangInstrumentor().report_requests(finished)


def around_process_batch_result_decode(
    original: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """The scheduler processes a decode step's result: the step's deferred cycle is settled
    with the rows it counts. Under overlap scheduling a request that finished while its step
    was in flight is verified once more in the next step; ``_resolve_spec_v2_tokens`` skips
    such a row (``req.finished() or req.is_retracted``: no per-request counts, no tokens), and
    so does specobs. Emitted tokens are the growth of each row's output through its stop."""
    result = args[2] if len(args) > 2 else kwargs.get("result")
    pending = getattr(result, "__dict__", {}).pop(_PENDING, None)
    if pending is None:
        return original(*args, **kwargs)
    handle, k = pending
    rows = None
    try:
        batch = args[1] if len(args) > 1 else kwargs["batch"]
        # Read before the processing updates the finish states: the rows it skips.
        rows = [(req, not (req.finished() or req.is_retracted), len(req.output_ids))
                for req in batch.reqs]  # fmt: skip
    except Exception:
        _failed("the rows (process_batch_result_decode)")
    try:
        out = original(*args, **kwargs)
    except BaseException:
        try:
            _settle(handle, result, k, None)
        except Exception:
            _failed("the cycle end (process_batch_result_decode)")
        raise
    try:
        # The host list the processing made (num_correct_drafts_per_req_cpu), else the step's
        # accept_lens less the non-draft tokens.
        _settle(handle, result, k, rows)
    except Exception:
        _failed("the cycle end (process_batch_result_decode)")
    return out


def _around_phase(start: str | None, end: str | None) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tracker = _local.__dict__.get("tracker")
        if tracker is None:
            return original(*args, **kwargs)
        if start is not None:
            try:
                tracker.enter(start)
            except Exception:
                _failed(f"the {start} phase start")
        result = original(*args, **kwargs)
        if end is not None:
            try:
                tracker.enter(end)
            except Exception:
                _failed(f"the {end} phase start")
        return result

    return hook


around_decode_step = _cycle_hook(eagle_draft_length, pp_order=True)
"""One decode step of an EAGLE-family worker (V1 or V2) is one cycle."""
around_coordinated_step = _cycle_hook(eagle_draft_length, pp_order=True, is_cycle=_has_decode_rows)
"""``EAGLEWorkerV2._forward_dp_spec_prefill_coordination`` on a rank that decodes while a peer
of its DP-attention group prefills (``SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1``): a full
draft, verify and draft extend over this rank's decode rows, one cycle. On a prefilling rank it
drafts over an idle batch and prefills: not a cycle."""
around_plain_step = _cycle_hook(eagle_draft_length)
"""One decode step of an EAGLE-family worker without a PP tail draft (multi-layer, FrozenKV)."""
around_ngram_step = _cycle_hook(ngram_draft_length)
"""One decode step of the NGRAM worker is one cycle."""
_around_head_draft = _around_phase(None, "verify")
_around_tail_draft = _around_phase("draft", None)


def around_draft(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The draft ends where ``draft`` returns (it started with the cycle). Under PP the last
    stage also drafts the next round after the draft extend (``with_topology=True``): with the
    PP phase order that call is the draft phase; an ordinary draft then stays in verify."""
    if kwargs.get("with_topology"):
        return _around_tail_draft(original, *args, **kwargs)
    return _around_head_draft(original, *args, **kwargs)


around_verify = _around_phase("verify", "bookkeeping")
"""Verify runs exactly the length of ``verify`` (also when drafting was skipped)."""
around_draft_extend = _around_phase("bookkeeping", None)
"""The draft model's catch-up over the accepted tokens (or NGRAM's corpus update) is
bookkeeping."""

around_dflash_step = _cycle_hook(dflash_draft_length)
"""One decode step of ``DFlashWorkerV2`` (its block draft, verify and draft-KV commit)."""
around_uno_step = _cycle_hook(uno_draft_length)
"""One decode step of ``UnoWorkerV2`` (linear or tree)."""
around_dspark_step = _cycle_hook(dspark_draft_length)
"""One decode step of ``DSparkWorkerV2``."""
around_dspark_coordinated_step = _cycle_hook(dspark_draft_length, is_cycle=_has_decode_rows)
"""``DSparkWorkerV2._forward_dp_spec_prefill_coordination`` on a rank that decodes while a peer
of its DP-attention group prefills: it runs the rank's decode step (one cycle); on a
prefilling rank it prefills (not a cycle)."""
around_draft_end = _around_head_draft
"""The draft ends where this method returns; verify starts (DSPARK's ``propose``)."""
around_verify_start = _around_phase("verify", None)
"""Verify starts with this call: the draft is complete (DFLASH's ``prepare_for_verify``, UNO
tree's ``run_eagle_verify``)."""
around_commit = _around_phase("bookkeeping", None)
"""The commit after verify starts with this call: target state (mamba) and the draft KV of the
accepted tokens (DFLASH, DSPARK)."""


def around_uno_forward_batch(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``UnoWorkerV2._make_forward_batch`` builds the draft pass and (linear UNO) the verify
    pass of a step; building the verify pass is where the draft (with its candidate sampling)
    has ended and verify starts."""
    kind = kwargs.get("spec_input_type")
    if getattr(kind, "name", None) == "UNO_VERIFY":
        return around_verify_start(original, *args, **kwargs)
    return original(*args, **kwargs)


@dataclass(frozen=True)
class HookTarget:
    """One method specobs wraps: ``module.owner.method`` with ``hook``. An empty ``owner`` is
    a function of the module itself: the name the module's own code calls (``from x import f``
    binds it there), so wrapping it there affects that module's calls only."""

    module: str
    owner: str
    method: str
    hook: Callable[..., Any]

    @property
    def dotted(self) -> str:
        return ".".join(part for part in (self.module, self.owner, self.method) if part)


_V2, _ML, _FROZEN = V2_MODULE, MULTI_LAYER_MODULE, FROZEN_KV_MTP_MODULE
_STEP, _EXTEND = "forward_batch_generation", "_draft_extend_for_decode"
_COORDINATED = "_forward_dp_spec_prefill_coordination"


def _hooks(module: str, owner: str, hooks: dict[str, Callable[..., Any]]) -> list[HookTarget]:
    """The methods of one class specobs wraps: method name -> hook."""
    return [HookTarget(module, owner, method, hook) for method, hook in hooks.items()]


HOOK_TARGETS: tuple[HookTarget, ...] = (
    *_hooks(_V2, "EAGLEWorkerV2", {
        _STEP: around_decode_step, _COORDINATED: around_coordinated_step, "verify": around_verify,
    }),
    *_hooks(_V2, "EagleDraftWorker", {"draft": around_draft, _EXTEND: around_draft_extend}),
    *_hooks(_ML, "MultiLayerEagleWorkerV2", {_STEP: around_plain_step, "verify": around_verify}),
    *_hooks(_ML, "MultiLayerEagleDraftWorker", {
        "draft": around_draft, _EXTEND: around_draft_extend,
    }),
    # FrozenKVMTPWorkerV2 inherits EAGLEWorkerV2.verify (hooked above: its module imports V2's).
    *_hooks(_FROZEN, "FrozenKVMTPWorkerV2", {_STEP: around_plain_step}),
    *_hooks(_FROZEN, "FrozenKVMTPDraftWorker", {
        "draft": around_draft, _EXTEND: around_draft_extend,
    }),
    *_hooks(NGRAM_MODULE, "NGRAMWorker", {
        _STEP: around_ngram_step,
        "_prepare_for_speculative_decoding": around_draft,
        "_update_ngram_corpus": around_draft_extend,
    }),
    *_hooks(DFLASH_MODULE, "DFlashWorkerV2", {
        _STEP: around_dflash_step,
        # Private: DFLASH's step has no public seam after its verify. The mamba commit runs
        # only for hybrid targets; the draft-KV append in every decode step.
        "_update_target_mamba_state_after_verify": around_commit,
        "_append_target_hidden_to_draft_kv_by_loc": around_commit,
    }),
    *_hooks(DFLASH_INFO_MODULE, "DFlashVerifyInput", {"prepare_for_verify": around_verify_start}),
    # Private: UNO builds its verify pass (linear) in this helper; tree UNO verifies through
    # eagle_worker_common.run_eagle_verify, wrapped as UNO's module calls it.
    *_hooks(UNO_MODULE, "UnoWorkerV2", {
        _STEP: around_uno_step, "_make_forward_batch": around_uno_forward_batch,
    }),
    HookTarget(UNO_MODULE, "", "run_eagle_verify", around_verify_start),
    *_hooks(DSPARK_MODULE, "DSparkWorkerV2", {
        _STEP: around_dspark_step,
        _COORDINATED: around_dspark_coordinated_step,
        # Private: the first call after DSPARK's verify and acceptance, in every decode step.
        "_commit_target_mamba_states_after_verify": around_commit,
    }),
    *_hooks(DSPARK_DRAFT_MODULE, "DraftBlockProposer", {"propose": around_draft_end}),
    HookTarget(RESULT_PROCESSOR_MODULE, "SchedulerBatchResultProcessor",
               "process_batch_result_decode", around_process_batch_result_decode),
    *_hooks(V1_MODULE, "EAGLEWorker", {
        _STEP: around_plain_step,
        "draft": around_draft,
        "verify": around_verify,
        "forward_draft_extend_after_decode": around_draft_extend,
    }),
)
"""Every method specobs wraps, in every release of the supported range that has it."""

HOOKED_WORKERS: dict[str, str] = {
    "EAGLEWorkerV2": "EAGLE, EAGLE3 and NEXTN (sglang.srt.speculative.eagle_worker_v2)",
    "StandaloneWorkerV2": "STANDALONE: a subclass of EAGLEWorkerV2 that inherits its step",
    "MultiLayerEagleWorkerV2": "EAGLE with enable_multi_layer_eagle (MiMo-V2, GigaChat 3.5)",
    "FrozenKVMTPWorkerV2": "FROZEN_KV_MTP: its own step, EAGLEWorkerV2's verify",
    "NGRAMWorker": "NGRAM: host-side n-gram drafting, target verify, corpus update",
    "DFlashWorkerV2": "DFLASH: a block drafted in one diffusion pass, verified, its KV committed",
    "UnoWorkerV2": "UNO: one model with a LoRA drafter; linear or tree verify, 2 tokens not drafts",
    "DSparkWorkerV2": "DSPARK: block draft, ragged (confidence-capped) verify, deferred commit",
    "EAGLEWorker": "the V1 EAGLE worker of releases up to 0.5.12",
}
"""Worker classes ``create_worker`` can return whose decode step specobs times."""

UNSUPPORTED_WORKERS: dict[str, str] = {}
"""Worker classes ``create_worker`` can return that specobs reports as unsupported, and why
(0.5.23: none; read at run time, so a class added here is reported with its reason)."""

_WAY_OUT = (
    "Use EAGLE, EAGLE3, NEXTN, STANDALONE, FROZEN_KV_MTP, NGRAM, DFLASH, UNO or DSPARK "
    "speculative decoding to get the cycle breakdown, or time the loop by hand with "
    "specobs.Observer (docs/integrations.md)."
)


def _around_first_step_reporting(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Wraps an unsupported worker's step: warn once per class, then run it untouched."""
    worker = args[0] if args else None
    cls = type(worker)
    if cls not in _reported:
        _reported.add(cls)
        try:
            _report_unsupported(cls, worker)
        except Exception:
            _failed("the unsupported-worker report")
    return original(*args, **kwargs)


_reported: set[type] = set()


def _report_unsupported(cls: type, worker: Any) -> None:
    name = cls.__name__
    reason = UNSUPPORTED_WORKERS.get(name, "specobs has no hooks for its decode step")
    what = f"the speculative worker {cls.__module__}.{cls.__qualname__} ({reason})"
    instrumentor = SGLangInstrumentor()
    if instrumentor._unsupported_reported:
        # report_unsupported warns once per process; a second class still gets its own line.
        _log.warning("specobs does not time %s. %s", what, _WAY_OUT)
        return
    instrumentor.report_unsupported(what, _WAY_OUT, topology=topology_of(worker))


def is_hooked(worker_class: type) -> bool:
    """Whether ``worker_class``'s decode step resolves to a specobs cycle hook."""
    step = getattr(worker_class, "forward_batch_generation", None)
    return _is_cycle(_base.hook_of(step))


def _create_worker_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Wraps ``create_worker``: an unhooked class gets the once-per-class unsupported report."""
    worker_class = original(*args, **kwargs)
    try:
        if isinstance(worker_class, type) and not is_hooked(worker_class):
            SGLangInstrumentor()._report_on_first_step(worker_class)
    except Exception:
        _failed("the worker class check (create_worker)")
    return worker_class


# -- the two ways in -------------------------------------------------------------------------------


def watched_modules() -> tuple[str, ...]:
    """The SGLang modules whose import triggers patching (none is imported by specobs)."""
    names = dict.fromkeys(target.module for target in HOOK_TARGETS)
    names.update(dict.fromkeys(module for module, _ in WORKER_FACTORIES))
    return tuple(names)


def sglang_plugin() -> None:
    """The ``sglang.srt.plugins`` entry point: instruments SGLang when SPECOBS_SGLANG=1.

    SGLang calls it in every process it starts. It imports no SGLang module; the classes are
    patched when SGLang imports them (in the scheduler processes), and the observer is built on
    the first decode step by the recording process (:func:`topology_of`).
    """
    if not _enabled():
        return
    try:
        SGLangInstrumentor().instrument()
    except Exception:
        _log.exception("specobs could not instrument SGLang; SGLang runs unchanged.")


class SGLangInstrumentor(_base.BaseInstrumentor):
    """Patches SGLang's speculative workers restorably, as SGLang imports them."""

    package = PACKAGE
    integration = "sglang"

    def instrument(self, *, observer: Observer | None = None, skip_dep_check: bool = False) -> bool:
        """Patch the speculative workers (now, or when imported); ``False`` when unsupported."""
        return self._instrument_checked(observer, skip_dep_check)

    def _instrument(self) -> None:
        self._watch(watched_modules())

    def _uninstrument(self) -> None:
        _reported.clear()

    def _patch_module(self, module: Any) -> None:
        """Wrap this module's worker factories and hook targets."""
        name = module.__name__
        for factory_module, factory in WORKER_FACTORIES:
            owner = getattr(module, factory, None) if factory_module == name else None
            if owner is not None and "create_worker" in vars(owner):
                self._patch_around(owner, "create_worker", _create_worker_hook)
        for target in HOOK_TARGETS:
            owner = None
            if target.module == name:
                owner = getattr(module, target.owner, None) if target.owner else module
            if owner is not None and target.method in vars(owner):
                self._patch_around(owner, target.method, target.hook)

    def _report_on_first_step(self, worker_class: type) -> None:
        """Wrap an unhooked worker class's step so its first call reports it (restorably)."""
        with self._lock:
            if not self._instrumented:
                return
            step = getattr(worker_class, "forward_batch_generation", None)
            if step is None:
                return
            if _base.hook_of(step) is _around_first_step_reporting:
                return
            self._patch_around(
                worker_class, "forward_batch_generation", _around_first_step_reporting
            )


def _is_cycle(hook: Callable[..., Any]) -> bool:
    return hook in (
        around_decode_step, around_plain_step, around_ngram_step,
        around_dflash_step, around_uno_step, around_dspark_step,
    )  # fmt: skip
