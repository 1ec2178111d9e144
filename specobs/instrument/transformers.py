"""Hugging Face transformers assisted generation (``model.generate(..., assistant_model=...)``).

Seams, read from ``transformers/generation/utils.py`` and ``candidate_generator.py`` (the same
in 4.57 through 5.24, see docs/integrations.md):

- ``GenerationMixin._assisted_decoding`` runs the loop. Each iteration calls
  ``candidate_generator.get_candidates(input_ids, ...)`` (**draft**), runs the target model's
  forward over the candidates (**verify**), selects the accepted tokens, crops the cache and calls
  ``candidate_generator.update_candidate_strategy(input_ids, scores, n_matches)``
  (**bookkeeping**). ``n_matches`` is the number of accepted draft tokens the loop really used.
- ``GenerationMixin._get_candidate_generator`` builds the generator for one call; specobs wraps
  that one instance's two methods, so every generator class (assistant model, prompt lookup,
  early exit, universal assisted decoding, MTP) is covered and nothing global is left behind.
- The end of the target forward is a forward hook on the target model, registered for the call
  and removed after it. It records where the forward's kernels were *launched*; the CUDA event
  specobs records there is therefore GPU-true on CUDA, and on CPU the forward has finished.

A cycle ends where the next one begins (at the next ``get_candidates``) and the last one when
the loop returns, so the selection of tokens, the stopping criteria and the kwargs update all
count as bookkeeping, and consecutive cycles share their boundary.

Each sequence of a ``generate`` call is a request: its drafted and accepted tokens, summed over
the call's cycles, are reported (``Observer.request_finished``) when the loop returns, with the
trace id of the OpenTelemetry span current on the calling thread, if any. A loop that raised
reports none.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any

from specobs.instrument._base import BaseInstrumentor, LogOnce, PhaseTracker
from specobs.instrument._package_transformers import PACKAGE

if TYPE_CHECKING:
    from specobs import Observer

__all__ = ["TransformersInstrumentor"]

_failed = LogOnce()
_active = threading.local()


class _AssistedLoop:
    """The state of one ``_assisted_decoding`` call: its cycles, driven by the loop's seams."""

    __slots__ = ("accepted_rows", "draft_length", "drafted_rows", "model", "observer",
                 "pending_matches", "thread_id", "tracker")

    def __init__(self, observer: Observer, model: Any) -> None:
        self.tracker = PhaseTracker(observer)
        self.observer = observer
        self.model = model
        self.thread_id = threading.get_ident()
        self.draft_length = 0
        # Per sequence of the call (a request each): drafted and accepted tokens over its
        # cycles. Matches given as tensors are summed when the loop returns (the loop itself
        # has read them by then: it slices with them), never synchronised mid-loop.
        self.drafted_rows: list[int] = []
        self.accepted_rows: list[int] = []
        self.pending_matches: list[Any] = []

    def draft_starts(self, input_ids: Any) -> None:
        rows = int(input_ids.shape[0])
        self.tracker.start(rows)
        self.draft_length = 0
        if len(self.drafted_rows) != rows:
            self.drafted_rows = [0] * rows
            self.accepted_rows = [0] * rows

    def draft_ends(self, input_ids: Any, candidates: Any) -> None:
        self.draft_length = int(candidates[0].shape[-1]) - int(input_ids.shape[-1])
        self.tracker.enter("verify")

    def target_forward_ends(self) -> None:
        # The assistant may be the target itself (early exit): only the forward that runs while
        # verifying ends the verify phase, and only on the loop's own thread.
        if self.tracker.phase == "verify" and threading.get_ident() == self.thread_id:
            self.tracker.enter("bookkeeping")

    def accepted(self, n_matches: Any) -> None:
        # If no forward hook fired (a compiled forward that skipped it), bookkeeping starts here.
        self.tracker.enter("bookkeeping")
        if isinstance(n_matches, int):
            accepted: Any = [n_matches]
            self.accepted_rows = [a + n_matches for a in self.accepted_rows]
        else:
            # A 0-d tensor, on the GPU when the model is: a view, copied asynchronously later.
            accepted = n_matches.reshape(1)
            self.pending_matches.append(n_matches)
        self.drafted_rows = [d + self.draft_length for d in self.drafted_rows]
        self.tracker.accept(accepted, self.draft_length)

    def finish(self) -> None:
        self.tracker.finish()

    def report_requests(self) -> None:
        """Each sequence of the call, a finished request: its drafted and accepted tokens."""
        late = sum(int(m) for m in self.pending_matches)
        trace_id = _current_trace_id()
        for drafted, accepted in zip(self.drafted_rows, self.accepted_rows, strict=True):
            self.observer.request_finished(drafted=drafted, accepted=accepted + late,
                                           trace_id=trace_id)


def _current_trace_id() -> int | None:
    """The trace id of the OpenTelemetry span current on this thread, if OpenTelemetry is in use
    (never imported here: only read when the application loaded it)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    return int(context.trace_id) if context.is_valid else None


def _wrap_get_candidates(loop: _AssistedLoop, original: Any) -> Any:
    @functools.wraps(original)
    def get_candidates(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            loop.draft_starts(input_ids)
        except Exception:
            _failed("the draft phase start (get_candidates)")
        result = original(input_ids, *args, **kwargs)
        try:
            loop.draft_ends(input_ids, result)
        except Exception:
            _failed("the draft phase end (get_candidates)")
        return result

    return get_candidates


def _wrap_update_candidate_strategy(loop: _AssistedLoop, original: Any) -> Any:
    @functools.wraps(original)
    def update_candidate_strategy(input_ids: Any, scores: Any, num_matches: Any) -> Any:
        try:
            loop.accepted(num_matches)
        except Exception:
            _failed("acceptance (update_candidate_strategy)")
        return original(input_ids, scores, num_matches)

    return update_candidate_strategy


class TransformersInstrumentor(BaseInstrumentor):
    """Reports every assisted-generation iteration of transformers as a specobs cycle.

    ``TransformersInstrumentor().instrument(observer=obs)``; without an observer one is built
    from the SPECOBS_* environment on the first cycle. ``uninstrument()`` restores
    ``GenerationMixin`` exactly.
    """

    package = PACKAGE

    def instrument(self, *, observer: Observer | None = None, skip_dep_check: bool = False) -> bool:
        """Patch transformers' assisted generation; ``False`` when the version is unsupported.

        ``skip_dep_check`` is what ``opentelemetry-instrument`` passes after its own check.
        """
        return self._instrument_checked(observer, skip_dep_check)

    def _instrument(self) -> None:
        from transformers.generation.utils import GenerationMixin

        self._patch(GenerationMixin, "_assisted_decoding", self._wrap_assisted_decoding)
        self._patch(GenerationMixin, "_get_candidate_generator", self._wrap_get_generator)

    def _wrap_assisted_decoding(self, original: Any) -> Any:
        instrumentor = self

        @functools.wraps(original)
        def _assisted_decoding(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                loop = _AssistedLoop(instrumentor.observer(), model)
                handle = model.register_forward_hook(_target_forward_hook(loop))
            except Exception:
                _failed("the start of assisted decoding")
                return original(model, *args, **kwargs)
            outer = getattr(_active, "loop", None)
            _active.loop = loop
            try:
                result = original(model, *args, **kwargs)
            except BaseException:
                _active.loop = outer
                handle.remove()
                loop.tracker.abort()
                raise
            _active.loop = outer
            handle.remove()
            try:
                loop.finish()
            except Exception:
                _failed("the end of assisted decoding")
            try:
                loop.report_requests()
            except Exception:
                _failed("the requests' acceptance (request_finished)")
            return result

        return _assisted_decoding

    def _wrap_get_generator(self, original: Any) -> Any:
        @functools.wraps(original)
        def _get_candidate_generator(model: Any, *args: Any, **kwargs: Any) -> Any:
            generator = original(model, *args, **kwargs)
            loop = getattr(_active, "loop", None)
            if loop is not None and loop.model is model:
                try:
                    generator.get_candidates = _wrap_get_candidates(loop, generator.get_candidates)
                    generator.update_candidate_strategy = _wrap_update_candidate_strategy(
                        loop, generator.update_candidate_strategy
                    )
                except Exception:
                    _failed("wrapping the candidate generator")
            return generator

        return _get_candidate_generator


def _target_forward_hook(loop: _AssistedLoop) -> Any:
    def hook(module: Any, args: Any, output: Any) -> None:
        try:
            loop.target_forward_ends()
        except Exception:
            _failed("the verify phase end (target forward hook)")

    try:
        import torch

        # Under torch.compile the hook runs eagerly after the compiled graph instead of being
        # traced into it (the loop compiles the decode forward on CUDA with a static cache).
        disable = getattr(getattr(torch, "compiler", None), "disable", None)
        if disable is not None:
            return disable(hook)
    except Exception:
        pass
    return hook
