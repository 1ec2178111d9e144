"""SGLang: an ``sglang.srt.plugins`` plugin timing every EAGLE speculative decoding step.

Turn it on with ``SPECOBS_SGLANG=1`` (``pip install specobs`` registers the entry point). SGLang's
``load_plugins()`` runs :func:`sglang_plugin` early in every process; it registers AROUND hooks
in SGLang's own ``HookRegistry``, which patches the targets before the engine starts. Releases
without the plugin framework (before 0.5.11) are instrumented by calling
``SGLangInstrumentor().instrument()`` in the scheduler process instead.

Seams, read from the wheels of the pinned releases (see docs/integrations.md):

- V2 worker (``sglang.srt.speculative.eagle_worker_v2``, the default since overlap scheduling
  for speculative decoding): ``EAGLEWorkerV2.forward_batch_generation`` is one decode step (the
  cycle), ``EagleDraftWorker.draft`` the draft, ``EAGLEWorkerV2.verify`` the target forward with
  acceptance, ``EagleDraftWorker._draft_extend_for_decode`` the draft model's catch-up over the
  accepted tokens, which specobs books as bookkeeping (KV-cache and draft-state update).
- V1 worker (``sglang.srt.speculative.eagle_worker.EAGLEWorker``, up to 0.5.12):
  ``forward_batch_generation``, ``draft``, ``verify``, ``forward_draft_extend_after_decode``.
- Acceptance from the returned ``GenerationBatchResult``: the per-request CPU list under its
  three names (``accept_length_per_req_cpu`` up to 0.5.10, ``num_accepted_drafts_per_req_cpu``
  in 0.5.11, ``num_correct_drafts_per_req_cpu`` since 0.5.12), else the GPU ``accept_lens``
  (accepted drafts plus the bonus token), handed to specobs as a CUDA tensor: no sync.

Prefill (extend) and idle batches are not speculative cycles and pass straight through. Phase
boundaries record CUDA events through specobs on the stream the worker runs on, which stays
correct under CUDA graph replay, where torch module hooks never fire.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specobs.instrument._base import BaseInstrumentor, LogOnce, PhaseTracker
from specobs.instrument._package_sglang import PACKAGE

if TYPE_CHECKING:
    from specobs import Observer

__all__ = ["SPECOBS_SGLANG", "SGLangInstrumentor", "sglang_plugin"]

SPECOBS_SGLANG = "SPECOBS_SGLANG"
"""``1`` turns the SGLang plugin on (default off: installing specobs changes nothing)."""

V2_MODULE = "sglang.srt.speculative.eagle_worker_v2"
V1_MODULE = "sglang.srt.speculative.eagle_worker"

ACCEPTED_PER_REQUEST_FIELDS = (
    "num_correct_drafts_per_req_cpu",  # 0.5.12 and later
    "num_accepted_drafts_per_req_cpu",  # 0.5.11
    "accept_length_per_req_cpu",  # up to 0.5.10 (since 0.5.19 also a dLLM field, never EAGLE's)
)
"""Names, newest first, of the per-request accepted-draft counts (bonus token excluded)."""

_failed = LogOnce()
_log = logging.getLogger("specobs.instrument")
_local = threading.local()


def _enabled(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    raw = (os.environ if env is None else env).get(SPECOBS_SGLANG, "")
    return raw.strip().lower() in ("1", "true", "yes", "on")


# -- the hooks: SGLang's AROUND signature, hook(original_fn, *args, **kwargs) ----------------------


def _is_decode(batch: Any) -> bool:
    mode = batch.forward_mode
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return False
    is_idle = getattr(mode, "is_idle", None)
    return not (is_idle is not None and is_idle())


def _rank(worker: Any) -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return int(getattr(worker, "tp_rank", 0) or 0)


def _accepted(result: Any) -> Any:
    for name in ACCEPTED_PER_REQUEST_FIELDS:
        value = getattr(result, name, None)
        if value is not None:
            return value
    accept_lens = getattr(result, "accept_lens", None)
    if accept_lens is not None:
        # Includes the bonus token. On the GPU this is one tiny kernel queued on the worker's
        # stream; specobs copies the result to pinned memory asynchronously and reads it later.
        return accept_lens - 1
    return None


def around_decode_step(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One decode step of an EAGLE worker (V1 or V2) is one cycle."""
    worker, batch = args[0], (args[1] if len(args) > 1 else _first_batch(kwargs))
    tracker = None
    try:
        if _local.__dict__.get("tracker") is None and _is_decode(batch):
            k = int(worker.speculative_num_steps)
            observer = SGLangInstrumentor().observer(
                rank=_rank(worker), max_draft_length=k if k > 8 else None
            )
            tracker = PhaseTracker(observer)
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
        accepted = _accepted(result)
        if accepted is not None:
            tracker.accept(accepted, int(worker.speculative_num_steps))
        tracker.finish()
    except Exception:
        _failed("the cycle end (forward_batch_generation)")
    return result


def _first_batch(kwargs: dict[str, Any]) -> Any:
    for name in ("batch", "model_worker_batch"):
        if name in kwargs:
            return kwargs[name]
    raise TypeError("forward_batch_generation() called without a batch")


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


around_draft = _around_phase(None, "verify")
"""The draft ends where ``draft`` returns (it started with the cycle)."""
around_verify = _around_phase("verify", "bookkeeping")
"""Verify runs exactly the length of ``verify`` (also when drafting was skipped)."""
around_draft_extend = _around_phase("bookkeeping", None)
"""The draft model's catch-up over the accepted tokens is bookkeeping."""


def hook_targets(v1: bool, v2: bool) -> list[tuple[str, Callable[..., Any]]]:
    """``(dotted target, AROUND hook)`` for the worker generations present."""
    targets: list[tuple[str, Callable[..., Any]]] = []
    if v2:
        targets += [
            (
                f"{V2_MODULE}.EAGLEWorkerV2.forward_batch_generation",
                around_decode_step,
            ),
            (f"{V2_MODULE}.EagleDraftWorker.draft", around_draft),
            (f"{V2_MODULE}.EAGLEWorkerV2.verify", around_verify),
            (f"{V2_MODULE}.EagleDraftWorker._draft_extend_for_decode", around_draft_extend),
        ]
    if v1:
        targets += [
            (f"{V1_MODULE}.EAGLEWorker.forward_batch_generation", around_decode_step),
            (f"{V1_MODULE}.EAGLEWorker.draft", around_draft),
            (f"{V1_MODULE}.EAGLEWorker.verify", around_verify),
            (f"{V1_MODULE}.EAGLEWorker.forward_draft_extend_after_decode", around_draft_extend),
        ]
    return targets


def _present_workers() -> tuple[bool, bool]:
    def present(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    return present(V1_MODULE), present(V2_MODULE)


# -- the two ways in -------------------------------------------------------------------------------


def sglang_plugin() -> None:
    """The ``sglang.srt.plugins`` entry point: registers specobs' hooks when SPECOBS_SGLANG=1.

    SGLang calls it in every process it starts; the hooks record only in the process of rank 0
    (SPECOBS_ALL_RANKS=1 for all), and build their observer on the first decode step.
    """
    if not _enabled():
        return
    instrumentor = SGLangInstrumentor()
    if not instrumentor._version_supported():
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        v1, v2 = _present_workers()
        for target, hook in hook_targets(v1, v2):
            HookRegistry.register(target, hook, HookType.AROUND)
    except Exception:
        _log.exception("specobs could not register its SGLang hooks; SGLang runs unchanged.")


class SGLangInstrumentor(BaseInstrumentor):
    """Patches SGLang's EAGLE workers directly, restorably (tests, and releases before plugins).

    The plugin path (:func:`sglang_plugin`) uses SGLang's HookRegistry instead, which cannot be
    undone; both use the same hooks.
    """

    package = PACKAGE

    def instrument(self, *, observer: Observer | None = None, skip_dep_check: bool = False) -> bool:
        """Patch the EAGLE workers present; ``False`` when the SGLang version is unsupported."""
        return self._instrument_checked(observer, skip_dep_check)

    def _instrument(self) -> None:
        import importlib

        v1, v2 = _present_workers()
        for target, hook in hook_targets(v1, v2):
            module_name, class_name, method = target.rsplit(".", 2)
            owner = getattr(importlib.import_module(module_name), class_name)
            self._patch(owner, method, functools.partial(_wrap_around, hook))


def _wrap_around(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    return wrapper
