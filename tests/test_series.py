"""The one series walk (:func:`specobs._series.families`): the catalog's order and labels, and
optional metrics left out until they have a value."""

from __future__ import annotations

import dataclasses

import pytest

import specobs
from specobs import _series, catalog
from tests.test_prometheus_sink import fixed_snapshot


def test_the_walk_follows_the_catalog_order_and_labels():
    fams = list(_series.families(fixed_snapshot()))
    assert [f.metric for f in fams] == [m for m in catalog.CATALOG
                                        if m in {f.metric for f in fams}]
    for f in fams:
        if f.metric is not catalog.INFO:
            assert f.labels == f.metric.labels
        assert all(len(values) == len(f.labels) for values, _ in f.points)


def test_only_optional_metrics_are_left_out_and_only_without_a_value():
    full = fixed_snapshot()
    present = {f.metric for f in _series.families(full)}
    assert present == set(catalog.CATALOG)
    empty = dataclasses.replace(
        full, last_cycle_timestamp_seconds=None, baseline_tokens_per_second=None,
        requests_running=None, requests_waiting=None, worker_thread_seconds={},
        sampling_budget_ratio=None, request_acceptance=None, requests_finished_total=None,
        draft_tokens_unverified=None, cycles_by_draft_length={}, phase_seconds_by_draft_length={},
        emitted_by_draft_length={}, accepted_by_draft_length={}, sequences_by_draft_length={},
        batch_by_draft_length={})
    left_out = present - {f.metric for f in _series.families(empty)}
    assert left_out == {m for m in catalog.CATALOG if m.optional}


def test_a_required_metric_without_a_value_is_an_error():
    broken = dataclasses.replace(fixed_snapshot(), batch_size=None)
    with pytest.raises(ValueError, match="only an optional metric may be left out"):
        list(_series.families(broken))


@pytest.mark.parametrize(("overrides", "sampling", "budget"), [
    ({"overhead_budget": 0.002}, "adaptive", 0.002),
    ({"sample_every": 4}, "every_4", None),
])
def test_the_observer_exports_the_sampling_budget_as_a_number_and_the_catalogs_info_labels(
        overrides, sampling, budget):
    """The adaptive sampler's budget leaves the process as its gauge (absent under a fixed
    interval, which no budget steers), the mode as the info label; the observer's info labels
    are the catalog's."""
    obs = specobs.configure(sinks=[], clock="host", **overrides)
    try:
        snap = obs.snapshot()
    finally:
        obs.shutdown()
    assert set(snap.info) == set(catalog.INFO.labels)
    assert snap.info["sampling"] == sampling
    assert snap.sampling_budget_ratio == budget
    fams = {f.metric: f for f in _series.families(snap)}
    if budget is None:
        assert catalog.SAMPLING_BUDGET not in fams
    else:
        assert fams[catalog.SAMPLING_BUDGET].points == [((), budget)]
