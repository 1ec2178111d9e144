"""What specobs reads from SGLang's own objects: plain functions, no state, no hooks.

The SGLang plugin's hooks (:mod:`specobs.instrument.sglang`) and the places a step is settled
(:mod:`specobs.instrument._sglang_topologies`) call these on a worker, its batch and the
``GenerationBatchResult`` its step returns. Per-row values still on the GPU are never read:
reading them would synchronize the worker's stream.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACCEPTED_PER_REQUEST_FIELDS", "accepted_counts", "dflash_draft_length", "dspark_draft_length",
    "eagle_draft_length", "exact", "first_batch", "has_decode_rows", "host_list", "is_decode",
    "max_draft_length", "ngram_draft_length", "non_draft", "output_len", "uno_draft_length",
    "verified_widths",
]  # fmt: skip

ACCEPTED_PER_REQUEST_FIELDS = (
    "num_correct_drafts_per_req_cpu",  # 0.5.12 and later
    "num_accepted_drafts_per_req_cpu",  # 0.5.11
    "accept_length_per_req_cpu",  # up to 0.5.10 (since 0.5.19 also a dLLM field, never EAGLE's)
)
"""Names, newest first, of the per-request accepted-draft counts (bonus token excluded)."""



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
    (:func:`verified_widths`)."""
    return max(int(worker.verify_num_draft_tokens) - 1, 0)


_MAX_DRAFT_LENGTH_LIMIT = 64  # specobs' own bound on max_draft_length


def max_draft_length(worker: Any, now: int) -> int | None:
    configured = getattr(worker, "speculative_num_draft_tokens", None)
    longest = max(now, int(configured) - 1 if configured is not None else 0)
    return min(longest, _MAX_DRAFT_LENGTH_LIMIT) if longest > 8 else None



def is_decode(batch: Any) -> bool:
    """A decode step the worker's own step runs as draft, verify, draft extend.

    With DP attention a batch is flagged ``is_extend_in_batch`` when any rank of the group
    prefills; the worker then runs the step as prefill, except with
    ``SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1``, where a decode rank's cycle goes through
    ``_forward_dp_spec_prefill_coordination`` (its own hook: :func:`has_decode_rows`).
    """
    if getattr(batch, "is_extend_in_batch", False):
        return False
    return has_decode_rows(batch)


def has_decode_rows(batch: Any) -> bool:
    """Neither prefill nor idle on this rank, whatever the peers of its DP group do."""
    mode = batch.forward_mode
    if mode.is_extend():
        return False
    is_idle = getattr(mode, "is_idle", None)
    return not (is_idle is not None and is_idle())


def non_draft(result: Any) -> int:
    """Tokens per request a step emits that were not drafts: the bonus token, and UNO's clean
    root too (``GenerationBatchResult.num_non_draft_tokens_per_req``: 1, UNO 2)."""
    n = getattr(result, "num_non_draft_tokens_per_req", 1)
    return n if type(n) is int and n >= 0 else 1


def accepted_counts(result: Any) -> Any:
    for name in ACCEPTED_PER_REQUEST_FIELDS:
        value = getattr(result, name, None)
        if value is not None:
            return value
    accept_lens = getattr(result, "accept_lens", None)
    if accept_lens is not None:
        # Includes the non-draft tokens. On the GPU this is one tiny kernel queued on the
        # worker's stream; specobs copies the result to pinned memory asynchronously and reads
        # it later.
        return accept_lens - non_draft(result)
    return None


def host_list(value: Any, *, processed: bool = False) -> list[int] | None:
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


def verified_widths(result: Any, k: int, *, processed: bool = False) -> int | list[int] | None:
    """Drafts verified per request: ``k`` for every row, else, when the step planned a ragged
    verify (DSPARK's ``cap_lens``: each row's verify window, the anchor included), each row's
    window less the anchor. ``None``: the windows are still on the GPU."""
    caps = getattr(result, "cap_lens", None)
    if caps is None:
        return k
    widths = host_list(caps, processed=processed)
    return None if widths is None else [max(int(w) - 1, 0) for w in widths]


def exact(
    result: Any, k: int, *, processed: bool = False
) -> tuple[Any, int | list[int], int | None] | None:
    """``(accepted, draft lengths, emitted)`` of every row of a step's result, as ``accept``
    takes them (``emitted`` ``None``: accepted + 1 per row); ``None`` when counting them exactly
    would need values still on the GPU (the cycle keeps its times, without tokens)."""
    accepted = accepted_counts(result)
    if accepted is None:
        return None
    n = non_draft(result)
    widths = verified_widths(result, k, processed=processed)
    if n == 1 and type(widths) is int:
        return accepted, widths, None
    counts = host_list(accepted, processed=processed)
    if counts is None or widths is None:
        return None
    if type(widths) is list and len(widths) != len(counts):
        return None
    return counts, widths, sum(counts) + n * len(counts)


def first_batch(kwargs: dict[str, Any]) -> Any:
    for name in ("batch", "model_worker_batch"):
        if name in kwargs:
            return kwargs[name]
    raise TypeError("forward_batch_generation() called without a batch")


def output_len(req: Any) -> int:
    """The request's output tokens as SGLang returns them: through its stop, when it has one."""
    through_stop = getattr(req, "output_ids_through_stop", None)
    return len(through_stop if through_stop is not None else req.output_ids)

