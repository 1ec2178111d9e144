"""Rows vLLM's engine core skips because their request was aborted while the step ran.

vLLM applies the aborts that arrived during a step before it processes the step's output, in
every scheduling mode (``EngineCore.step``: sample, ``_process_aborts_queue()``, then
``Scheduler.update_from_output``, which skips a request that is gone or finished), and counts
nothing of such a row. Where the worker runs on the engine core's own thread, specobs keeps the
cycle open until ``update_from_output`` and leaves the row out; where it does not (a worker
process of its own), the cycle ends when ``sample_tokens`` returns and the row stays counted
(docs/integrations.md). The real engine runs both layouts in ``tests/test_engine_vllm_cpu.py``
(offline ``LLM``: the same thread; the CPU build's OpenAI server: a worker process); here
stand-ins with V1's call order pin the two paths, and vLLM 0.33.0's own ``EngineCore.step`` the
order they rest on.
"""

from __future__ import annotations

import ast
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

import specobs
from specobs.instrument import vllm as vl_inst
from tests.test_instrument_contracts import _class, _method, _tree

VERSION = "0.33.0"
PHASES = ("verify", "bookkeeping", "draft")  # V1 with the host n-gram drafter
DRAFTS = {"a": [1, 1, 1], "b": [2, 2, 2], "c": [3, 3, 3]}
SAMPLED = {"a": [5, 6, 7], "b": [5, 6, 7, 8], "c": [9]}
"""Per request: 2 of 3 drafts accepted, all 3, none (each list ends with the bonus token)."""


def test_vllms_engine_core_applies_aborts_after_sampling_before_it_counts() -> None:
    """The order the in-thread path rests on, in the synchronous step (not only the batch
    queue's): the worker samples, then the aborts that arrived meanwhile are applied, then the
    scheduler takes the output."""
    core = _tree("vllm", VERSION, "vllm/v1/engine/core.py")
    assert core is not None
    step = ast.unparse(_method(_class(core, "EngineCore"), "step"))
    sample = step.index("self.model_executor.sample_tokens(grammar_output)")
    aborts = step.index("self._process_aborts_queue()")
    update = step.index("self.scheduler.update_from_output(scheduler_output, model_output)")
    assert sample < aborts < update
    scheduler = _tree("vllm", VERSION, vl_inst.SCHEDULER_MODULE.replace(".", "/") + ".py")
    assert scheduler is not None
    method = _method(_class(scheduler, vl_inst.SCHEDULER_CLASS), "update_from_output")
    assert [a.arg for a in method.args.args][:3] == ["self", "scheduler_output",
                                                     "model_runner_output"]  # fmt: skip
    text = ast.unparse(method)
    assert "if request is None or request.is_finished():" in text
    assert "if output_is_stale and request.drop_stale_output:" in text


class _Runner:
    """V1's ``GPUModelRunner`` seams in V1's order (host n-gram: bookkeeping before draft)."""

    def __init__(self) -> None:
        self.speculative_config = types.SimpleNamespace(
            method="ngram", num_speculative_tokens=3, disable_padded_drafter_batch=False,
            use_eagle=lambda: False, uses_draft_model=lambda: False,
            uses_extract_hidden_states=lambda: False, use_ngram_gpu=lambda: False,
        )  # fmt: skip
        self.parallel_config = types.SimpleNamespace(data_parallel_rank=0, data_parallel_size=1)
        self.max_model_len = 512
        self.requests: dict[str, Any] = {}
        self.input_batch = types.SimpleNamespace(req_ids=[])
        self._scheduled: Any = None

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> None:
        self.input_batch.req_ids = list(scheduler_output.num_scheduled_tokens)
        self._scheduled = scheduler_output

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        import torch

        rows = [SAMPLED[r] + [-1] * (4 - len(SAMPLED[r])) for r in self.input_batch.req_ids]
        return types.SimpleNamespace(sampled_token_ids=torch.tensor(rows))

    def _bookkeeping_sync(self, scheduler_output: Any, sampler_output: Any, *args: Any) -> Any:
        valid = [list(SAMPLED[r]) for r in self.input_batch.req_ids]
        for req_id, tokens in zip(self.input_batch.req_ids, valid, strict=True):
            self.requests[req_id].output_token_ids.extend(tokens)
        return None, None, None, valid, None

    def propose_draft_token_ids(self, scheduler_output: Any, sampled: Any, *args: Any) -> None:
        pass

    def sample_tokens(self, grammar_output: Any) -> str:
        scheduled = self._scheduled
        ids = self.input_batch.req_ids
        drafts = scheduled.scheduled_spec_decode_tokens
        metadata = types.SimpleNamespace(num_draft_tokens=[len(drafts.get(r, ())) for r in ids])
        sampler_output = self._sample(None, metadata)
        self._bookkeeping_sync(scheduled, sampler_output)
        self.propose_draft_token_ids(scheduled, None)
        return "model-runner-output"


class _Scheduler:
    """``Scheduler.update_from_output``'s skip: requests gone or finished count nothing."""

    def __init__(self, req_ids: list[str]) -> None:
        self.requests = {r: types.SimpleNamespace(is_finished=lambda: False) for r in req_ids}
        self.counted: list[str] = []

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> None:
        for req_id in scheduler_output.num_scheduled_tokens:
            if self.requests.get(req_id) is not None:
                self.counted.append(req_id)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[type, type]]:
    """Stand-in modules for V1's runner and the scheduler, patched by a fresh instrumentor."""
    pytest.importorskip("torch")
    modules = {
        "vllm": types.ModuleType("vllm"),
        vl_inst.V1_MODULE: types.ModuleType(vl_inst.V1_MODULE),
        vl_inst.SCHEDULER_MODULE: types.ModuleType(vl_inst.SCHEDULER_MODULE),
    }
    runner = type("GPUModelRunner", (_Runner,), {})
    scheduler = type("Scheduler", (_Scheduler,), {})
    setattr(modules[vl_inst.V1_MODULE], vl_inst.RUNNER_CLASS, runner)
    setattr(modules[vl_inst.SCHEDULER_MODULE], vl_inst.SCHEDULER_CLASS, scheduler)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    inst = vl_inst.VllmInstrumentor()
    inst.uninstrument()
    inst._observer = None
    observer = specobs.configure(sinks=[specobs.MemorySink()], clock="host", phases=PHASES)
    assert inst.instrument(observer=observer, skip_dep_check=True)
    try:
        yield runner, scheduler
    finally:
        inst.uninstrument()
        inst._observer = None
        observer.shutdown(timeout_seconds=5.0)


def _scheduler_output(drafts: dict[str, list[int]]) -> Any:
    return types.SimpleNamespace(
        scheduled_spec_decode_tokens=drafts,
        num_scheduled_tokens={r: 1 + len(drafts.get(r, ())) for r in ("a", "b", "c")},
    )


def _request() -> Any:
    params = types.SimpleNamespace(eos_token_id=2, stop_token_ids=[], max_tokens=100)
    return types.SimpleNamespace(sampling_params=params, output_token_ids=[], num_prompt_tokens=4)


def _engine_steps(runner: Any, scheduler: Any, *, with_scheduler: bool) -> None:
    """A prefill step, then three speculative steps; request b is aborted while the second one
    runs (applied after sampling, before the scheduler takes the output, as EngineCore.step
    does). ``with_scheduler=False``: the worker's thread never runs the scheduler (a worker
    process of its own)."""
    for req_id in ("a", "b", "c"):
        runner.requests[req_id] = _request()
    for i, drafts in enumerate(({}, DRAFTS, DRAFTS, {"a": DRAFTS["a"], "c": DRAFTS["c"]})):
        output = _scheduler_output(drafts)
        if i == 3:
            del output.num_scheduled_tokens["b"]
        runner.execute_model(output)
        runner.sample_tokens(None)
        if i == 2:
            scheduler.requests.pop("b")  # _process_aborts_queue()
        if with_scheduler:
            scheduler.update_from_output(output, "model-runner-output")


def _counts(observer: Any) -> dict[str, Any]:
    assert observer.force_flush(timeout_seconds=5.0)
    snap = observer.snapshot()
    assert not any(snap.errors.values()), snap.errors
    return {
        "cycles": snap.cycles_total, "drafted": snap.draft_tokens_total,
        "accepted": snap.accepted_tokens_total, "emitted": snap.emitted_tokens_total,
        "accept_length": (snap.accept_length.count, snap.accept_length.sum),
        "batch": snap.batch_size.sum,
        "phases": [snap.phase_histograms[(p, "host")].count for p in PHASES],
    }  # fmt: skip


def test_on_the_engine_cores_thread_the_row_of_a_request_aborted_mid_step_is_left_out(
    stand_ins: tuple[type, type],
) -> None:
    runner_cls, scheduler_cls = stand_ins
    runner, scheduler = runner_cls(), scheduler_cls(["a", "b", "c"])
    _engine_steps(runner, scheduler, with_scheduler=True)
    observer = vl_inst.VllmInstrumentor().current_observer
    # vLLM counted a, b, c; a, c (b's row skipped); a, c.
    assert scheduler.counted.count("b") == 2  # the prefill step and the first speculative one
    assert _counts(observer) == {
        "cycles": 3, "drafted": 9 + 6 + 6, "accepted": 5 + 2 + 2,
        "emitted": (3 + 4 + 1) + (3 + 1) + (3 + 1), "accept_length": (3 + 2 + 2, 5 + 2 + 2),
        "batch": 3 + 2 + 2, "phases": [3, 3, 3],
    }  # fmt: skip


def test_a_worker_thread_without_the_scheduler_ends_its_cycles_in_sample_tokens(
    stand_ins: tuple[type, type],
) -> None:
    """A worker in a process of its own: nothing waits for a scheduler that never comes, every
    cycle ends with its step, and the aborted request's row stays counted (the documented
    difference there)."""
    runner_cls, scheduler_cls = stand_ins
    runner, scheduler = runner_cls(), scheduler_cls(["a", "b", "c"])
    worker = threading.Thread(target=_engine_steps, args=(runner, scheduler),
                              kwargs={"with_scheduler": False})  # fmt: skip
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    observer = vl_inst.VllmInstrumentor().current_observer
    assert _counts(observer) == {
        "cycles": 3, "drafted": 9 + 9 + 6, "accepted": 5 + 5 + 2,
        "emitted": 8 + 8 + 4, "accept_length": (3 + 3 + 2, 5 + 5 + 2),
        "batch": 3 + 3 + 2, "phases": [3, 3, 3],
    }  # fmt: skip
