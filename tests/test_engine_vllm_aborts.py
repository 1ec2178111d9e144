"""Rows vLLM's engine core skips because their request was aborted while the step ran.

vLLM applies the aborts that arrived during a step before it processes the step's output, in
every scheduling mode (``EngineCore.step``: sample, ``_process_aborts_queue()``, then
``Scheduler.update_from_output``, which skips a request that is gone or finished), and counts
nothing of such a row. Where the worker runs on the engine core's own thread, specobs keeps the
cycle open until ``update_from_output`` (or defers it, with async scheduling) and leaves the row
out; where it does not (a worker process of its own), the cycle ends deferred when
``sample_tokens`` returns, and the engine core's counts of the step reach the worker on a later
scheduler output (docs/integrations.md). The real engine runs both layouts in
``tests/test_engine_vllm_cpu.py`` (offline ``LLM``: the same thread; the CPU build's OpenAI
server: a worker process); here stand-ins with V1's call order pin the paths, over vLLM 0.33.0's
own ``EngineCore.step`` / ``step_with_batch_queue``, ``MultiprocExecutor`` calls,
``SchedulerOutput`` and ``Scheduler.update_from_output``.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

from specobs.instrument import vllm as vl_inst
from tests._arithmetic import watching
from tests._vllm_stand_ins import instrumented_vllm
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
    """``Scheduler.update_from_output``'s skip and count: requests gone or finished count
    nothing; each other row that drafted is observed by ``make_spec_decoding_stats`` (vLLM's
    per-row count) and every row hands on its sampled tokens."""

    def __init__(self, req_ids: list[str]) -> None:
        self.requests = {r: types.SimpleNamespace(is_finished=lambda: False) for r in req_ids}
        self.counted: list[str] = []

    def make_spec_decoding_stats(self, stats: Any, num_draft_tokens: int,
                                 num_accepted_tokens: int) -> None:  # fmt: skip
        pass

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = []
        for req_id in scheduler_output.num_scheduled_tokens:
            if self.requests.get(req_id) is None:
                continue
            self.counted.append(req_id)
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id, ())
            if drafts:
                self.make_spec_decoding_stats(None, num_draft_tokens=len(drafts),
                                              num_accepted_tokens=len(SAMPLED[req_id]) - 1)
            outputs.append(types.SimpleNamespace(request_id=req_id,
                                                 new_token_ids=list(SAMPLED[req_id])))
        return {0: types.SimpleNamespace(outputs=outputs)}


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch,
              request: pytest.FixtureRequest) -> Iterator[tuple[type, type]]:  # fmt: skip
    """Stand-in modules for V1's runner and the scheduler, patched by a fresh instrumentor
    (the runner's base: ``_Runner``, or the test's indirect parameter)."""
    pytest.importorskip("torch")
    runner = type("GPUModelRunner", (getattr(request, "param", _Runner),), {})
    scheduler = type("Scheduler", (_Scheduler,), {})
    with instrumented_vllm(monkeypatch, vl_inst.V1_MODULE, runner, scheduler, PHASES):
        yield runner, scheduler


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
    """A worker whose engine core does not number its steps (specobs not loaded there, or a
    scheduler it does not patch): nothing waits for counts that never come, every cycle ends
    with its step as sampled, and the aborted request's row stays counted."""
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


def _watch_tensors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stand-in runner's sampled tokens (the only tensors these steps make), watched."""
    import torch

    seen: list[str] = []
    tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: watching(tensor(*a, **k), seen))
    return seen


def test_where_host_rows_replace_the_sampled_acceptance_nothing_is_launched_for_it(
    stand_ins: tuple[type, type], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """V1 without async scheduling hands its tokens to the host (``_bookkeeping_sync``), on the
    engine core's thread and on a worker's: specobs computes nothing on the runner's sampled
    tokens (on a GPU, four kernels a step on its stream, 15-25 us of the runner's time each)."""
    runner_cls, scheduler_cls = stand_ins
    seen = _watch_tensors(monkeypatch)
    _engine_steps(runner_cls(), scheduler_cls(["a", "b", "c"]), with_scheduler=True)
    _engine_steps(runner_cls(), scheduler_cls(["a", "b", "c"]), with_scheduler=False)
    assert len(seen) == 0, seen


class _HostlessRunner(_Runner):
    """Async scheduling: ``_bookkeeping_sync`` hands no host lists (the tokens stay on the GPU
    until the next step)."""

    def _bookkeeping_sync(self, scheduler_output: Any, sampler_output: Any, *args: Any) -> Any:
        super()._bookkeeping_sync(scheduler_output, sampler_output, *args)
        return None, None, None, [], None


@pytest.mark.parametrize("stand_ins", [_HostlessRunner], indirect=True)
def test_without_host_rows_or_counts_the_sampled_acceptance_is_computed_at_the_cycles_end(
    stand_ins: tuple[type, type], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker without host rows whose engine core sends no counts: each step's acceptance is
    computed as sampled (valid tokens less the bonus), once, when its cycle ends."""
    runner_cls, scheduler_cls = stand_ins
    seen = _watch_tensors(monkeypatch)
    worker = threading.Thread(target=_engine_steps,
                              args=(runner_cls(), scheduler_cls(["a", "b", "c"])),
                              kwargs={"with_scheduler": False})  # fmt: skip
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    assert [n.strip("_") for n in seen] == ["ne", "sum", "sub", "clamp"] * 3
    observer = vl_inst.VllmInstrumentor().current_observer
    assert _counts(observer)["accepted"] == 5 + 5 + 2


# -- async scheduling: the next step is launched before this one's output is taken ---------------

K = 3
EOS = 2
ASYNC_PHASES = ("verify", "draft", "bookkeeping")  # V1 with a drafter on the GPU (EAGLE)
"""Per request and step, the tokens it samples (accepted drafts plus the bonus token): a ends
with EOS in its second step; b is aborted while its second step is in flight."""
ASYNC_SAMPLED = {
    "a": [[5, 6], [7, EOS, 8], [9, 9, 9, 9], [9]],
    "b": [[5, 6, 7, 8], [5], [6, 7], [8]],
    "c": [[5], [6, 7, 8, 9], [5, 6], [7, 8, 9, 10], [11]],
}


def _wheel_engine() -> dict[str, Any]:
    """0.33.0's own ``EngineCore.step_with_batch_queue`` and ``_process_aborts_queue``,
    ``UniProcExecutor``'s calls and ``AsyncOutputFuture``, ``Scheduler.update_from_output`` with
    ``make_spec_decoding_stats`` and ``_update_request_with_output``, ``check_stop`` and
    ``SpecDecodingStats``: the async engine loop, compiled from the wheel."""
    import collections
    import dataclasses
    import time
    from concurrent.futures import Future

    from tests.test_instrument_vllm import _function, _real_code

    class AsyncModelRunnerOutput:
        pass

    class EngineCoreOutput:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    class EngineCoreOutputs:
        def __init__(self, outputs: Any = None, **fields: Any) -> None:
            self.outputs = outputs or []
            self.__dict__.update(fields)

    status = types.SimpleNamespace(
        RUNNING=1, FINISHED_STOPPED=10, FINISHED_LENGTH_CAPPED=11, FINISHED_ABORTED=12,
        FINISHED_ERROR=13, FINISHED_REPETITION=14,
    )  # fmt: skip
    namespace: dict[str, Any] = {
        "dataclass": dataclasses.dataclass, "field": dataclasses.field,
        "defaultdict": collections.defaultdict, "time": time, "Future": Future,
        "AsyncModelRunnerOutput": AsyncModelRunnerOutput, "EngineCoreOutput": EngineCoreOutput,
        "EngineCoreOutputs": EngineCoreOutputs, "RequestStatus": status,
        "remove_all": lambda items, drop: [x for x in items if x not in drop],
        "run_method": lambda obj, method, args, kwargs: getattr(obj, method)(*args, **kwargs),
        "cast": lambda kind, value: value, "Any": Any,
    }  # fmt: skip
    metrics = _tree("vllm", VERSION, "vllm/v1/spec_decode/metrics.py")
    assert metrics is not None
    _real_code("vllm/v1/spec_decode/metrics.py", [_class(metrics, "SpecDecodingStats")],
               namespace)  # fmt: skip
    utils = _tree("vllm", VERSION, "vllm/v1/core/sched/utils.py")
    assert utils is not None
    check_stop = [n for n in utils.body
                  if isinstance(n, ast.FunctionDef) and n.name == "check_stop"]  # fmt: skip
    _real_code("vllm/v1/core/sched/utils.py", check_stop, namespace)
    uniproc = _tree("vllm", VERSION, "vllm/v1/executor/uniproc_executor.py")
    assert uniproc is not None
    _real_code("vllm/v1/executor/uniproc_executor.py", [
        _class(uniproc, "AsyncOutputFuture"),
        *(_function(uniproc, "UniProcExecutor", m)
          for m in ("collective_rpc", "execute_model", "sample_tokens")),
    ], namespace)  # fmt: skip
    core = _tree("vllm", VERSION, "vllm/v1/engine/core.py")
    assert core is not None
    _real_code("vllm/v1/engine/core.py", [
        _function(core, "EngineCore", m) for m in ("step_with_batch_queue", "_process_aborts_queue")
    ], namespace)  # fmt: skip
    scheduler = _tree("vllm", VERSION, vl_inst.SCHEDULER_MODULE.replace(".", "/") + ".py")
    assert scheduler is not None
    _real_code("vllm/v1/core/sched/scheduler.py", [
        _function(scheduler, "Scheduler", m)
        for m in ("update_from_output", "make_spec_decoding_stats", "_update_request_with_output")
    ], namespace)  # fmt: skip
    return namespace


class _AsyncRunner(_Runner):
    """V1's seams with async scheduling and an EAGLE drafter: ``execute_model`` returns nothing,
    ``sample_tokens`` keeps the sampled tokens on the device (``_bookkeeping_sync`` returns no
    host lists) and hands back an async output the engine core resolves later."""

    def __init__(self, async_output: type) -> None:
        super().__init__()
        self.speculative_config = types.SimpleNamespace(
            method="eagle", num_speculative_tokens=K, disable_padded_drafter_batch=False,
            use_eagle=lambda: True, uses_draft_model=lambda: False,
            uses_extract_hidden_states=lambda: False, use_ngram_gpu=lambda: False,
        )  # fmt: skip
        self.async_output = async_output
        self.steps: dict[str, int] = {}

    def _tokens(self, req_id: str) -> list[int]:
        return list(ASYNC_SAMPLED[req_id][self.steps.get(req_id, 0)])

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        import torch

        rows = []
        for r in self.input_batch.req_ids:
            tokens = self._tokens(r)
            rows.append(tokens + [-1] * (K + 1 - len(tokens)))
        return types.SimpleNamespace(sampled_token_ids=torch.tensor(rows))

    def _bookkeeping_sync(self, scheduler_output: Any, sampler_output: Any, *args: Any) -> Any:
        return None, None, None, [], None  # async scheduling: no host lists

    def sample_tokens(self, grammar_output: Any) -> Any:
        scheduled = self._scheduled
        ids = list(self.input_batch.req_ids)
        drafts = scheduled.scheduled_spec_decode_tokens
        metadata = types.SimpleNamespace(num_draft_tokens=[len(drafts.get(r, ())) for r in ids])
        sampler_output = self._sample(None, metadata)
        self.propose_draft_token_ids(scheduled, None)
        self._bookkeeping_sync(scheduled, sampler_output)
        sampled = [self._tokens(r) for r in ids]
        for r in ids:
            self.steps[r] = self.steps.get(r, 0) + 1
        output = self._output(ids, sampled)
        return type("AsyncOutput", (self.async_output,), {"get_output": lambda s: output})()

    def _output(self, ids: list[str], sampled: list[list[int]]) -> Any:
        return types.SimpleNamespace(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None,
            prompt_logprobs_dict={}, prompt_token_id_logprobs_dict={}, pooler_output=None,
            num_nans_in_logits=None, kv_connector_output=None, ec_connector_output=None,
            cudagraph_stats=None, aux_output_connector_output=None, sampling_masks=None,
        )  # fmt: skip


class _AsyncRequest:
    """What ``update_from_output``, ``_update_request_with_output`` and ``check_stop`` read."""

    def __init__(self, req_id: str) -> None:
        self.request_id = req_id
        self.status = 1
        self.output_token_ids = [4]  # the prefill step's token
        self.num_prompt_tokens = 4
        self.max_tokens = 100
        self.sampling_params = types.SimpleNamespace(
            eos_token_id=EOS, stop_token_ids=[], min_tokens=0, repetition_detection=None,
            num_logprobs=None,
        )  # fmt: skip
        self.num_in_flight_tokens = self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        self.num_computed_tokens = 5
        self.num_output_placeholders = 0
        self.spec_decode_metrics = None
        self.has_encoder_inputs = False
        self.pooling_params = None
        self.client_index = 0
        self.stop_reason = None
        self.trace_headers = None
        self.num_nans_in_logits = 0

    def is_finished(self) -> bool:
        return self.status >= 10

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self.output_token_ids.append(token)

    def take_prefill_stats(self) -> None:
        return None

    def take_events(self) -> None:
        return None

    def get_finished_reason(self) -> int:
        return self.status


def _scheduler_state(scheduler: Any, requests: dict[str, Any], **more: Any) -> None:
    """What 0.33.0's ``update_from_output`` and the methods it calls read of the scheduler,
    with nothing connected (no KV or EC connector, no structured output, no encoder cache)."""
    nothing = lambda *args, **kwargs: None  # noqa: E731
    scheduler.__dict__.update(
        requests=requests, defer_block_free=False,
        perf_metrics=None, num_sampled_tokens_per_step=1, num_spec_tokens=K, log_stats=True,
        kv_cache_manager=types.SimpleNamespace(cache_blocks=nothing, take_events=nothing),
        structured_output_manager=types.SimpleNamespace(accept_tokens=lambda r, t: True),
        aux_output_connector=None, return_sampling_mask=False, running=[],
        grammar_compile_error_reqs={}, encoder_cache_mismatch_reqs=set(),
        recompute_kv_load_failures=False, ec_connector=None, connector=None,
        finished_req_ids_dict=None, is_mm_encoder_only=False, max_model_len=512,
        spec_decode_metrics_level=None, stats=[], emitted=[], steps=0, **more,
    )  # fmt: skip


def _async_engine(real: dict[str, Any], runner: Any, abort: dict[int, str]) -> Any:
    """An engine core with a batch queue of two over the real methods; the scheduler builds
    each step from the live requests (drafts as placeholders, as the async scheduler does)."""
    import queue

    scheduler_cls = sys.modules[vl_inst.SCHEDULER_MODULE].Scheduler
    scheduler = scheduler_cls.__new__(scheduler_cls)
    _scheduler_state(scheduler, {r: _AsyncRequest(r) for r in ASYNC_SAMPLED})
    nothing = lambda *args, **kwargs: None  # noqa: E731
    for name in ("make_spec_decoding_stats", "_update_request_with_output"):
        setattr(scheduler, name, types.MethodType(real[name], scheduler))
    # vLLM defines it on the class, where the instrumentor wraps it; bound here, wrapped here.
    scheduler.make_spec_decoding_stats = types.MethodType(
        vl_inst.counting_rows(real["make_spec_decoding_stats"]), scheduler)

    def make_stats(spec_decoding_stats: Any, *args: Any, **kwargs: Any) -> None:
        scheduler.stats.append(spec_decoding_stats)

    def free(request: Any) -> tuple[None, None]:
        scheduler.requests.pop(request.request_id, None)
        return None, None

    def schedule(throttle: Any = None) -> Any:
        live = [r for r, q in scheduler.requests.items()
                if not q.is_finished() and scheduler.steps < 5]  # fmt: skip
        scheduler.steps += 1
        for r in live:
            request = scheduler.requests[r]
            request.num_in_flight_tokens += 1 + K
            request.num_computed_tokens += 1 + K
            request.num_output_placeholders += 1 + K
        return types.SimpleNamespace(
            scheduled_spec_decode_tokens={r: [-1] * K for r in live},
            num_scheduled_tokens={r: 1 + K for r in live},
            total_num_scheduled_tokens=(1 + K) * len(live),
            pending_structured_output_tokens=False, num_invalid_spec_tokens=None,
        )  # fmt: skip

    scheduler.__dict__.update(
        make_stats=make_stats, _free_request=free,
        _handle_stopped_request=lambda request: True, build=schedule,
        has_requests=lambda: any(not q.is_finished() for q in scheduler.requests.values())
        and scheduler.steps < 5,
        get_grammar_bitmask=lambda scheduler_output: None,
    )  # fmt: skip

    executor = types.SimpleNamespace(driver_worker=runner)
    for name in ("collective_rpc", "execute_model", "sample_tokens"):
        setattr(executor, name, types.MethodType(real[name], executor))

    def abort_requests(ids: list[str]) -> None:
        for req_id in ids:
            request = scheduler.requests.pop(req_id, None)
            if request is not None:
                request.status = 12

    context = lambda *args: contextlib.nullcontext()  # noqa: E731
    core = types.SimpleNamespace(
        batch_queue=collections.deque(), batch_queue_size=2, scheduler=scheduler,
        model_executor=executor, is_mm_encoder_only=False, is_pooling_model=False,
        check_for_draft_tokens=False, aborts_queue=queue.Queue(), abort_requests=abort_requests,
        _should_throttle_prefills=lambda: False, log_error_detail=context,
        capture_iteration_details=context, _attach_iteration_details=nothing,
        _attach_weight_version=nothing,
    )  # fmt: skip
    for name in ("step_with_batch_queue", "_process_aborts_queue"):
        setattr(core, name, types.MethodType(real[name], core))
    for i in range(20):
        if i in abort:
            core.aborts_queue.put(abort[i])  # arrives while the queued steps are in flight
        outputs, _ = core.step_with_batch_queue()
        for eco in (outputs or {}).values():
            scheduler.emitted += [len(o.new_token_ids) for o in eco.outputs]
        if not core.batch_queue and not scheduler.has_requests():
            break
    return scheduler


@pytest.fixture
def async_stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Any], Any]]:
    """V1's runner seams (async scheduling) and a Scheduler class carrying 0.33.0's own
    ``update_from_output``, patched by a fresh instrumentor."""
    pytest.importorskip("torch")
    real = _wheel_engine()
    runner = type("GPUModelRunner", (_AsyncRunner,), {})
    scheduler = type("Scheduler", (), {
        "update_from_output": real["update_from_output"],
        "schedule": lambda self, throttle=False: self.build(throttle),
    })  # fmt: skip
    with instrumented_vllm(monkeypatch, vl_inst.V1_MODULE, runner, scheduler, ASYNC_PHASES):
        yield real, runner(real["AsyncModelRunnerOutput"])


def test_async_scheduling_rows_of_requests_finished_or_aborted_in_flight_count_as_vllm_counts(
    async_stand_ins: tuple[dict[str, Any], Any],
) -> None:
    """Async scheduling on the engine core's thread (UniProcExecutor): step N+1 is scheduled
    and launched before step N's output is taken, so a request that finished at N (EOS) or
    was aborted while N ran is still in N+1; ``update_from_output`` skips its rows and counts
    nothing of them. specobs defers each step's cycle at ``sample_tokens`` and settles it
    there with the rows vLLM counted: drafted, accepted, per position, emitted, equal."""
    real, runner = async_stand_ins
    # The real Scheduler defines schedule() itself (specobs marks the engine core's thread
    # there, before the first two steps run without an output taken).
    tree = _tree("vllm", VERSION, vl_inst.SCHEDULER_MODULE.replace(".", "/") + ".py")
    assert tree is not None
    assert _method(_class(tree, vl_inst.SCHEDULER_CLASS), "schedule")
    scheduler = _async_engine(real, runner, abort={2: "b"})
    vllm = _vllm_counted(scheduler)
    observer = vl_inst.VllmInstrumentor().current_observer
    snap = _snapshot_of(observer)
    verified = sum(runner.steps.values())
    assert verified > vllm["drafts"]  # rows the engine verified and skipped were there
    assert _specobs_counted(snap) == vllm
    assert snap.accept_length.sum == vllm["accepted"]
    assert snap.cycles_total == scheduler.steps
    assert snap.dropped["unsettled"] == 0
    assert not any(snap.errors.values()), snap.errors


def _snapshot_of(observer: Any) -> Any:
    assert observer.force_flush(timeout_seconds=5.0)
    return observer.snapshot()


def _vllm_counted(scheduler: Any, *, rows: bool = False) -> dict[str, Any]:
    """What vLLM counted: its SpecDecodingStats summed, the tokens it handed on (and the rows
    it handed them to)."""
    stats = [s for s in scheduler.stats if s is not None]
    out = {
        "drafts": sum(s.num_drafts for s in stats),
        "drafted": sum(s.num_draft_tokens for s in stats),
        "accepted": sum(s.num_accepted_tokens for s in stats),
        "per_pos": [sum(s.num_accepted_tokens_per_pos[i] for s in stats) for i in range(K)],
        "emitted": sum(scheduler.emitted),
    }  # fmt: skip
    if rows:
        out["rows"] = sum(scheduler.rows)
    return out


def _specobs_counted(snap: Any, *, rows: bool = False) -> dict[str, Any]:
    """The same quantities as specobs exports them (:func:`_vllm_counted`)."""
    out = {
        "drafts": snap.accept_length.count, "drafted": snap.draft_tokens_total,
        "accepted": snap.accepted_tokens_total,
        "per_pos": list(snap.accepted_by_position[:K]),
        "emitted": snap.emitted_tokens_total,
    }  # fmt: skip
    if rows:
        out["rows"] = snap.batch_size.sum
    return out


# -- a worker in a process of its own: the engine core's counts travel with the next step ---------

WORKER_SAMPLED = {
    "a": [[5, 6], [7, EOS, 8]],
    "b": [[5, 6, 7, 8], [5]],
    "c": [[5], [6, 7, 8, 9], [5, 6], [7, 8, 9, 10]],
}
"""Per request and step, the tokens it samples: a ends with EOS in its second step, b is
aborted while its second step runs, c reaches ``max_tokens`` (:data:`WORKER_MAX_TOKENS`) inside
its fourth, whose last tokens vLLM cuts. A row beyond a list (a request still in a step after
it finished: async scheduling, pipeline stages) samples the bonus token only."""
WORKER_MAX_TOKENS = {"a": 100, "b": 100, "c": 10}


def _wheel_worker_process(real: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """0.33.0's own ``SchedulerOutput`` (a dataclass, pickled to the workers with its instance
    attributes), ``EngineCore.step`` and ``MultiprocExecutor.execute_model`` /
    ``sample_tokens``, added to :func:`_wheel_engine`'s; returns the module the
    ``SchedulerOutput`` class lives in (pickle finds a class by its module)."""
    import dataclasses

    from tests.test_instrument_vllm import _function, _real_code

    module = types.ModuleType("tests._vllm_wheel_scheduler_output")
    module.__dict__.update(dataclass=dataclasses.dataclass, field=dataclasses.field)
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclass() looks it up
    output = _tree("vllm", VERSION, "vllm/v1/core/sched/output.py")
    assert output is not None
    _real_code("vllm/v1/core/sched/output.py", [_class(output, "SchedulerOutput")],
               module.__dict__)  # fmt: skip
    core = _tree("vllm", VERSION, "vllm/v1/engine/core.py")
    assert core is not None
    _real_code("vllm/v1/engine/core.py", [_function(core, "EngineCore", "step")], real)
    # step_with_batch_queue names it (``cast(Future[ModelRunnerOutput], ...)``) on the empty
    # step that tells the workers which requests finished.
    real.setdefault("ModelRunnerOutput", object)
    multiproc = _tree("vllm", VERSION, "vllm/v1/executor/multiproc_executor.py")
    assert multiproc is not None
    methods = [_function(multiproc, "MultiprocExecutor", m)
               for m in ("execute_model", "sample_tokens")]  # fmt: skip
    scope: dict[str, Any] = {"envs": types.SimpleNamespace(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=300)}
    _real_code("vllm/v1/executor/multiproc_executor.py", methods, scope)
    real["MultiprocExecutor.execute_model"] = scope["execute_model"]
    real["MultiprocExecutor.sample_tokens"] = scope["sample_tokens"]
    return module


class _WorkerProcess:
    """``MultiprocExecutor``'s workers, one of them: every call's arguments are pickled across
    (as its broadcast queue does) to a thread that never runs the scheduler, which calls the
    runner and pickles the output back (an async output resolved first, as the worker's output
    thread does)."""

    def __init__(self, runner: Any) -> None:
        import pickle
        import queue
        from concurrent.futures import Future

        self.calls: queue.Queue[tuple[bytes, Future[Any]] | None] = queue.Queue()
        self.received: list[Any] = []

        def serve() -> None:
            while (item := self.calls.get()) is not None:
                message, future = item
                method, args, kwargs = pickle.loads(message)
                try:
                    if method == "execute_model":
                        self.received.append(args[0])
                    result = getattr(runner, method)(*args, **kwargs)
                    if hasattr(result, "get_output"):
                        result = result.get_output()
                    future.set_result(pickle.loads(pickle.dumps(result)))
                except BaseException as exc:
                    future.set_exception(exc)

        self.thread = threading.Thread(target=serve, name="vllm-worker-process")
        self.thread.start()

    def collective_rpc(self, method: str, timeout: Any = None, args: tuple[Any, ...] = (),
                       kwargs: Any = None, non_block: bool = False, **_: Any) -> Any:
        import pickle
        from concurrent.futures import Future

        future: Future[Any] = Future()
        self.calls.put((pickle.dumps((method, args, kwargs or {})), future))
        return future if non_block else future.result(timeout=30)

    def close(self) -> None:
        self.calls.put(None)
        self.thread.join(30)


class _WorkerRunner(_AsyncRunner):
    """:class:`_AsyncRunner` sampling :data:`WORKER_SAMPLED`; its output pickles (a plain
    ``ModelRunnerOutput``, as a worker of its own sends it)."""

    def _tokens(self, req_id: str) -> list[int]:
        steps = WORKER_SAMPLED[req_id]
        i = self.steps.get(req_id, 0)
        return list(steps[i]) if i < len(steps) else [9]

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        super().execute_model(scheduler_output, intermediate_tensors)
        # Nothing scheduled (the step that only lists finished requests): the runner updates
        # its state and returns an empty output, sampling nothing.
        return None if scheduler_output.total_num_scheduled_tokens else self._output([], [])

    def sample_tokens(self, grammar_output: Any) -> Any:
        return super().sample_tokens(grammar_output).get_output()


def _engine_with_worker_process(
    real: dict[str, Any], output_module: Any, worker: _WorkerProcess, queue_size: int,
    abort: dict[int, str],
) -> Any:
    """An engine core over the real methods whose worker is :class:`_WorkerProcess`:
    ``EngineCore.step`` (``queue_size`` 1: no async scheduling, as the CPU build's OpenAI server
    and tensor parallelism without it) or ``step_with_batch_queue`` with a queue of
    ``queue_size`` steps (async scheduling: 2; pipeline stages: one per stage). The scheduler
    builds each step from its live requests and lists the requests finished since its last
    step in ``finished_req_ids``, as vLLM's does (that keeps the engine stepping once more after
    the last request finished: the step that carries the last counts)."""
    import queue

    scheduler_cls = sys.modules[vl_inst.SCHEDULER_MODULE].Scheduler
    scheduler = scheduler_cls.__new__(scheduler_cls)
    requests = {r: _AsyncRequest(r) for r in WORKER_SAMPLED}
    for req_id, request in requests.items():
        request.max_tokens = WORKER_MAX_TOKENS[req_id]
    _scheduler_state(scheduler, requests, rows=[], spec_steps=0, finished_req_ids=set())
    nothing = lambda *args, **kwargs: None  # noqa: E731

    def make_stats(spec_decoding_stats: Any, *args: Any, **kwargs: Any) -> None:
        scheduler.stats.append(spec_decoding_stats)

    def free(request: Any) -> tuple[None, None]:
        scheduler.requests.pop(request.request_id, None)
        scheduler.finished_req_ids.add(request.request_id)
        return None, None

    def schedule(throttle: Any = None) -> Any:
        live = [r for r, q in scheduler.requests.items() if not q.is_finished()]
        scheduler.steps += 1
        scheduler.spec_steps += bool(live)
        for r in live:
            request = scheduler.requests[r]
            request.num_in_flight_tokens += 1 + K
            request.num_computed_tokens += 1 + K
            request.num_output_placeholders += 1 + K
        finished, scheduler.finished_req_ids = scheduler.finished_req_ids, set()
        return output_module.SchedulerOutput(
            scheduled_new_reqs=[], scheduled_cached_reqs=None,
            num_scheduled_tokens={r: 1 + K for r in live},
            total_num_scheduled_tokens=(1 + K) * len(live),
            scheduled_spec_decode_tokens={r: [7] * K for r in live},
            scheduled_encoder_inputs={}, finished_req_ids=finished, free_encoder_mm_hashes=[],
        )  # fmt: skip

    scheduler.__dict__.update(
        make_stats=make_stats, _free_request=free,
        _handle_stopped_request=lambda request: True, build=schedule,
        has_requests=lambda: bool(scheduler.finished_req_ids) or any(
            not q.is_finished() for q in scheduler.requests.values()),
        get_grammar_bitmask=lambda scheduler_output: None,
    )  # fmt: skip
    executor = types.SimpleNamespace(output_rank=0, kv_output_aggregator=None,
                                     ec_output_aggregator=None,
                                     collective_rpc=worker.collective_rpc)  # fmt: skip
    for name in ("execute_model", "sample_tokens"):
        setattr(executor, name, types.MethodType(real[f"MultiprocExecutor.{name}"], executor))

    def abort_requests(ids: list[str]) -> None:
        for req_id in ids:
            request = scheduler.requests.pop(req_id, None)
            if request is not None:
                request.status = 12
                scheduler.finished_req_ids.add(req_id)

    context = lambda *args: contextlib.nullcontext()  # noqa: E731
    core = types.SimpleNamespace(
        batch_queue=collections.deque(), batch_queue_size=queue_size, scheduler=scheduler,
        model_executor=executor, is_mm_encoder_only=False, is_pooling_model=False,
        check_for_draft_tokens=False, aborts_queue=queue.Queue(), abort_requests=abort_requests,
        _should_throttle_prefills=lambda: False, log_error_detail=context,
        capture_iteration_details=context, _attach_iteration_details=nothing,
        _attach_weight_version=nothing, async_scheduling=queue_size > 1,
    )  # fmt: skip
    for name in ("step", "step_with_batch_queue", "_process_aborts_queue"):
        setattr(core, name, types.MethodType(real[name], core))
    step = core.step if queue_size == 1 else core.step_with_batch_queue
    for i in range(30):
        if i in abort:
            core.aborts_queue.put(abort[i])  # arrives while the step(s) in flight run
        outputs, _ = step()
        for eco in (outputs or {}).values():
            handed = [len(o.new_token_ids) for o in eco.outputs]
            scheduler.emitted += handed
            scheduler.rows.append(sum(n > 0 for n in handed))
        if not core.batch_queue and not scheduler.has_requests():
            break
    else:
        raise AssertionError("the engine never went idle")
    return scheduler


@pytest.fixture
def worker_process_stand_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[dict[str, Any], Any, Any]]:
    """The engine core's Scheduler class with 0.33.0's own ``update_from_output`` and
    ``make_spec_decoding_stats`` (patched on the class, where vLLM defines them), V1's runner
    seams for the worker, patched by a fresh instrumentor."""
    pytest.importorskip("torch")
    real = _wheel_engine()
    output_module = _wheel_worker_process(real, monkeypatch)
    runner = type("GPUModelRunner", (_WorkerRunner,), {})
    scheduler = type("Scheduler", (), {
        "update_from_output": real["update_from_output"],
        "make_spec_decoding_stats": real["make_spec_decoding_stats"],
        "_update_request_with_output": real["_update_request_with_output"],
        "schedule": lambda self, throttle=False: self.build(throttle),
    })  # fmt: skip
    with instrumented_vllm(monkeypatch, vl_inst.V1_MODULE, runner, scheduler, ASYNC_PHASES):
        yield real, output_module, runner(real["AsyncModelRunnerOutput"])


@pytest.mark.parametrize(("queue_size", "abort_at"), [(1, 2), (2, 2), (3, 3)],
                         ids=["sync", "async", "three-stage-queue"])  # fmt: skip
def test_a_worker_process_counts_what_the_engine_core_counted(
    worker_process_stand_ins: tuple[dict[str, Any], Any, Any], queue_size: int, abort_at: int,
) -> None:
    """The worker in a process of its own (``MultiprocExecutor``: tensor parallelism, the CPU
    build's OpenAI server; pipeline stages; Ray alike): it ends each speculative step's cycle
    at ``sample_tokens`` with its acceptance deferred; the engine core keeps what its
    ``update_from_output`` counted of the step (vLLM's own rows, from
    ``make_spec_decoding_stats``, and the tokens it handed on) and tags the next scheduler
    output with it, which vLLM pickles to the worker; the worker settles the cycle there. A
    request aborted while its step ran, one finished in flight (EOS; a ``max_tokens`` cut) and
    the last step before the engine goes idle: every counter equals vLLM's, no cycle waits for
    the settle timeout."""
    real, output_module, runner = worker_process_stand_ins
    worker = _WorkerProcess(runner)
    try:
        scheduler = _engine_with_worker_process(real, output_module, worker, queue_size,
                                                abort={abort_at: "b"})  # fmt: skip
    finally:
        worker.close()
    vllm = _vllm_counted(scheduler, rows=True)
    verified = sum(runner.steps.values())
    assert verified > vllm["drafts"]  # rows the engine verified and vLLM skipped were there
    observer = vl_inst.VllmInstrumentor().current_observer
    snap = _snapshot_of(observer)
    assert _specobs_counted(snap, rows=True) == vllm
    assert snap.accept_length.sum == vllm["accepted"]
    assert snap.cycles_total == scheduler.spec_steps
    assert snap.dropped["unsettled"] == 0
    assert not any(snap.errors.values()), snap.errors
    # The scheduler outputs reached the worker as copies, tagged by the engine core.
    tags = [getattr(o, vl_inst.STEP_ATTRIBUTE, None) for o in worker.received]
    assert tags == list(range(len(worker.received))), tags
    assert any(getattr(o, vl_inst.COUNTED_ATTRIBUTE, None) for o in worker.received)
