"""Which object each vLLM shape gets: the thread topologies and the runner hook tables.

A thread's topology (specobs/instrument/_vllm_topologies.py) is chosen on the first hook that
runs on it, from what runs there: the engine core's thread with its one worker
(``UniProcExecutor``), a worker in a process of its own and the engine core that feeds it
(``MultiprocExecutor``, Ray). A runner class gets its hooks when it is patched, from the seams
it has (``runner_hooks``). Stand-ins with model runner V2's call order and the scheduler's run
the real hooks on real threads; the counts must be the scheduler's own.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

from specobs.instrument import _vllm_topologies as topologies
from specobs.instrument import vllm as vl_inst
from specobs.instrument._vllm_topologies import EngineCore, InlineWorker, WorkerProcess
from tests._vllm_stand_ins import instrumented_vllm

DRAFTS = {"a": [1, 1, 1], "b": [2, 2, 2], "c": [3, 3, 3]}
ACCEPTED = {"a": 2, "b": 3, "c": 0}
STEPS = 4
SKIPPED = {2: "b"}
"""The row vLLM's scheduler skips, by step: its request was aborted while the step ran."""


class _Runner:
    """Model runner V2's seams in its call order: ``execute_model`` keeps the step,
    ``sample_tokens`` samples, updates the state and returns the output."""

    def __init__(self) -> None:
        self.speculative_config = types.SimpleNamespace(num_speculative_tokens=3)
        self.parallel_config = types.SimpleNamespace(data_parallel_rank=0,
                                                     data_parallel_size=1)  # fmt: skip
        self.is_last_pp_rank = True
        self.state: Any = None

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None,
                      dummy_run: bool = False) -> Any:  # fmt: skip
        self.state = scheduler_output
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        out, self.state = self.state, None
        ids = list(out.num_scheduled_tokens)
        drafts = out.scheduled_spec_decode_tokens
        batch = types.SimpleNamespace(
            req_ids=ids,
            num_draft_tokens_per_req=[len(drafts.get(r, ())) for r in ids] if drafts else None,
        )
        _, num_sampled, _ = self.sample(None, batch, grammar_output)
        self.postprocess_sampled(None, None, num_sampled)
        return {r: ACCEPTED[r] + 1 for r in ids}

    def sample(self, hidden_states: Any, input_batch: Any, grammar_output: Any) -> Any:
        import torch

        sampled = torch.tensor([ACCEPTED[r] + 1 for r in input_batch.req_ids])
        return None, sampled, sampled * 0

    def postprocess_sampled(self, idx_mapping: Any, sampled_tokens: Any,
                            num_sampled: Any) -> None:  # fmt: skip
        pass


class _Scheduler:
    """vLLM's scheduler, as far as the hooks read it: ``schedule`` builds a speculative step
    over three requests (``STEPS`` of them, then one that schedules nothing);
    ``update_from_output`` observes each row with ``make_spec_decoding_stats`` and hands the
    sampled tokens on, but for the row of a request aborted in flight (:data:`SKIPPED`)."""

    def __init__(self) -> None:
        self.requests: dict[str, Any] = {}
        self.num_spec_tokens = 3
        self.steps = 0
        self.taken = 0
        self.rows: list[tuple[int, int]] = []

    def schedule(self) -> Any:
        self.steps += 1
        drafts = DRAFTS if self.steps <= STEPS else {}
        return types.SimpleNamespace(
            scheduled_spec_decode_tokens=drafts,
            num_scheduled_tokens={r: 1 + len(d) for r, d in drafts.items()},
            finished_req_ids=set(),
        )

    def make_spec_decoding_stats(self, stats: Any, num_draft_tokens: int,
                                 num_accepted_tokens: int) -> None:  # fmt: skip
        self.rows.append((num_draft_tokens, num_accepted_tokens))

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = []
        skipped = SKIPPED.get(self.taken)
        self.taken += 1
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            if req_id == skipped:
                continue  # aborted while the step ran: vLLM counts nothing of its row
            self.make_spec_decoding_stats(None, num_draft_tokens=len(drafts),
                                          num_accepted_tokens=ACCEPTED[req_id])  # fmt: skip
            outputs.append(types.SimpleNamespace(request_id=req_id,
                                                 new_token_ids=[7] * (ACCEPTED[req_id] + 1)))
        return {0: types.SimpleNamespace(outputs=outputs)}


@contextlib.contextmanager
def _instrumented(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[type, type, Any]]:
    """The stand-ins as vLLM's V2 runner and scheduler modules, patched by a fresh
    instrumentor recording to an in-memory observer; yields the patched classes and it."""
    pytest.importorskip("torch")
    runner = type("GPUModelRunner", (_Runner,), {})
    # vLLM defines schedule on Scheduler itself, where the hook is put.
    scheduler = type("Scheduler", (_Scheduler,), {"schedule": _Scheduler.schedule})
    with instrumented_vllm(
        monkeypatch, vl_inst.V2_MODULE, runner, scheduler, vl_inst.V2_PHASES
    ) as observer:
        yield runner, scheduler, observer


def _counted(observer: Any) -> dict[str, Any]:
    assert observer.force_flush(timeout_seconds=5.0)
    snap = observer.snapshot()
    assert not any(snap.errors.values()), snap.errors
    return {"cycles": snap.cycles_total, "drafted": snap.draft_tokens_total,
            "accepted": snap.accepted_tokens_total, "emitted": snap.emitted_tokens_total,
            "unsettled": snap.dropped["unsettled"]}  # fmt: skip


#: What the scheduler counts of STEPS speculative steps over DRAFTS and ACCEPTED, less the
#: skipped row (3 drafts, 3 accepted, 4 tokens); as the runner sampled them the totals differ.
VLLM_COUNTED = {"cycles": STEPS, "drafted": 9 * STEPS - 3, "accepted": 5 * STEPS - 3,
                "emitted": 8 * STEPS - 4, "unsettled": 0}  # fmt: skip


# -- the choice -------------------------------------------------------------------------------


def test_each_combination_of_runner_and_scheduler_on_a_thread_gets_one_topology() -> None:
    assert topologies.choose(runner=True, scheduler=True) is InlineWorker
    assert topologies.choose(runner=True, scheduler=False) is WorkerProcess
    assert topologies.choose(runner=False, scheduler=True) is EngineCore
    with pytest.raises(ValueError, match=r"expected runner=True or scheduler=True, got "
                                         r"runner=False, scheduler=False"):  # fmt: skip
        topologies.choose(runner=False, scheduler=False)


def test_a_topology_carries_what_the_threads_previous_one_kept() -> None:
    inst = vl_inst.VllmInstrumentor()
    engine_core = EngineCore(inst)
    engine_core.requests["a"] = [3, 2]
    inline = InlineWorker(inst)
    inline.take_over(engine_core)
    assert inline.requests is engine_core.requests and inline.pending is engine_core.pending
    assert inline.instrumentor is inst and inline.tracker is None and not inline.waits


# -- the vLLM shapes, through the hooks --------------------------------------------------------


def test_one_worker_on_the_engine_cores_thread_is_an_inline_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``UniProcExecutor``: the engine core's thread schedules (an engine core with its worker
    elsewhere, as far as it knows), then runs the worker's first step and becomes an inline
    worker, for good; each cycle is settled by that thread's ``update_from_output``."""
    with _instrumented(monkeypatch) as (runner_cls, scheduler_cls, observer):
        runner, scheduler = runner_cls(), scheduler_cls()
        outputs, places = [], []
        for _ in range(STEPS):
            output = scheduler.schedule()
            places.append(vl_inst._step())
            runner.execute_model(output)
            result = runner.sample_tokens(None)
            places.append(vl_inst._step())
            scheduler.update_from_output(output, result)
            outputs.append(output)
        assert type(places[0]) is EngineCore
        assert all(type(p) is InlineWorker for p in places[1:])
        assert all(p is places[1] for p in places[1:])  # chosen once, then kept
        # Only the output scheduled before the worker's first step was numbered for a worker.
        tags = [getattr(o, vl_inst.STEP_ATTRIBUTE, None) for o in outputs]
        assert tags == [0] + [None] * (STEPS - 1)
        assert _counted(observer) == VLLM_COUNTED


def test_a_worker_process_and_its_engine_core_each_get_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MultiprocExecutor``: the engine core's thread never runs the runner, the worker's
    never runs the scheduler. The engine core numbers each output and sends the counts of a
    step on the next; the worker settles its deferred cycles when they arrive."""
    with _instrumented(monkeypatch) as (runner_cls, scheduler_cls, observer):
        runner, scheduler = runner_cls(), scheduler_cls()
        to_worker: queue.Queue[Any] = queue.Queue()
        to_core: queue.Queue[Any] = queue.Queue()
        places: dict[str, Any] = {}

        def worker() -> None:
            while (output := to_worker.get()) is not None:
                runner.execute_model(output)
                to_core.put(runner.sample_tokens(None))
            places["worker"] = vl_inst._step()

        def engine_core() -> None:
            for _ in range(STEPS + 1):  # the last output carries the last step's counts
                output = scheduler.schedule()
                to_worker.put(output)
                scheduler.update_from_output(output, to_core.get(timeout=30))
            to_worker.put(None)
            places["engine core"] = vl_inst._step()

        threads = [threading.Thread(target=worker), threading.Thread(target=engine_core)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        assert type(places["worker"]) is WorkerProcess
        assert type(places["engine core"]) is EngineCore
        assert not places["worker"].pending
        assert _counted(observer) == VLLM_COUNTED
        assert len(scheduler.rows) == 3 * STEPS - 1


def test_a_runner_thread_that_runs_the_scheduler_too_keeps_its_deferred_cycles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread that ran the runner alone (a worker process, its steps numbered) and then
    runs the scheduler becomes an inline worker holding the same deferred cycles."""
    with _instrumented(monkeypatch) as (runner_cls, scheduler_cls, observer):
        runner, scheduler = runner_cls(), scheduler_cls()
        output = _Scheduler.schedule(scheduler)  # the stand-in's own, not through the hook
        setattr(output, vl_inst.STEP_ATTRIBUTE, 0)
        runner.execute_model(output)
        runner.sample_tokens(None)
        worker = vl_inst._step()
        assert type(worker) is WorkerProcess and len(worker.pending) == 1
        pending = worker.pending
        scheduler.update_from_output(output, None)
        inline = vl_inst._step()
        assert type(inline) is InlineWorker and inline.pending is pending
        assert len(pending) == 1  # keyed by the engine core's number: no output here matches it


# -- the runner shapes --------------------------------------------------------------------------


def _class(name: str, methods: tuple[str, ...]) -> type:
    return type(name, (), {m: lambda self, *a, **k: None for m in methods})


def test_each_runner_class_gets_the_hooks_of_the_seams_it_has() -> None:
    v2 = _class("GPUModelRunner", tuple(vl_inst.HOOKS_V2))
    assert vl_inst.runner_hooks(vl_inst.V2_MODULE, v2) == vl_inst.HOOKS_V2
    v1 = _class("GPUModelRunner", tuple(vl_inst.HOOKS_V1))
    assert vl_inst.runner_hooks(vl_inst.V1_MODULE, v1) == vl_inst.HOOKS_V1
    # Releases that sample inside execute_model: the cycle ends there, no sample_tokens hook.
    before_split = _class("GPUModelRunner", tuple(m for m in vl_inst.HOOKS_V1
                                                  if m != "sample_tokens"))  # fmt: skip
    hooks = vl_inst.runner_hooks(vl_inst.V1_MODULE, before_split)
    assert set(hooks) == set(vl_inst.HOOKS_V1) - {"sample_tokens"}


def test_a_runner_class_no_hook_table_fits_is_a_clear_error() -> None:
    no_sample = _class("GPUModelRunner", ("execute_model", "postprocess_sampled",
                                          "sample_tokens"))  # fmt: skip
    with pytest.raises(ValueError) as raised:
        vl_inst.runner_hooks(vl_inst.V2_MODULE, no_sample)
    assert str(raised.value) == (
        f"{vl_inst.V2_MODULE}.GPUModelRunner has no sample; specobs times this runner through "
        "execute_model, sample, postprocess_sampled, sample_tokens"
    )
    with pytest.raises(ValueError, match=r"^vllm\.v1\.worker\.tpu_model_runner is not a model "
                                         r"runner module specobs times; expected one of "
                                         r"vllm\.v1\.worker\.gpu_model_runner, "
                                         r"vllm\.v1\.worker\.gpu\.model_runner$"):  # fmt: skip
        vl_inst.runner_hooks("vllm.v1.worker.tpu_model_runner", no_sample)


def test_a_runner_module_whose_class_lacks_a_seam_is_left_untouched(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing of such a class is patched (no half-timed runner), and the log says why."""
    runner = _class("GPUModelRunner", ("execute_model", "postprocess_sampled", "sample_tokens"))
    before = dict(vars(runner))
    module = types.ModuleType(vl_inst.V2_MODULE)
    setattr(module, vl_inst.RUNNER_CLASS, runner)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, vl_inst.V2_MODULE, module)
    inst = vl_inst.VllmInstrumentor()
    inst.uninstrument()
    caplog.set_level(logging.ERROR, logger="specobs.instrument")
    try:
        assert inst.instrument(skip_dep_check=True)
        assert dict(vars(runner)) == before
        assert "has no sample; specobs times this runner through" in caplog.text
    finally:
        inst.uninstrument()
        inst._observer = None

