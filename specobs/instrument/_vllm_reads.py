"""What specobs reads from vLLM's own objects: plain functions, no state, no hooks.

The vLLM plugin's hooks (:mod:`specobs.instrument.vllm`) and the per-thread topologies
(:mod:`specobs.instrument._vllm_topologies`) call these on the runner, the scheduler and the
objects vLLM passes between them. Each mirrors one piece of vLLM's own code, named in its
docstring, so it can be checked against the pinned releases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specobs.instrument import _base

__all__ = [
    "PLACEHOLDER_TOKEN_ID", "PLAIN_ATTRIBUTE", "V2_PHASES", "HostRow", "counted_row", "decodes",
    "drafted_length", "host_counts", "host_rows", "is_plain", "kept_tokens", "row_request",
    "speculates", "topology", "v1_accepted", "v1_phase_order", "v2_accepted",
    "valid_draft_lengths",
]  # fmt: skip

PLACEHOLDER_TOKEN_ID = -1
"""What vLLM's V1 rejection sampler writes where a draft token was rejected."""

V2_PHASES = ("verify", "bookkeeping", "draft")
"""Model runner V2 always updates its state before it proposes the next drafts."""


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


def v1_accepted(sampled: Any) -> Any:
    """V1: valid tokens per request minus the bonus token."""
    return ((sampled != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1).clamp_(min=0)


def v2_accepted(num_sampled: Any) -> Any:
    """V2: sampled tokens are the accepted drafts plus the bonus token (0 for a request still
    in chunked prefill)."""
    return (num_sampled - 1).clamp_(min=0)


PLAIN_ATTRIBUTE = "specobs_plain"
"""Set by the engine core on a ``SchedulerOutput`` that schedules no drafts but decodes at least
one request (``Scheduler.schedule``'s hook): a plain decode step under the speculative config -- a
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


def speculates(scheduler: Any) -> bool:
    """Whether the scheduler runs with a speculative config (vLLM keeps ``num_spec_tokens``; a
    batch-size schedule may set it per step, to 0 included)."""
    return bool(getattr(scheduler, "num_spec_tokens", 0)) or (
        getattr(scheduler, "dynamic_sd_lookup", None) is not None
    )


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
        drafted -= int(invalid.get(row_request(args, kwargs), 0))
    return max(int(drafted), 0), int(accepted)


def row_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The request id of one ``make_spec_decoding_stats`` call (``None`` before releases that
    pass it)."""
    return kwargs.get("request_id") if len(args) < 6 else args[5]
