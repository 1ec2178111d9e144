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
(:func:`around_process_batch_result_decode`). Where a step's cycle is settled is the process's
place, and what a worker's step verifies its variant: both are objects chosen once
(:mod:`specobs.instrument._sglang_topologies`), which the hooks call without asking.

Topology (:func:`topology_of`, :mod:`specobs.instrument._sglang_ranks`): the process that
records is the TP rank 0 of the last pipeline stage of each data-parallel replica (with DP
attention: of each attention-DP group); replicas are told apart by ``dp_rank`` and get port +
``dp_rank``.
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
from specobs.instrument import _sglang_topologies as _places
from specobs.instrument._package_sglang import PACKAGE
from specobs.instrument._sglang_ranks import topology_from as topology_from
from specobs.instrument._sglang_ranks import topology_of as topology_of
from specobs.instrument._sglang_reads import (
    ACCEPTED_PER_REQUEST_FIELDS as ACCEPTED_PER_REQUEST_FIELDS,
)
from specobs.instrument._sglang_reads import dflash_draft_length as dflash_draft_length
from specobs.instrument._sglang_reads import dspark_draft_length as dspark_draft_length
from specobs.instrument._sglang_reads import eagle_draft_length as eagle_draft_length
from specobs.instrument._sglang_reads import first_batch, max_draft_length
from specobs.instrument._sglang_reads import ngram_draft_length as ngram_draft_length
from specobs.instrument._sglang_reads import uno_draft_length as uno_draft_length
from specobs.instrument._sglang_topologies import PP_PHASES as PP_PHASES
from specobs.instrument._sglang_topologies import SettledAtStep, WorkerStep

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
SPEC_REGISTRY_MODULE = _SPEC + "spec_registry"
WORKER_FACTORIES = (
    (SPEC_INFO_MODULE, "SpeculativeAlgorithm"),
    (SPEC_REGISTRY_MODULE, "CustomSpecAlgo"),
)
"""The classes whose ``create_worker`` picks the worker class the scheduler builds (built-in
algorithms, and algorithms registered by plugins)."""


_failed = _base.LogOnce()
_log = logging.getLogger("specobs.instrument")
_local = threading.local()


def _enabled(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    return env_flag(SPECOBS_SGLANG, env)


# -- the hooks: hook(original_fn, *args, **kwargs) -------------------------------------------------


def _place(worker: Any) -> SettledAtStep:
    instrumentor = SGLangInstrumentor()
    hooked = RESULT_PROCESSOR_MODULE in instrumentor._patched_modules
    return _places.here(instrumentor, worker, processing_hooked=hooked)


def _observer_for(
    worker: Any, draft_length: int, step: WorkerStep, place: SettledAtStep
) -> Observer:
    instrumentor = SGLangInstrumentor()
    observer = instrumentor.current_observer
    if observer is None:
        observer = instrumentor.observer(
            phases=place.phases(step),
            max_draft_length=max_draft_length(worker, draft_length),
            topology=topology_of(worker),
        )
    return observer


def _cycle_hook(step: WorkerStep) -> Callable[..., Any]:
    """The hook for a worker's decode step: one cycle, ended where this process's place says."""

    def around_step(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        worker, batch = args[0], (args[1] if len(args) > 1 else first_batch(kwargs))
        tracker = place = None
        try:
            # The guard: a subclass's step that calls super() is still one cycle.
            if _local.__dict__.get("tracker") is None and step.is_cycle(batch):
                place = _place(worker)
                observer = _observer_for(worker, step.draft_length(worker), step, place)
                tracker = _base.PhaseTracker(observer)
                tracker.start(int(batch.seq_lens.shape[0]))
                _local.tracker = tracker
        except Exception:
            _failed("the cycle start (forward_batch_generation)")
            tracker = None
        if tracker is None or place is None:
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
            place.step_returned(tracker, batch, result, step.draft_length(worker))
        except Exception:
            _failed("the cycle end (forward_batch_generation)")
        return result

    return around_step


def around_process_batch_result_decode(
    original: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """The scheduler processes a decode step's result: the step's deferred cycle is settled
    with the rows it counts. Under overlap scheduling a request that finished while its step
    was in flight is verified once more in the next step; ``_resolve_spec_v2_tokens`` skips
    such a row (``req.finished() or req.is_retracted``: no per-request counts, no tokens), and
    so does specobs. Emitted tokens are the growth of each row's output through its stop."""
    result = args[2] if len(args) > 2 else kwargs.get("result")
    pending = getattr(result, "__dict__", {}).pop(_places.PENDING_ATTRIBUTE, None)
    if pending is None:
        return original(*args, **kwargs)
    place, handle, k = pending
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
            place.settle(handle, result, k, None)
        except Exception:
            _failed("the cycle end (process_batch_result_decode)")
        raise
    try:
        # The host list the processing made (num_correct_drafts_per_req_cpu), else the step's
        # accept_lens less the non-draft tokens.
        place.settle(handle, result, k, rows)
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


around_decode_step = _cycle_hook(_places.EAGLE)
"""One decode step of an EAGLE-family worker (V1 or V2) is one cycle."""
around_coordinated_step = _cycle_hook(_places.EAGLE_COORDINATED)
"""``EAGLEWorkerV2._forward_dp_spec_prefill_coordination`` on a rank that decodes while a peer
of its DP-attention group prefills (``SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1``): a full
draft, verify and draft extend over this rank's decode rows, one cycle. On a prefilling rank it
drafts over an idle batch and prefills: not a cycle."""
around_plain_step = _cycle_hook(_places.EAGLE_PLAIN)
"""One decode step of an EAGLE-family worker without a PP tail draft (multi-layer, FrozenKV)."""
around_ngram_step = _cycle_hook(_places.NGRAM)
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

around_dflash_step = _cycle_hook(_places.DFLASH)
"""One decode step of ``DFlashWorkerV2`` (its block draft, verify and draft-KV commit)."""
around_uno_step = _cycle_hook(_places.UNO)
"""One decode step of ``UnoWorkerV2`` (linear or tree)."""
around_dspark_step = _cycle_hook(_places.DSPARK)
"""One decode step of ``DSparkWorkerV2``."""
around_dspark_coordinated_step = _cycle_hook(_places.DSPARK_COORDINATED)
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
        _places.forget()
        self._watch(watched_modules())

    def _uninstrument(self) -> None:
        _reported.clear()
        _places.forget()

    def _patch_module(self, module: Any) -> None:
        """Wrap this module's worker factories and hook targets."""
        name = module.__name__
        if name == RESULT_PROCESSOR_MODULE:
            _places.forget()  # a cycle settled at its step until now is settled there from now
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
