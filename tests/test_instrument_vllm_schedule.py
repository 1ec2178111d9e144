"""vLLM under a batch-size schedule of k: plain decode steps are cycles with draft length 0, the
k a step drafts is read from the scheduler, and per-request acceptance is vLLM's own count.

1. Contracts, read from the pinned wheels with ``ast`` (0.33.0 and 0.34.0): the scheduler's pick
   (``SchedulerOutput.num_spec_tokens_to_schedule``), what the engine core's plain-step mark reads
   (``Scheduler.num_spec_tokens`` / ``dynamic_sd_lookup``, ``Request.num_output_tokens`` and
   ``num_output_placeholders``), and what ends a request (``EngineCoreOutput.finish_reason``).
2. Behaviour on the stand-in runners of ``tests/test_instrument_vllm.py``, through vLLM's own
   plugin loader; the real engine with a schedule runs in ``tests/test_engine_vllm_cpu.py``.
"""

from __future__ import annotations

import ast
import importlib
import types
from typing import Any

import pytest

from specobs.instrument import vllm as vl_inst
from tests.test_instrument_contracts import _class, _fields, _method, _tree
from tests.test_instrument_vllm import (
    DRAFTS,
    _load_plugins,
    _snapshot,
    _spec,
    _step,
)
from tests.test_instrument_vllm import vllm_standins as vllm_standins
from tests.test_instrument_vllm import vllm_tree as vllm_tree

VERSIONS = ("0.33.0", "0.34.0")


# -- 1. contracts ----------------------------------------------------------------------------------


def _properties(cls: ast.ClassDef) -> set[str]:
    return {
        n.name for n in cls.body
        if isinstance(n, ast.FunctionDef)
        and any(ast.unparse(d) == "property" for d in n.decorator_list)
    }  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
def test_what_the_schedule_hooks_read_is_in_the_pinned_release(version: str) -> None:
    output = _tree("vllm", version, "vllm/v1/core/sched/output.py")
    assert output is not None
    assert "num_spec_tokens_to_schedule" in _fields(_class(output, "SchedulerOutput"))
    scheduler = _tree("vllm", version, "vllm/v1/core/sched/scheduler.py")
    assert scheduler is not None
    cls = _class(scheduler, "Scheduler")
    assert {"num_spec_tokens", "dynamic_sd_lookup", "requests"} <= _fields(cls)
    # The scheduler picks k from the lookup by the batch, every step, and hands it on.
    body = ast.unparse(_method(cls, "schedule"))
    assert "self.dynamic_sd_lookup[" in body
    assert "num_spec_tokens_to_schedule=num_spec_tokens_to_schedule" in body
    request = _tree("vllm", version, "vllm/v1/request.py")
    assert request is not None
    req = _class(request, "Request")
    assert "num_output_tokens" in _properties(req)
    assert "num_output_placeholders" in _fields(req)
    engine = _tree("vllm", version, "vllm/v1/engine/__init__.py")
    assert engine is not None
    out = _class(engine, "EngineCoreOutput")
    assert {"request_id", "new_token_ids", "finish_reason"} <= _fields(out)


# -- 2. the plain-step mark, on its own ------------------------------------------------------------


def _request(outputs: int, placeholders: int = 0) -> Any:
    return types.SimpleNamespace(num_output_tokens=outputs, num_output_placeholders=placeholders)


@pytest.mark.parametrize(("scheduled", "requests", "decodes"), [
    ({"a": 1}, {"a": _request(4)}, True),  # a decode step with k = 0
    ({"a": 1}, {"a": _request(0)}, False),  # the prompt's last token: its first output comes
    ({"a": 1}, {"a": _request(0, placeholders=1)}, True),  # async: its first output in flight
    ({"a": 17}, {"a": _request(9)}, False),  # a preempted request recomputed
    ({"a": 30, "b": 1}, {"a": _request(0), "b": _request(2)}, True),  # mixed: b decodes
    ({"gone": 1}, {}, False),  # a request the scheduler no longer holds
])  # fmt: skip
def test_a_step_without_drafts_decodes_when_a_request_past_its_first_token_gets_one(
    scheduled: dict[str, int], requests: dict[str, Any], decodes: bool
) -> None:
    scheduler = types.SimpleNamespace(requests=requests)
    output = types.SimpleNamespace(num_scheduled_tokens=scheduled)
    assert vl_inst.decodes(scheduler, output) is decodes


def test_the_k_a_step_drafts_is_the_schedulers_pick_else_the_configured_k() -> None:
    runner = types.SimpleNamespace(speculative_config=_spec("ngram", k=4))
    assert vl_inst.drafted_length(runner, types.SimpleNamespace(num_spec_tokens_to_schedule=0)) == 0
    assert vl_inst.drafted_length(runner, types.SimpleNamespace(num_spec_tokens_to_schedule=2)) == 2
    assert vl_inst.drafted_length(runner, types.SimpleNamespace()) == 4  # releases before 0.32
    odd = types.SimpleNamespace(num_spec_tokens_to_schedule=True)
    assert vl_inst.drafted_length(runner, odd) is None


# -- 3. plain steps on the stand-in runners --------------------------------------------------------


def _v2_runner() -> Any:
    """vLLM's plugins loaded (specobs's among them), then a model runner V2 stand-in for
    EAGLE-3."""
    _load_plugins()
    module = importlib.import_module(vl_inst.V2_MODULE)
    return module.GPUModelRunner(_spec("eagle3"))


def _plain(requests: tuple[str, ...] = ("a", "b", "c"), k: int = 0) -> Any:
    step = _step({}, requests)
    step.num_spec_tokens_to_schedule = k
    setattr(step, vl_inst.PLAIN_ATTRIBUTE, True)
    return step


def _speculative(k: int = 3) -> Any:
    step = _step(DRAFTS)
    step.num_spec_tokens_to_schedule = k
    return step


def test_v2_plain_steps_are_cycles_of_draft_length_0_and_prefill_steps_are_not(
    vllm_tree: Any,
) -> None:
    runner = _v2_runner()
    runner.execute_model(_step({}))  # prefill: no drafts, not marked plain
    runner.sample_tokens(None)
    for _ in range(2):  # k = 0 band: plain decode steps
        runner.execute_model(_plain())
        runner.sample_tokens(None)
    runner.execute_model(_plain(k=3))  # the batch shrank: this step drafts 3 for the next
    runner.sample_tokens(None)
    for k in (3, 2):  # speculative steps: verify 3 each, draft 3, then 2
        runner.execute_model(_speculative(k))
        runner.sample_tokens(None)
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    snap = _snapshot(observer)
    assert snap.cycles_total == 5
    for phase in observer.phases:
        assert snap.phase_count(phase, "host") == 5
    # Drafted and accepted: the speculative steps' only.
    assert snap.draft_tokens_total == 2 * 9
    assert snap.accepted_tokens_total == 2 * (2 + 3 + 0)
    # Each cycle by the k it drafted: 0, 0, 3, 3, 2.
    k = snap.draft_length
    assert {int(b): n for b, n in zip(k.bounds, k.counts, strict=False) if n} == {0: 2, 2: 1, 3: 2}
    assert snap.baseline_tokens_per_second is None  # not 16 plain steps yet
    assert not any(snap.errors.values()), snap.errors


# -- 4. per-request acceptance: vLLM's rows, summed until the request finishes ---------------------


def test_a_requests_figures_are_the_rows_vllm_counted_until_it_finishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = vl_inst._Step()
    scheduler = types.SimpleNamespace(requests={"a": 1, "b": 1})
    assert vl_inst._finished_requests(step, scheduler, [(3, 2, "a"), (3, 0, "b")], []) == []
    # A row without a request id (a release that does not pass it) is left out.
    got = vl_inst._finished_requests(
        step, scheduler, [(2, 1, "a"), (3, 3, "b"), (3, 3, None)], ["a"])
    assert got == [(5, 3)]
    assert step.requests == {"b": [6, 3]}
    # Requests vLLM no longer holds (aborted: no finishing output) are forgotten past the bound.
    monkeypatch.setattr(vl_inst, "_MAX_REQUESTS", 1)
    scheduler.requests = {"c": 1}
    vl_inst._finished_requests(step, scheduler, [(1, 1, "c")], [])
    assert step.requests == {"c": [1, 1]}


def test_the_requests_a_settled_step_finished_reach_the_observers_histogram(
    vllm_tree: Any,
) -> None:
    runner = _v2_runner()
    runner.execute_model(_speculative())
    step = vl_inst._step()
    step.key = 7  # as if the engine core numbered the step: the cycle is deferred
    runner.sample_tokens(None)
    entry = step.pending.popleft()
    # The engine core's counts of step 7: three rows, and two requests it finished.
    vl_inst._settle_with(entry, (7, [3, 3, 3], [2, 3, 0], 3, 8, [(9, 6), (12, 0)]))
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    snap = _snapshot(observer)
    assert snap.cycles_total == 1 and snap.emitted_tokens_total == 8
    assert snap.requests_finished_total == 2
    hist = snap.request_acceptance
    assert hist is not None and hist.count == 2
    assert hist.sum == pytest.approx(6 / 9 + 0.0)
