"""Which place an SGLang process gets, and what each place does with a step's cycle.

The place (specobs/instrument/_sglang_topologies.py) is chosen once, on the process's first
cycle, from the pipeline width and whether the scheduler's result processing is hooked; the
tests here drive each place directly with stand-ins for a tracker, a batch and a step's result.
The hooks that use them run against SGLang's own code in test_instrument_sglang*.py.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from specobs.instrument import _base
from specobs.instrument import _sglang_topologies as places


class _Instrumentor:
    """What a place asks of its instrumentor: the observer, and where finished requests go."""

    def __init__(self) -> None:
        self.current_observer: Any = None
        self.finished: list[tuple[int, int]] = []

    def report_requests(self, finished: list[tuple[int, int]]) -> None:
        self.finished.extend(finished)


class _Tracker:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def accept(self, accepted: Any, draft_length: Any, emitted: Any = None) -> None:
        self.calls.append(("accept", accepted, draft_length, emitted))

    def finish(self) -> None:
        self.calls.append(("finish",))

    def defer(self) -> str:
        self.calls.append(("defer",))
        return "handle"


class _Handle:
    def __init__(self) -> None:
        self.settled: list[tuple[Any, dict[str, Any]]] = []

    def settle(self, accepted: Any, **kwargs: Any) -> None:
        self.settled.append((accepted, kwargs))


class _Req:
    def __init__(self, done: bool, grew: int) -> None:
        self.done = done
        self.output_ids = [0] * grew

    def finished(self) -> bool:
        return self.done


def _batch(decode: bool) -> Any:
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: decode))


def _worker(pp_size: int) -> Any:
    return types.SimpleNamespace(server_args=types.SimpleNamespace(pp_size=pp_size))


@pytest.fixture(autouse=True)
def fresh_choice() -> Iterator[None]:
    places.forget()
    yield
    places.forget()


@pytest.mark.parametrize(
    ("pp_size", "hooked", "chosen"),
    [
        (1, True, places.SettledByProcessing),
        (1, False, places.SettledAtStep),
        (2, True, places.PipelineLastStage),
        (2, False, places.PipelineLastStage),
    ],
)
def test_the_place_follows_the_pipeline_width_and_the_processing_hook(
    pp_size: int, hooked: bool, chosen: type
) -> None:
    place = places.here(_Instrumentor(), _worker(pp_size), processing_hooked=hooked)
    assert type(place) is chosen


def test_the_place_is_chosen_once_until_forgotten() -> None:
    first = places.here(_Instrumentor(), _worker(1), processing_hooked=False)
    again = places.here(_Instrumentor(), _worker(2), processing_hooked=True)
    assert again is first
    places.forget()
    chosen = places.here(_Instrumentor(), _worker(2), processing_hooked=True)
    assert type(chosen) is places.PipelineLastStage


def test_only_the_last_stage_of_a_pipeline_runs_the_pp_phase_order() -> None:
    pipeline = places.PipelineLastStage(_Instrumentor())
    single = places.SettledByProcessing(_Instrumentor())
    assert pipeline.phases(places.EAGLE) == places.PP_PHASES
    assert pipeline.phases(places.EAGLE_PLAIN) == _base.DEFAULT_PHASES
    assert single.phases(places.EAGLE) == _base.DEFAULT_PHASES


def test_a_step_settled_where_it_returns_reads_its_result() -> None:
    tracker = _Tracker()
    result = types.SimpleNamespace(num_correct_drafts_per_req_cpu=[2, 0])
    places.SettledAtStep(_Instrumentor()).step_returned(
        tracker, _batch(True), result, 3)
    assert tracker.calls == [("accept", [2, 0], 3, None), ("finish",)]


def test_a_decode_step_waits_for_the_result_processing() -> None:
    tracker = _Tracker()
    result = types.SimpleNamespace(num_correct_drafts_per_req_cpu=[2, 0])
    place = places.SettledByProcessing(_Instrumentor())
    place.step_returned(tracker, _batch(True), result, 3)
    assert tracker.calls == [("defer",)]
    assert getattr(result, places.PENDING_ATTRIBUTE) == (place, "handle", 3)
    # Any other batch the step runs is settled at once.
    other = _Tracker()
    place.step_returned(other, _batch(False), types.SimpleNamespace(), 3)
    assert other.calls == [("finish",)]


def test_the_processing_settles_the_rows_it_counts_and_reports_finished_requests() -> None:
    instrumentor = _Instrumentor()
    place = places.SettledByProcessing(instrumentor)
    handle = _Handle()
    result = types.SimpleNamespace(num_correct_drafts_per_req_cpu=[2, 1, 3])
    live, skipped, done = _Req(False, 0), _Req(True, 0), _Req(True, 0)
    rows = [(live, True, 0), (skipped, False, 0), (done, True, 0)]
    live.output_ids, done.output_ids = [0] * 3, [0] * 4  # grown by accepted + bonus
    place.settle(handle, result, 3, rows)
    assert handle.settled == [([2, 3], {"draft_length": 3, "batch_size": 2, "emitted": 7})]
    assert instrumentor.finished == [(3, 3)]  # the finished row: 3 drafted, 3 accepted
