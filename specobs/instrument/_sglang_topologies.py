"""How an SGLang worker's decode step becomes a cycle: the worker's variant and the process's place.

Two things decide what a step hook does, and neither changes from one step to the next:

- the worker's variant (:class:`WorkerStep`, one per worker class family): how many drafts a
  request verifies, whether the step runs the pipeline-parallel phase order on the last stage,
  and which batches are cycles. Each cycle hook is built around one of them.
- the process's place (:class:`SettledAtStep` and its two subclasses): where the cycle ends and
  its acceptance is read. With one pipeline stage and the scheduler's result processing hooked
  (0.5.23), a decode step's cycle is settled there with the rows SGLang counts
  (:class:`SettledByProcessing`). Under PP the last stage's result reaches the processing as
  another object, so the cycle is settled when the step returns (:class:`PipelineLastStage`),
  as on releases without that processor (:class:`SettledAtStep`).

The hooks never ask which place they run in: the first cycle in the process chooses it
(:func:`here`); patching the result processor or a new ``instrument()`` forgets the choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specobs.instrument import _base
from specobs.instrument import _sglang_reads as reads
from specobs.instrument._sglang_ranks import pp_size

__all__ = [
    "DFLASH", "DSPARK", "DSPARK_COORDINATED", "EAGLE", "EAGLE_COORDINATED", "EAGLE_PLAIN",
    "NGRAM", "PENDING_ATTRIBUTE", "PP_PHASES", "UNO", "PipelineLastStage", "SettledAtStep",
    "SettledByProcessing", "WorkerStep", "forget", "here",
]  # fmt: skip

PP_PHASES = ("verify", "bookkeeping", "draft")
"""Phase order of ``EAGLEWorkerV2`` on the last pipeline stage when ``pp_size > 1``: the
scheduler hands it the verify input relayed from earlier stages, and it drafts the next round's
chain after the draft extend (the PP tail draft)."""

PENDING_ATTRIBUTE = "_specobs_pending"
"""The attribute of a step's ``GenerationBatchResult`` holding its deferred cycle."""

_REQUEST_FIGURES = "_specobs_request"
"""The attribute of a running ``Req`` holding [drafted, accepted] of the rows specobs counted."""


@dataclass(frozen=True)
class WorkerStep:
    """One worker class family's decode step: what a cycle hook needs to know of it."""

    name: str
    draft_length: Callable[[Any], int]
    """Drafts verified per request, read from the worker (before and after its step)."""
    pp_order: bool = False
    """The last pipeline stage runs :data:`PP_PHASES` (the PP tail draft)."""
    is_cycle: Callable[[Any], bool] = reads.is_decode
    """Whether the step over this batch is a speculative cycle."""


EAGLE = WorkerStep("EAGLE", reads.eagle_draft_length, pp_order=True)
EAGLE_COORDINATED = WorkerStep(
    "EAGLE, DP prefill coordination", reads.eagle_draft_length, pp_order=True,
    is_cycle=reads.has_decode_rows,
)
EAGLE_PLAIN = WorkerStep("EAGLE without a PP tail draft", reads.eagle_draft_length)
NGRAM = WorkerStep("NGRAM", reads.ngram_draft_length)
DFLASH = WorkerStep("DFLASH", reads.dflash_draft_length)
UNO = WorkerStep("UNO", reads.uno_draft_length)
DSPARK = WorkerStep("DSPARK", reads.dspark_draft_length)
DSPARK_COORDINATED = WorkerStep(
    "DSPARK, DP prefill coordination", reads.dspark_draft_length, is_cycle=reads.has_decode_rows
)


class SettledAtStep:
    """A cycle ends when the worker's step returns; its acceptance is read from the result."""

    __slots__ = ("instrumentor",)

    def __init__(self, instrumentor: _base.BaseInstrumentor) -> None:
        self.instrumentor = instrumentor

    def phases(self, step: WorkerStep) -> tuple[str, ...]:
        """The phase order of the observer this process builds for ``step``'s worker."""
        return _base.DEFAULT_PHASES

    def step_returned(self, tracker: _base.PhaseTracker, batch: Any, result: Any, k: int) -> None:
        """End the step's cycle: ``k`` drafts per row, the rows' acceptance from ``result``."""
        counts = reads.exact(result, k)
        if counts is not None:
            tracker.accept(counts[0], counts[1], emitted=counts[2])
        tracker.finish()


class PipelineLastStage(SettledAtStep):
    """The last of several pipeline stages: the EAGLE step drafts after its bookkeeping."""

    __slots__ = ()

    def phases(self, step: WorkerStep) -> tuple[str, ...]:
        return PP_PHASES if step.pp_order else _base.DEFAULT_PHASES


class SettledByProcessing(SettledAtStep):
    """One pipeline stage, with the scheduler's result processing hooked: a decode step's
    cycle is deferred when the step returns and settled there."""

    __slots__ = ()

    def step_returned(self, tracker: _base.PhaseTracker, batch: Any, result: Any, k: int) -> None:
        """Times are final now. The rows the result processing counts (not those of requests
        that finished while the step was in flight) come later, and so does the acceptance:
        that processing copies it to the host itself, so nothing is launched on the worker's
        stream for it here."""
        pending = getattr(result, "__dict__", None)
        if pending is None or not batch.forward_mode.is_decode():
            super().step_returned(tracker, batch, result, k)
            return
        pending[PENDING_ATTRIBUTE] = (self, tracker.defer(), k)

    def settle(self, handle: Any, result: Any, k: int,
               rows: list[tuple[Any, bool, int]] | None) -> None:
        """Give a deferred step the rows the result processing counted: their accepted drafts
        (the host list it made), the drafts each verified (``k``, or DSPARK's ragged window less
        the anchor) and the tokens their outputs grew by (bonus, and UNO's clean root,
        included). ``rows``: (request, counted, output length before), ``None`` if unread."""
        counts = reads.exact(result, k, processed=rows is not None)
        if counts is None:
            handle.settle(None)
            return
        accepted, widths, emitted = counts
        if rows is None or type(accepted) is not list or len(accepted) != len(rows):
            # What the step returned, every row.
            handle.settle(accepted, draft_length=widths, emitted=emitted)
            self._report_unverified(k, widths)
            return
        live = [i for i, row in enumerate(rows) if row[1]]
        if not live:
            handle.settle(None)  # every row finished in flight: a cycle without tokens
            return
        kept = widths if isinstance(widths, int) else [widths[i] for i in live]
        emitted = sum(reads.output_len(rows[i][0]) - rows[i][2] for i in live)
        handle.settle([accepted[i] for i in live], draft_length=kept, batch_size=len(live),
                      emitted=emitted)  # fmt: skip
        self._count_requests([rows[i][0] for i in live], [accepted[i] for i in live], kept)
        self._report_unverified(k, kept)

    def _report_unverified(self, k: int, widths: Any) -> None:
        """DSPARK's ragged verify: each row verified its window, the rest of the ``k`` drafts
        it proposed were left out (``specobs_draft_tokens_unverified_total``)."""
        if isinstance(widths, int):
            return
        unverified = sum(max(k - int(w), 0) for w in widths)
        observer = self.instrumentor.current_observer if unverified else None
        if observer is not None:
            observer.drafts_unverified(unverified)

    def _count_requests(self, reqs: list[Any], accepted: list[Any], widths: Any) -> None:
        """Add a settled step's rows to their requests' figures, and report each request the
        step finished (``Req.finished()`` once the processing ran) with its drafted and
        accepted drafts over its life. Accepted is what SGLang's own
        ``spec_num_correct_drafts`` counts; drafted is what specobs counted per row (SGLang's
        ``spec_num_proposed_drafts`` is verify passes times the configured k, wrong under
        adaptive steps and ragged windows)."""
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
            self.instrumentor.report_requests(finished)


_chosen: SettledAtStep | None = None


def here(instrumentor: _base.BaseInstrumentor, worker: Any, *,
         processing_hooked: bool) -> SettledAtStep:
    """This process's place, chosen on its first cycle from the pipeline width ``worker``
    sees and whether the scheduler's result processing is hooked."""
    global _chosen
    chosen = _chosen
    if chosen is None:
        if pp_size(worker) > 1:
            chosen = PipelineLastStage(instrumentor)
        elif processing_hooked:
            chosen = SettledByProcessing(instrumentor)
        else:
            chosen = SettledAtStep(instrumentor)
        _chosen = chosen
    return chosen


def forget() -> None:
    """Choose again on the next cycle (what decides the place may have changed)."""
    global _chosen
    _chosen = None
