"""vLLM: a ``vllm.general_plugins`` plugin timing every speculative step of the v1 GPU runner.

Turn it on with ``SPECOBS_VLLM=1`` (``pip install specobs`` registers the entry point). vLLM's
``load_general_plugins()`` runs :func:`vllm_plugin` in every process it starts (API server,
engine core, workers); the plugin patches ``GPUModelRunner`` in place, restorably.

Seams, read from ``vllm/v1/worker/gpu_model_runner.py`` of the pinned release (0.33.0):

- ``GPUModelRunner.execute_model(scheduler_output, intermediate_tensors=None)`` runs the target
  forward over each request's last token plus its draft tokens (**verify** starts here);
- ``GPUModelRunner.sample_tokens(grammar_output)`` then calls ``_sample(logits,
  spec_decode_metadata)`` (the rejection sampler, still verify), ``propose_draft_token_ids(...)``
  (**draft**, for the next step) and ``_bookkeeping_sync(...)`` (**bookkeeping**). Drafters that
  run on the GPU (EAGLE, draft models) propose before bookkeeping; CPU drafters (n-gram) after.
  specobs learns that order from the first speculative step and names the phases in it.
- A step is a cycle when the scheduler sent draft tokens to verify
  (``scheduler_output.scheduled_spec_decode_tokens``). It ends when ``sample_tokens`` returns
  (or ``execute_model`` returns an output itself, as older releases do).
- Acceptance per request from the rejection sampler's output: the number of sampled tokens that
  are not ``PLACEHOLDER_TOKEN_ID`` (-1), minus the bonus token, computed on the GPU and handed to
  specobs as a CUDA tensor (no sync); draft lengths per request from
  ``spec_decode_metadata.num_draft_tokens``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specobs.instrument._base import DEFAULT_PHASES, BaseInstrumentor, LogOnce, PhaseTracker
from specobs.instrument._package_vllm import PACKAGE

if TYPE_CHECKING:
    from specobs import Observer

__all__ = ["SPECOBS_VLLM", "VllmInstrumentor", "vllm_plugin"]

SPECOBS_VLLM = "SPECOBS_VLLM"
"""``1`` turns the vLLM plugin on (default off: installing specobs changes nothing)."""

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
PLACEHOLDER_TOKEN_ID = -1
"""What vLLM's rejection sampler writes where a draft token was rejected."""

_failed = LogOnce()
_log = logging.getLogger("specobs.instrument")


def _enabled() -> bool:
    return os.environ.get(SPECOBS_VLLM, "").strip().lower() in ("1", "true", "yes", "on")


def _rank() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return None


class _Step:
    """The per-thread state of the runner's step in flight."""

    def __init__(self) -> None:
        self.tracker: PhaseTracker | None = None
        self.learning: list[str] | None = None  # phases in the order the first step ran them
        self.order: tuple[str, ...] | None = None
        self.draft_length: Any = None
        self.accepted: Any = None
        self.max_draft_length = 0


_local = threading.local()


def _step() -> _Step:
    step = _local.__dict__.get("step")
    if step is None:
        step = _local.step = _Step()
    return step


def _phase_seen(step: _Step, phase: str) -> None:
    if step.tracker is not None:
        step.tracker.enter(phase)
    elif step.learning is not None and phase not in step.learning:
        step.learning.append(phase)


def _finish(step: _Step) -> None:
    tracker = step.tracker
    if tracker is not None:
        step.tracker = None
        if step.accepted is not None:
            tracker.accept(step.accepted, step.draft_length)
        tracker.finish()
    elif step.learning is not None:
        seen = step.learning
        step.learning = None
        rest = [p for p in DEFAULT_PHASES if p not in seen]
        step.order = tuple(seen + rest)
    step.accepted = None
    step.draft_length = None


def around_execute_model(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The target forward: a speculative step's cycle starts here, in the verify phase."""
    step = _step()
    try:
        runner = args[0]
        scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
        if step.tracker is not None or step.learning is not None:
            _finish(step)  # the previous step never reached sample_tokens
        if runner.speculative_config is not None and scheduler_output.scheduled_spec_decode_tokens:
            _start(step, runner, len(scheduler_output.scheduled_spec_decode_tokens))
    except Exception:
        _failed("the cycle start (execute_model)")
    try:
        result = original(*args, **kwargs)
    except BaseException:
        if step.tracker is not None:
            step.tracker.abort()
            step.tracker = None
        step.learning = None
        raise
    if result is not None:
        try:
            _finish(step)  # the runner sampled inside execute_model: the step is over
        except Exception:
            _failed("the cycle end (execute_model)")
    return result


def _start(step: _Step, runner: Any, batch_size: int) -> None:
    instrumentor = VllmInstrumentor()
    k = int(runner.speculative_config.num_speculative_tokens)
    if instrumentor._observer is None and step.order is None:
        step.learning = ["verify"]
        return
    order = step.order or DEFAULT_PHASES
    max_draft_length = k if k > 8 else None
    observer = instrumentor.observer(phases=order, rank=_rank(), max_draft_length=max_draft_length)
    tracker = PhaseTracker(observer)
    tracker.start(batch_size)
    step.tracker = tracker


def around_sample(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The rejection sampler: still verify; acceptance per request is read from its output."""
    result = original(*args, **kwargs)
    step = _step()
    if step.tracker is not None:
        try:
            metadata = args[2] if len(args) > 2 else kwargs.get("spec_decode_metadata")
            if metadata is not None:
                sampled = result.sampled_token_ids
                # Valid tokens per request minus the bonus token: a few tiny kernels queued on
                # the runner's stream, no sync; specobs copies the result to the host later.
                accepted = (sampled != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1
                step.accepted = accepted.clamp_(min=0)
                step.draft_length = list(metadata.num_draft_tokens)
        except Exception:
            _failed("acceptance (_sample)")
    return result


def _around_phase(phase: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        step = _local.__dict__.get("step")
        if step is not None:
            try:
                _phase_seen(step, phase)
            except Exception:
                _failed(f"the {phase} phase start")
        return original(*args, **kwargs)

    return hook


around_propose_draft_token_ids = _around_phase("draft")
around_bookkeeping_sync = _around_phase("bookkeeping")


def around_sample_tokens(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Sampling, drafting and bookkeeping of the step; the cycle ends when it returns."""
    try:
        result = original(*args, **kwargs)
    except BaseException:
        step = _local.__dict__.get("step")
        if step is not None and step.tracker is not None:
            step.tracker.abort()
            step.tracker = None
        raise
    step = _local.__dict__.get("step")
    if step is not None:
        try:
            _finish(step)
        except Exception:
            _failed("the cycle end (sample_tokens)")
    return result


HOOKS: dict[str, Callable[..., Any]] = {
    "execute_model": around_execute_model,
    "_sample": around_sample,
    "propose_draft_token_ids": around_propose_draft_token_ids,
    "_bookkeeping_sync": around_bookkeeping_sync,
    "sample_tokens": around_sample_tokens,
}
"""``GPUModelRunner`` method -> AROUND hook ``hook(original, *args, **kwargs)``."""


def vllm_plugin() -> None:
    """The ``vllm.general_plugins`` entry point: instruments the GPU runner when SPECOBS_VLLM=1.

    vLLM may call it several times per process and in every process; patching is idempotent,
    and the observer is built on the first speculative step, in the worker process only.
    """
    if not _enabled():
        return
    VllmInstrumentor().instrument()


class VllmInstrumentor(BaseInstrumentor):
    """Patches ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``; ``uninstrument`` restores it."""

    package = PACKAGE

    def instrument(self, *, observer: Observer | None = None, skip_dep_check: bool = False) -> bool:
        """Patch the runner; ``False`` (one warning) when the vLLM version is unsupported.

        With an ``observer`` its phase order is used as given; without one, the order is learned
        from the first speculative step and an observer is built from SPECOBS_* for it.
        """
        return self._instrument_checked(observer, skip_dep_check)

    def _instrument(self) -> None:
        import importlib

        runner = getattr(importlib.import_module(RUNNER_MODULE), RUNNER_CLASS)
        for method, hook in HOOKS.items():
            if method == "sample_tokens" and not hasattr(runner, method):
                continue  # releases that sample inside execute_model
            self._patch(runner, method, functools.partial(_wrap_around, hook))

    def _uninstrument(self) -> None:
        _local.__dict__.pop("step", None)


def _wrap_around(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    return wrapper
