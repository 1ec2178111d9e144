"""Batched EAGLE-3-style speculative decoding over the demo's target and draft head.

One speculative cycle over the active sequences (``step()``):

- draft: the head first consumes the target features of the positions verified last cycle (all
  of them in one block), then chains ``k - 1`` more single-token steps on its own hidden state;
- verify: ONE target forward over ``[pending token, d_1 .. d_k]`` (k + 1 positions) per sequence;
- bookkeeping: greedy acceptance of the longest matching prefix plus the target's bonus token,
  KV "rollback" by per-slot lengths, the one host sync, and handing tokens to requests.

New requests are prefilled before the cycle (prefill is not a speculative cycle). Greedy output is
token-for-token the target's plain greedy decoding (:func:`greedy_generate`). On CUDA the draft
chain and the verify forward are captured as CUDA graphs per batch bucket, and every forward
runs its float32 matmuls in TF32 (:func:`~specobs.demo._model.serving_matmuls`).

This module schedules: it admits requests, runs the cycle's phases in order, counts and hands
tokens to requests (:mod:`._request`). The tensors and the forwards are :mod:`._forwards`'s,
their CUDA graphs :mod:`._cuda_graphs`'s.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

import specobs

from ._cuda_graphs import EngineGraphs
from ._draft import DraftHead
from ._forwards import SpecForwards
from ._model import (
    TargetModel,
    WordTokenizer,
    serving_matmuls,
    validate_max_tokens,
    validate_prompt,
)
from ._request import EngineStats, RequestHandle

__all__ = ["FAULTS", "EngineStats", "RequestHandle", "SpecDecodeEngine"]

_log = logging.getLogger("specobs.demo")

FAULTS = (None, "wrong-hidden-layers", "slow-verify", "stall", "sync-between-phases")
"""Values ``SpecDecodeEngine.fault`` accepts."""


def _check_sizes(
    k: int, max_batch: int, slow_verify_repeats: int, sync_stall_seconds: float
) -> None:
    """Raise ``ValueError`` for an engine size or fault setting out of range."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    if not isinstance(slow_verify_repeats, int) or slow_verify_repeats < 1:
        raise ValueError(
            f"slow_verify_repeats must be an int >= 1, got {slow_verify_repeats!r}"
        )
    if not (isinstance(sync_stall_seconds, (int, float)) and not isinstance(
            sync_stall_seconds, bool) and 0 <= sync_stall_seconds <= 1):
        raise ValueError(
            f"sync_stall_seconds must be a number of seconds in [0, 1], got "
            f"{sync_stall_seconds!r}"
        )


def _miswired_layers(layer_ids: tuple[int, ...], n_layers: int) -> tuple[int, ...]:
    """The layers the ``wrong-hidden-layers`` fault feeds the draft: the mis-wiring a real
    deployment gets by reading layers off the wrong end of the stack."""
    n = n_layers
    wrong = (n - 1, max(0, n - 2), 0)
    return wrong if layer_ids != wrong else (0, 1 % n, 2 % n)


@dataclasses.dataclass
class _Slot:
    request: RequestHandle
    target_len: int  # tokens in the target KV cache; the pending token sits at this position
    draft_start: int  # first position whose target features the draft has not consumed yet
    pending_count: int  # positions draft_start .. draft_start + pending_count - 1
    emitted: int = 0


#: What an engine without an observer records into: a disabled observer, whose cycles are
#: the public no-op ``CycleHandle`` (no thread, no sink, nothing counted).
_UNOBSERVED = specobs.configure(enabled=False, sinks=[], env={})


class SpecDecodeEngine:
    """Batched speculative decoding with an EAGLE-3-style draft head (greedy, lossless).

    Drive it with ``step()`` from one thread (or ``run_forever(stop_event)`` / ``start()`` on a
    background thread); ``submit()`` may be called from any thread. ``fault`` may be set from any
    thread at any time: ``None``, ``"wrong-hidden-layers"`` (the draft is fed the wrong target
    layers), ``"slow-verify"`` (the verify forward runs ``1 + slow_verify_repeats`` times — real
    extra compute), ``"stall"`` (no prefill, no cycles; requests wait),
    ``"sync-between-phases"`` (what synchronize-based profiling does to a server: to time each
    phase, the host waits for the device at the end of every phase, so nothing overlaps).

    On CUDA that fault is a real ``torch.cuda.synchronize()`` at the end of each of the three
    phases. On the CPU every kernel has finished when its call returns, so a synchronize would
    cost nothing; there the fault holds the host for ``sync_stall_seconds`` at the end of each
    phase instead (the host time a device would wait through), so every phase is slower by the
    same fixed time.
    """

    def __init__(
        self,
        target: TargetModel,
        draft: DraftHead,
        tokenizer: WordTokenizer | None = None,
        *,
        k: int = 4,
        max_batch: int = 8,
        device: str | torch.device = "cpu",
        observer: Any = None,
        fault: str | None = None,
        cuda_graphs: bool | None = None,
        slow_verify_repeats: int = 3,
        sync_stall_seconds: float = 0.005,
        eos_id: int | None = None,
    ) -> None:
        _check_sizes(k, max_batch, slow_verify_repeats, sync_stall_seconds)
        self.sync_stall_seconds = float(sync_stall_seconds)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available")
        self.target = target.to(self.device).eval()
        self.draft = draft.to(self.device).eval()
        self.tokenizer = tokenizer
        self.models: Any = None  # build_engine() attaches the TrainedModels here
        self.config = target.config
        self.k = k
        self.max_batch = max_batch
        self.observer = observer
        #: A :class:`~specobs.demo._baseline.BaselineProbe` (or ``None``): measures plain
        #: decode steps of the served batch between cycles, the demo's realized-speedup baseline.
        self.baseline_probe: Any = None
        self.slow_verify_repeats = slow_verify_repeats
        self.eos_id = (
            eos_id if eos_id is not None else (tokenizer.eos_id if tokenizer is not None else None)
        )
        self.fault = fault  # validated by the property
        self.layer_ids = tuple(draft.config.layer_ids)
        self.wrong_layer_ids = _miswired_layers(self.layer_ids, self.config.n_layers)
        self._fw = SpecForwards(
            self.target, self.draft, k=k, max_batch=max_batch, device=self.device
        )
        self.target_cache = self._fw.target_cache
        self.draft_cache = self._fw.draft_cache

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting: collections.deque[RequestHandle] = collections.deque()
        self._slots: dict[int, _Slot] = {}
        self._ids = itertools.count(1)
        self._step_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._counts = collections.Counter[str]()

        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs a CUDA device, got device='cpu'")
        self.cuda_graphs = bool(cuda_graphs)
        self._graphs = (
            EngineGraphs(self._fw, self.max_batch, self.layer_ids, self.wrong_layer_ids)
            if self.cuda_graphs else None
        )

    # Public API ----------------------------------------------------------------------------
    @property
    def fault(self) -> str | None:
        return self._fault

    @fault.setter
    def fault(self, value: str | None) -> None:
        if value == "none":  # what the command line calls no fault
            value = None
        if value not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS!r}, got {value!r}")
        # A single attribute store is atomic; the worker reads it once per step.
        self._fault = value
        if value is None and hasattr(self, "_cond"):
            self.wake()

    def max_request_tokens(self) -> int:
        """Prompt plus generated tokens one request may hold (leaves room for k+1 drafts)."""
        return self.config.max_seq_len - self.k - 1

    def submit(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_tokens: int,
        *,
        eos_id: int | None = -1,
        trace_id: int | None = None,
    ) -> RequestHandle:
        """Queue a greedy completion of ``prompt_ids``; thread-safe. ``eos_id`` defaults to the
        engine's (``None``: never stop early); ``trace_id`` (the request's OpenTelemetry trace)
        goes with its acceptance to the observer. Raises ``ValueError`` for bad input."""
        limit = self.max_request_tokens()
        ids = validate_prompt(prompt_ids, self.config.vocab_size, self.config.max_seq_len)
        max_tokens = validate_max_tokens(max_tokens)
        if len(ids) > limit:
            raise ValueError(
                f"prompt is too long: expected at most {limit} tokens (max_seq_len "
                f"{self.config.max_seq_len} minus k+1 = {self.k + 1} for speculation), "
                f"got {len(ids)}"
            )
        if len(ids) + max_tokens > limit:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) is too long: expected "
                f"at most {limit} tokens in all, so max_tokens <= {limit - len(ids)}"
            )
        eos = self.eos_id if eos_id == -1 else eos_id
        with self._cond:
            if self._closed:
                raise RuntimeError("Cannot submit a request, as the engine has been closed.")
            handle = RequestHandle(next(self._ids), ids, max_tokens, eos, trace_id)
            self._waiting.append(handle)
            self._counts["requests_submitted"] += 1
            self._cond.notify_all()
        return handle

    def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, timeout: float | None = None
    ) -> list[int]:
        """Submit and wait; drives ``step()`` itself when no background thread runs."""
        handle = self.submit(prompt_ids, max_tokens)
        if self._thread is None:
            while not handle.done:
                self.step()
        return handle.wait(timeout)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._slots)

    def stats(self) -> EngineStats:
        with self._lock:
            c = self._counts
            return EngineStats(
                cycles=c["cycles"],
                prefills=c["prefills"],
                requests_submitted=c["requests_submitted"],
                requests_finished=c["requests_finished"],
                active=len(self._slots),
                waiting=len(self._waiting),
                draft_tokens=c["draft_tokens"],
                accepted_tokens=c["accepted_tokens"],
                emitted_tokens=c["emitted_tokens"],
                sequence_cycles=c["sequence_cycles"],
                k=self.k,
                fault=self._fault,
            )

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run_forever(self, stop_event: threading.Event, idle_wait_seconds: float = 0.1) -> None:
        """Step until ``stop_event`` is set; sleeps on a condition while there is nothing to do
        (or while stalled). An exception in a step fails the requests in flight, not the loop."""
        while not stop_event.is_set():
            if self._fault == "stall" or not self.has_work():
                with self._cond:
                    if not stop_event.is_set() and (
                        self._fault == "stall" or not (self._waiting or self._slots)
                    ):
                        self._cond.wait(idle_wait_seconds)
                continue
            try:
                self.step()
            except Exception as exc:
                _log.exception("speculative decoding step failed; failing requests in flight")
                self._fail_all(exc)

    def start(self) -> threading.Thread:
        """Run ``run_forever`` on a daemon thread named ``specobs-demo-engine``."""
        if self._thread is not None:
            raise RuntimeError("the engine's thread is already running")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run_forever, args=(self._stop,), name="specobs-demo-engine", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Stop the thread started by ``start()`` (requests stay queued)."""
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
            self._thread = None

    def close(self, timeout_seconds: float = 5.0) -> None:
        """Stop, refuse new requests and cancel the ones not finished."""
        self.stop(timeout_seconds)
        with self._cond:
            self._closed = True
            pending = list(self._waiting) + [s.request for s in self._slots.values()]
            self._waiting.clear()
            self._slots.clear()
        for req in pending:
            req._emit([], "cancelled")

    def load_draft_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy new draft-head weights in between cycles (a draft still training in the
        background publishes through this). The copy is in place, so captured CUDA graphs stay
        valid; keys and values already in the draft's KV cache were made by the old weights and
        only cost acceptance, never correctness (the target verifies every token)."""
        own = self.draft.state_dict()
        if set(state) != set(own):
            raise ValueError(
                f"draft state has keys {sorted(state)}, expected {sorted(own)}"
            )
        for name, value in state.items():
            if value.shape != own[name].shape:
                raise ValueError(
                    f"draft state {name!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(own[name].shape)}"
                )
        with self._step_lock, torch.no_grad():
            for name, value in state.items():
                own[name].copy_(value, non_blocking=False)

    # One step ------------------------------------------------------------------------------
    def step(self) -> bool:
        """Prefill newly admitted requests, then run one speculative cycle over all active
        sequences. Returns whether a cycle ran."""
        with self._step_lock, torch.inference_mode(), serving_matmuls(self.device):
            fault = self._fault
            if fault == "stall":
                return False
            self._drop_cancelled()
            admitted = self._admit()
            if admitted:
                self._prefill(admitted, fault)
            with self._lock:
                active = sorted(self._slots)
                positions = [self._slots[s].target_len for s in active]
            if not active:
                return False
            self._cycle(active, fault)
            probe = self.baseline_probe
            if probe is not None:
                # After the cycle, outside it: a plain decode step of the same sequences.
                probe.after_cycle(self._fw.last_tokens(active), positions)
            return True

    def _drop_cancelled(self) -> None:
        with self._lock:
            gone = [s for s, st in self._slots.items() if st.request._cancelled]
            cancelled = [self._slots.pop(s).request for s in gone]
            waiting = [r for r in self._waiting if r._cancelled]
            for r in waiting:
                self._waiting.remove(r)
            self._counts["requests_finished"] += len(cancelled) + len(waiting)
        for req in [*cancelled, *waiting]:
            req._emit([], "cancelled")

    def _admit(self) -> list[tuple[int, RequestHandle]]:
        with self._lock:
            free = [s for s in range(self.max_batch) if s not in self._slots]
            out = []
            while free and self._waiting:
                out.append((free.pop(0), self._waiting.popleft()))
            return out

    def _layers(self, fault: str | None) -> tuple[int, ...]:
        return self.wrong_layer_ids if fault == "wrong-hidden-layers" else self.layer_ids

    def _prefill(self, admitted: list[tuple[int, RequestHandle]], fault: str | None) -> None:
        first = self._fw.prefill(
            [s for s, _ in admitted], [r.prompt_ids for _, r in admitted], self._layers(fault)
        )
        with self._lock:
            self._counts["prefills"] += 1
            for slot, req in admitted:
                n = len(req.prompt_ids)
                self._fw.set_lengths(slot, n, n - 1)
                self._slots[slot] = _Slot(req, target_len=n, draft_start=n - 1, pending_count=1)
        self._deliver([(slot, [tok]) for (slot, _), tok in zip(admitted, first, strict=True)])

    def _deliver(self, batch: list[tuple[int, list[int]]]) -> None:
        """Hand new tokens to the slots' requests, truncated at max_tokens / eos, and free the
        slots of finished requests. Requests are told after the engine lock is released, so a
        token callback may call back into the engine."""
        out: list[tuple[RequestHandle, list[int], str | None]] = []
        finished = []
        for slot, new in batch:
            st = self._slots[slot]
            req = st.request
            reason = None
            if req.eos_id is not None and req.eos_id in new:
                new = new[: new.index(req.eos_id)]
                reason = "stop"
            room = req.max_tokens - st.emitted
            if len(new) >= room:
                new = new[:room]
                reason = reason or "length"
            st.emitted += len(new)
            out.append((req, new, reason))
            if reason is not None:
                finished.append(slot)
        with self._lock:
            self._counts["emitted_tokens"] += sum(len(new) for _, new, _ in out)
            for s in finished:
                self._slots.pop(s, None)
            self._counts["requests_finished"] += len(finished)
        # Each completion is a request: its drafts over its whole life (the call never raises;
        # an observer of the engine's own kind may not take requests).
        report = getattr(self.observer, "request_finished", None)
        for req, new, reason in out:
            if reason is not None and report is not None:
                report(drafted=req.drafted_tokens, accepted=req.accepted_tokens,
                       trace_id=req.trace_id)
            req._emit(new, reason)

    def _cycle(self, active: list[int], fault: str | None) -> None:
        k = self.k
        b = len(active)
        states = [self._slots[s] for s in active]
        observer = self.observer
        cycle_cm = (observer if observer is not None else _UNOBSERVED).cycle(batch_size=b)
        with cycle_cm as cyc:
            # -- draft ---------------------------------------------------------------------
            slots_h = torch.tensor(active)
            start_h = torch.tensor([st.draft_start for st in states])
            tlen_h = torch.tensor([st.target_len for st in states])
            if self._graphs is not None:
                draft_tokens = self._graphs.draft(slots_h, start_h)
            else:
                attend = max(st.target_len for st in states) + k + 1
                draft_tokens = self._fw.draft_chain(
                    slots_h,
                    start_h,
                    attend_len=attend,
                    q_len=max(st.pending_count for st in states),
                )
            if fault == "sync-between-phases":
                self._sync_between_phases()
            cyc.mark("verify")
            # -- verify --------------------------------------------------------------------
            repeats = 1 + (self.slow_verify_repeats if fault == "slow-verify" else 0)
            layers = self._layers(fault)
            for _ in range(repeats):
                # Repeats rewrite the same KV entries with the same values: real extra work,
                # same result.
                if self._graphs is not None:
                    preds, hidden = self._graphs.verify(slots_h, tlen_h, draft_tokens, layers)
                else:
                    attend = max(st.target_len for st in states) + k + 1
                    preds, hidden = self._fw.verify(
                        slots_h, tlen_h, draft_tokens, layers, attend_len=attend
                    )
            if fault == "sync-between-phases":
                self._sync_between_phases()
            cyc.mark("bookkeeping")
            # -- bookkeeping ---------------------------------------------------------------
            match = (draft_tokens == preds[:, :k]).to(torch.long)
            accepted = match.cumprod(dim=1).sum(dim=1)
            self._fw.keep_pending(slots_h, hidden, preds, accepted)
            # The one host sync of the cycle, as in real servers: tokens must reach requests.
            acc_host = accepted.cpu()
            preds_host = preds.cpu().tolist()
            acc_list = acc_host.tolist()
            with self._lock:
                self._counts["cycles"] += 1
                self._counts["sequence_cycles"] += b
                self._counts["draft_tokens"] += b * k
                self._counts["accepted_tokens"] += sum(acc_list)
            for slot, st, a in zip(active, states, acc_list, strict=True):
                st.request.drafted_tokens += k
                st.request.accepted_tokens += a
                st.draft_start = st.target_len
                st.pending_count = a + 1
                st.target_len += a + 1
                self._fw.set_lengths(slot, st.target_len, st.draft_start)
            self._deliver(
                [
                    (slot, row[: a + 1])
                    for slot, a, row in zip(active, acc_list, preds_host, strict=True)
                ]
            )
            cyc.accept(acc_host, draft_length=k)
            if fault == "sync-between-phases":
                self._sync_between_phases()

    def _sync_between_phases(self) -> None:
        """The ``sync-between-phases`` fault at the end of one phase (see the class docstring)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.sync_stall_seconds > 0:
            time.sleep(self.sync_stall_seconds)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            reqs = [st.request for st in self._slots.values()]
            self._slots.clear()
            self._counts["requests_finished"] += len(reqs)
        for r in reqs:
            r._fail(exc)
