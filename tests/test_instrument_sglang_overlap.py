"""SGLang 0.5.23's overlap scheduling (the default): a request that finishes while its step is in
flight is verified once more in the next step (a "zombie" row), and the scheduler's result
processing, which runs after that next step was launched, skips it. specobs defers each step's
cycle at the worker and settles it in the result processing with the rows SGLang counts.

Driven here through SGLang's own code, compiled from the pinned wheel: ``Scheduler.
event_loop_overlap`` (the loop that launches step N+1 before it processes step N),
``EAGLEWorkerV2.forward_batch_generation``, ``SchedulerBatchResultProcessor.
process_batch_result_decode`` / ``_normalize_decode_outputs`` / ``_resolve_spec_v2_tokens`` and
``Req``'s finish checks; stand-ins only where CUDA or the server's plumbing would be needed (the
draft and verify kernels, the batch builder, metrics and streaming).
"""

from __future__ import annotations

import ast
import collections
import copy
import types
from pathlib import Path
from typing import Any

import pytest

from specobs.instrument import sglang as sg_inst
from tests._arithmetic import watching
from tests.test_instrument_contracts import _method, _package
from tests.test_instrument_sglang import (
    LATEST,
    _class_in,
    _instrumented_observer,
    _Mode,
    _real_eagle_v2,
    _real_methods,
    _snapshot,
)
from tests.test_instrument_sglang import fresh_instrumentors as fresh_instrumentors

EOS = 2
K = 3  # speculative_num_steps, topk 1: 3 drafts verified per request
STRIDE = K + 1
SCHEDULER = "sglang.srt.managers.scheduler"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
RESULT_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"


class _Finish:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _req_class() -> type:
    """``Req`` with 0.5.23's own finish checks; what they read set by ``__init__``."""
    namespace: dict[str, Any] = {
        "FINISH_MATCHED_TOKEN": _Finish, "FINISH_LENGTH": _Finish, "FINISH_MATCHED_STR": _Finish,
    }  # fmt: skip
    real = _real_methods(
        LATEST, SCHEDULE_BATCH, "Req",
        ("finished", "update_finish_state", "_check_token_based_finish",
         "_cap_finished_len_at_max_new_tokens", "_check_vocab_boundary_finish",
         "output_ids_through_stop", "next_output_finishes_by_length",
         "update_spec_correct_drafts_histogram"),
        namespace,
    )  # fmt: skip

    def __init__(self: Any, rid: str, max_new_tokens: int, script: list[list[int]]) -> None:
        self.rid = rid
        self.script = script  # per verify of this request: the tokens it accepts, bonus included
        self.verified = 0  # verifies run by the (stand-in) kernel, zombie rows included
        self.output_ids = [10]  # the first token, from the prefill step
        self.sampling_params = types.SimpleNamespace(
            max_new_tokens=max_new_tokens, ignore_eos=False, stop_token_ids=None)
        self.eos_token_ids = {EOS}
        self.tokenizer = None
        self.vocab_size = 100
        self.finished_reason = self.finished_len = self.to_finish = None
        self.is_retracted = False
        self.grammar = self.beam_group = None
        self.return_sampling_mask = self.return_logprob = self.return_hidden_states = False
        self.time_stats = types.SimpleNamespace(set_last_decode_finish_time=lambda: None)
        self.kv = types.SimpleNamespace(kv_committed_len=0)
        self.spec_verify_ct = self.spec_num_correct_drafts = 0
        self.spec_correct_drafts_histogram: list[int] = []

    def _check_str_based_finish(self: Any, new_accepted_len: int) -> bool:
        return False  # no stop strings here (they need a tokenizer)

    return type("Req", (), {**real, "__init__": __init__,
                            "_check_str_based_finish": _check_str_based_finish})  # fmt: skip


class _ScheduleBatch:
    def __init__(self, reqs: list[Any]) -> None:
        torch = pytest.importorskip("torch")
        self.reqs = reqs
        self.forward_mode = _Mode("decode")
        self.is_extend_in_batch = False
        self.seq_lens = torch.full((len(reqs),), 7)
        self.spec_info = None
        self.spec_algorithm = types.SimpleNamespace(is_none=lambda: False)
        self.return_logprob = False
        self.rows: list[str] = []

    def copy(self) -> _ScheduleBatch:
        out = _ScheduleBatch(self.reqs)
        out.rows = self.rows
        return out

    def batch_size(self) -> int:
        return len(self.reqs)


class _BatchResult:
    """What the verify step returns, as GenerationBatchResult holds it for the processing."""

    def __init__(self, **fields: Any) -> None:
        self.copy_done = self.routed_experts_output = self.indexer_topk_output = None
        self.auxiliary_host_output = None
        self.block_accept_lens = self.cap_lens = None
        self.speculative_output_stride = STRIDE
        self.num_non_draft_tokens_per_req = 1
        self.num_correct_drafts_per_req_cpu: Any = None
        self.can_run_cuda_graph = False
        self.logits_output = types.SimpleNamespace()
        self.__dict__.update(fields)

    def get_num_generated_tokens(self, batch_size: int) -> int:
        return self.num_correct_drafts + batch_size * self.num_non_draft_tokens_per_req


def _verify(self: Any, batch: Any, pp_proxy_tensors: Any = None,
            grammar_barrier: Any = None) -> Any:  # fmt: skip
    """The target verify: each row accepts its script's next run (a zombie row, too)."""
    torch = pytest.importorskip("torch")
    tokens, lens = [], []
    for req in batch.reqs:
        run = req.script[min(req.verified, len(req.script) - 1)]
        req.verified += 1
        batch.rows.append(req.rid)
        tokens += run + [0] * (STRIDE - len(run))
        lens.append(len(run))
    return _BatchResult(next_token_ids=torch.tensor(tokens), new_seq_lens=batch.seq_lens,
                        accept_lens=torch.tensor(lens, dtype=torch.int32))  # fmt: skip


def _processor_class(monkeypatch: pytest.MonkeyPatch) -> type:
    """``SchedulerBatchResultProcessor`` with 0.5.23's own decode-result processing."""
    _package(monkeypatch, "sglang.srt.managers")
    _package(monkeypatch, "sglang.srt.managers.scheduler_components")
    module = _package(monkeypatch, RESULT_PROCESSOR, path=False)
    torch = pytest.importorskip("torch")
    namespace: dict[str, Any] = {
        "torch": torch,
        "get_observability": lambda: types.SimpleNamespace(enable_metrics=False),
    }
    stride_fn = _function_of(RESULT_PROCESSOR, "_get_speculative_output_stride")
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stride_fn], type_ignores=[])),
                 "<sglang stride>", "exec"), namespace)  # fmt: skip
    real = _real_methods(
        LATEST, RESULT_PROCESSOR, "SchedulerBatchResultProcessor",
        ("process_batch_result_decode", "_normalize_decode_outputs", "_resolve_spec_v2_tokens"),
        namespace,
    )  # fmt: skip

    def __init__(self: Any, model_worker: Any) -> None:
        self.enable_overlap = True
        self.enable_overlap_mlx = False
        self.model_worker = model_worker
        self.metrics = collections.Counter()

        def update_spec_metrics(bs: int, num_correct_drafts: int, **kw: Any) -> None:
            self.metrics["verify_rows"] += bs  # SGLang's aggregate: zombie rows included
            self.metrics["correct_drafts"] += num_correct_drafts

        nothing = lambda *args, **kwargs: None  # noqa: E731
        self.metrics_reporter = types.SimpleNamespace(
            snapshot_spec_decode_metrics=nothing, update_spec_metrics=update_spec_metrics,
            report_decode_stats=nothing, num_generated_tokens=0, forward_ct_decode=0,
        )  # fmt: skip
        self.token_to_kv_pool_allocator = types.SimpleNamespace(
            free_group_begin=nothing, free_group_end=nothing)
        self.output_streamer = types.SimpleNamespace(stream_output=nothing)

    nothing = lambda *args, **kwargs: None  # noqa: E731
    cls = type("SchedulerBatchResultProcessor", (), {
        **real, "__init__": __init__,
        "snapshot_auxiliary_output_starts": nothing, "materialize_sampling_mask_output": nothing,
        "advance_grammar_fsm": nothing, "_maybe_update_reasoning_tokens": nothing,
        "_handle_finish_state_updated_req": nothing,
    })  # fmt: skip
    module.SchedulerBatchResultProcessor = cls
    return cls


def _function_of(module: str, name: str) -> ast.FunctionDef:
    from tests.test_instrument_contracts import _tree
    from tests.test_instrument_sglang import _module_path

    tree = _tree("sglang", LATEST, _module_path(module))
    assert tree is not None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{module}.{name} is missing")


def _scheduler_class() -> type:
    """``Scheduler`` with 0.5.23's own overlap loop; the batch builder mirrors what it keeps
    (requests not finished, less those whose next token finishes them by length:
    ``_reqs_finishing_inflight``)."""
    namespace: dict[str, Any] = {
        "envs": types.SimpleNamespace(
            SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=types.SimpleNamespace(get=lambda: False)),
    }
    node = _class_in(LATEST, SCHEDULER, "Scheduler")
    loop = copy.copy(_method(node, "event_loop_overlap"))
    loop.decorator_list = []  # DynamicGradMode(): torch's no-grad, nothing here
    future = ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0)
    deque_import = ast.parse("from collections import deque").body[0]
    tree = ast.Module(body=[future, deque_import, loop], type_ignores=[])
    exec(compile(ast.fix_missing_locations(tree), "<sglang Scheduler>", "exec"), namespace)

    def __init__(self: Any, worker: Any, processor: Any, reqs: list[Any], steps: int) -> None:
        self.model_worker = worker
        self.batch_result_processor = processor
        self.reqs = reqs
        self.steps = steps
        self.gracefully_exit = self._engine_paused = self.enable_unified_memory = False
        self.is_generation = True
        self.last_batch = self.running_batch = None
        self.batches: list[Any] = []

    def ingest_requests(self: Any) -> None:
        if len(self.batches) >= self.steps and self.last_batch is None:
            self.gracefully_exit = True

    def get_next_batch_to_run(self: Any, running_batch: Any, last_batch: Any) -> Any:
        keep = [r for r in self.reqs
                if not r.finished() and not r.next_output_finishes_by_length()]  # fmt: skip
        batch = None
        if keep and len(self.batches) < self.steps:
            batch = _ScheduleBatch(keep)
            self.batches.append(batch)
        return types.SimpleNamespace(running_batch=batch, batch_to_run=batch)

    def run_batch(self: Any, batch: Any) -> Any:
        return self.model_worker.forward_batch_generation(batch)

    def process_batch_result(self: Any, batch: Any, result: Any) -> None:
        # 0.5.23's dispatch for a decode batch (asserted in test_instrument_sglang.py).
        if batch.forward_mode.is_decode():
            self.batch_result_processor.process_batch_result_decode(batch, result)

    nothing = lambda *args, **kwargs: None  # noqa: E731
    return type("Scheduler", (), {
        "event_loop_overlap": namespace["event_loop_overlap"], "__init__": __init__,
        "ingest_requests": ingest_requests, "get_next_batch_to_run": get_next_batch_to_run,
        "is_disable_overlap_for_batch": lambda self, batch, last_batch: False,
        "run_batch": run_batch, "_apply_war_barrier": nothing, "on_idle": nothing,
        "launch_batch_sample_if_needed": nothing, "process_batch_result": process_batch_result,
    })  # fmt: skip


def _requests(req_cls: type) -> list[Any]:
    """a: EOS inside its second accepted run; b: never finishes; c: its second run crosses
    max_new_tokens (8) with several accepted drafts, which the scheduler does not foresee;
    d: its next token reaches max_new_tokens, which it does foresee (no zombie)."""
    return [
        req_cls("a", 100, [[11, 12, 13], [14, EOS, 15, 16], [17, 18]]),
        req_cls("b", 100, [[21, 22], [23, 24, 25, 26], [27], [28, 29, 30]]),
        req_cls("c", 8, [[31, 32, 33, 34], [35, 36, 37, 38], [39]]),
        req_cls("d", 4, [[41, 42], [43, 44, 45]]),
    ]


def test_zombie_rows_under_overlap_scheduling_are_left_out_as_sglang_leaves_them_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _real_eagle_v2(monkeypatch, tmp_path, calls, coordination=False, rank=0)
    arithmetic: list[str] = []

    def verify(*args: Any, **kwargs: Any) -> Any:
        result = _verify(*args, **kwargs)
        result.accept_lens = watching(result.accept_lens, arithmetic)
        return result

    v2.EAGLEWorkerV2.verify = verify
    v2.EAGLEWorkerV2.on_verify_complete_cpu = lambda self, drafts, batch_size: None
    processor_cls = _processor_class(monkeypatch)
    observer = _instrumented_observer(monkeypatch)
    worker = v2.EAGLEWorkerV2(accept=[])
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = K, K + 1
    reqs = _requests(_req_class())
    scheduler = _scheduler_class()(worker, processor_cls(worker), reqs, steps=4)
    scheduler.event_loop_overlap()
    # The acceptance came from the host list the result processing made: specobs launched
    # nothing on the step's accept_lens (on the GPU, a kernel per step on the worker's stream).
    assert arithmetic == [], arithmetic

    rows = [r for b in scheduler.batches for r in b.rows]
    verified = sum(r.spec_verify_ct for r in reqs)
    # Zombie rows were verified: a after its EOS, c after crossing its length (d foreseen).
    assert len(rows) == verified + 2
    assert rows.count("a") == 3 and next(r for r in reqs if r.rid == "a").spec_verify_ct == 2
    d = next(r for r in reqs if r.rid == "d")
    assert rows.count("d") == d.spec_verify_ct == 2 and d.finished()  # its finish foreseen
    correct = sum(r.spec_num_correct_drafts for r in reqs)
    emitted = sum(len(r.output_ids_through_stop) - 1 for r in reqs)  # less the prefill token
    snap = _snapshot(observer)
    assert not any(snap.errors.values()), snap.errors
    assert snap.dropped["unsettled"] == 0
    assert snap.cycles_total == len(scheduler.batches) == 4
    assert snap.draft_tokens_total == K * verified
    assert snap.accepted_tokens_total == correct
    assert snap.emitted_tokens_total == emitted
    assert (snap.accept_length.count, snap.accept_length.sum) == (verified, correct)
    assert (snap.batch_size.count, snap.batch_size.sum) == (4, verified)
    for phase in ("draft", "verify", "bookkeeping"):
        assert snap.phase_count(phase, "host") == 4
    # SGLang's aggregate (the logged accept length) counts the zombie rows; the per-request
    # counters, the tokens and specobs do not.
    assert scheduler.batch_result_processor.metrics["verify_rows"] == len(rows)
    assert sum(len(r.output_ids) - 1 for r in reqs) > emitted  # c's run cut at max_new_tokens
    assert RESULT_PROCESSOR == sg_inst.RESULT_PROCESSOR_MODULE
    # Per request: each finished request once, its accepted drafts SGLang's own per-request
    # count (spec_num_correct_drafts), its drafted the K drafts of each of its counted verifies.
    done = [r for r in reqs if r.finished()]
    assert done and snap.requests_finished_total == len(done)
    hist = snap.request_acceptance
    assert hist is not None and hist.count == len(done)
    assert hist.sum == pytest.approx(
        sum(r.spec_num_correct_drafts / (K * r.spec_verify_ct) for r in done))
    observer.shutdown(timeout_seconds=5.0)
