"""The package the SGLang plugin patches and its hook table, declared without importing either.

:data:`CONTRACT` has one variant per worker class ``SpeculativeAlgorithm.create_worker`` can
return (each required where its module exists: SGLang adds and drops worker modules between
releases), plus the scheduler's result processor and the worker factories. The methods are the
worker classes; which of them specobs does not time, and why, is the SGLang instrumentor's own
``UNSUPPORTED_WORKERS`` (specobs.instrument.sglang), read when a report is made. A point with an
empty ``owner`` is a module-level function.
"""

from typing import Any

from specobs.instrument import _contract
from specobs.instrument._contract import HookPoint, Variant

PACKAGE = _contract.PackageRange("sglang", minimum="0.5.5", tested_below="0.5.24")
"""SGLang; the EAGLE worker seams (V1 up to 0.5.12, V2 throughout) hold from 0.5.5; tested
through 0.5.23."""

_SPEC = "sglang.srt.speculative."
_STEP, _EXTEND = "forward_batch_generation", "_draft_extend_for_decode"
_STEP_FIELDS = ("speculative_num_steps", "topk", "speculative_num_draft_tokens")
# The hooks take a worker method's batch by position or under either name (``batch``, up to
# 0.5.12 ``model_worker_batch``): no parameter name is part of a worker's contract.


def _worker(name: str, points: tuple[HookPoint, ...], description: str,
            requirement: str = _contract.WHERE_PRESENT) -> Variant:
    return Variant(name, requirement, points, description)


def _on(module: str, owner: str, *methods: str, **options: Any) -> tuple[HookPoint, ...]:
    """Points on the methods of one class of a ``sglang.srt.speculative`` module; ``options``
    (``fields``, ``optional``) apply to each."""
    return tuple(HookPoint(_SPEC + module, owner, method, **options) for method in methods)


EAGLE_V2 = _worker("EAGLEWorkerV2", (
    *_on("eagle_worker_v2", "EAGLEWorkerV2", _STEP, fields=_STEP_FIELDS),
    # Only releases with DP-attention prefill coordination have it; patched where present.
    *_on("eagle_worker_v2", "EAGLEWorkerV2", "_forward_dp_spec_prefill_coordination",
         optional=True),
    *_on("eagle_worker_v2", "EAGLEWorkerV2", "verify"),
    *_on("eagle_worker_v2", "EagleDraftWorker", "draft", _EXTEND),
), "EAGLE, EAGLE3 and NEXTN (sglang/srt/speculative/eagle_worker_v2.py)")

STANDALONE_V2 = _worker("StandaloneWorkerV2", (
    # A subclass of EAGLEWorkerV2: the step and verify it inherits are the hooked ones.
    *_on("standalone_worker_v2", "StandaloneWorkerV2", _STEP, "verify"),
), "STANDALONE: EAGLEWorkerV2's step, inherited")

MULTI_LAYER_V2 = _worker("MultiLayerEagleWorkerV2", (
    *_on("multi_layer_eagle_worker_v2", "MultiLayerEagleWorkerV2", _STEP, fields=_STEP_FIELDS),
    *_on("multi_layer_eagle_worker_v2", "MultiLayerEagleWorkerV2", "verify"),
    *_on("multi_layer_eagle_worker_v2", "MultiLayerEagleDraftWorker", "draft", _EXTEND),
), "EAGLE with enable_multi_layer_eagle")

FROZEN_KV_MTP_V2 = _worker("FrozenKVMTPWorkerV2", (
    *_on("frozen_kv_mtp_worker_v2", "FrozenKVMTPWorkerV2", _STEP, fields=_STEP_FIELDS),
    # Inherited from EAGLEWorkerV2 (hooked there).
    *_on("frozen_kv_mtp_worker_v2", "FrozenKVMTPWorkerV2", "verify"),
    # 0.5.12's FROZEN_KV_MTP has no draft worker class of its own: patched where present.
    *_on("frozen_kv_mtp_worker_v2", "FrozenKVMTPDraftWorker", "draft", _EXTEND, optional=True),
), "FROZEN_KV_MTP: its own step, EAGLEWorkerV2's verify")

NGRAM = _worker("NGRAMWorker", (
    *_on("ngram_worker", "NGRAMWorker", _STEP, fields=("draft_token_num",)),
    *_on("ngram_worker", "NGRAMWorker", "_prepare_for_speculative_decoding",
         "_update_ngram_corpus"),
), "NGRAM: host-side n-gram drafting, target verify, corpus update")

DFLASH_V2 = _worker("DFlashWorkerV2", (
    *_on("dflash_worker_v2", "DFlashWorkerV2", _STEP, "_update_target_mamba_state_after_verify",
         "_append_target_hidden_to_draft_kv_by_loc"),
    *_on("dflash_info", "DFlashVerifyInput", "prepare_for_verify"),
), "DFLASH (sglang/srt/speculative/dflash_worker_v2.py)")

UNO_V2 = _worker("UnoWorkerV2", (
    *_on("uno_worker_v2", "UnoWorkerV2", _STEP, "_make_forward_batch"),
    # A module-level function, wrapped as UNO's module imported it (eagle_worker_common's).
    *_on("uno_worker_v2", "", "run_eagle_verify"),
), "UNO (sglang/srt/speculative/uno_worker_v2.py)")

DSPARK_V2 = _worker("DSparkWorkerV2", (
    *_on("dspark_components.dspark_worker_v2", "DSparkWorkerV2", _STEP,
         "_forward_dp_spec_prefill_coordination", "_commit_target_mamba_states_after_verify"),
    *_on("dspark_components.dspark_draft", "DraftBlockProposer", "propose"),
), "DSPARK (sglang/srt/speculative/dspark_components/dspark_worker_v2.py)")

EAGLE_V1 = _worker("EAGLEWorker", (
    *_on("eagle_worker", "EAGLEWorker", _STEP, "draft", "verify",
         "forward_draft_extend_after_decode"),
), "the V1 EAGLE worker of releases up to 0.5.12")

RESULT_PROCESSOR = Variant("result processor", _contract.WHERE_PRESENT, (
    HookPoint("sglang.srt.managers.scheduler_components.batch_result_processor",
              "SchedulerBatchResultProcessor", "process_batch_result_decode",
              ("batch", "result")),
), "where a decode step's rows are counted (0.5.23's SchedulerBatchResultProcessor)")

WORKER_FACTORY = Variant("worker factory", _contract.WHERE_PRESENT, (
    HookPoint(_SPEC + "spec_info", "SpeculativeAlgorithm", "create_worker"),
), "create_worker: an unhooked worker class is reported on its first step")

PLUGIN_ALGORITHMS = Variant("plugin algorithms", _contract.WHERE_PRESENT, (
    HookPoint(_SPEC + "spec_registry", "CustomSpecAlgo", "create_worker"),
), "algorithms registered by plugins (0.5.11 on)")

CONTRACT = _contract.Contract(
    engine="SGLang",
    package=PACKAGE,
    variants=(EAGLE_V2, STANDALONE_V2, MULTI_LAYER_V2, FROZEN_KV_MTP_V2, NGRAM, DFLASH_V2,
              UNO_V2, DSPARK_V2, EAGLE_V1, RESULT_PROCESSOR, WORKER_FACTORY, PLUGIN_ALGORITHMS),
    methods=tuple(_contract.SpeculativeMethod(v.name, (v.name,), v.description) for v in (
        EAGLE_V2, STANDALONE_V2, MULTI_LAYER_V2, FROZEN_KV_MTP_V2, NGRAM, DFLASH_V2, UNO_V2,
        DSPARK_V2, EAGLE_V1)),
    one_of=(EAGLE_V2.name, EAGLE_V1.name),
    methods_source="the worker classes SpeculativeAlgorithm.create_worker returns "
                   "(sglang/srt/speculative/spec_info.py)",
)
"""SGLang's hook table: one variant per worker class, the result processor, the factories."""
