"""The one series walk (:func:`specobs._series.families`): the catalog's order and labels, and
optional metrics left out until they have a value."""

from __future__ import annotations

import dataclasses

import pytest

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
        requests_running=None, requests_waiting=None, worker_thread_seconds={})
    left_out = present - {f.metric for f in _series.families(empty)}
    assert left_out == {m for m in catalog.CATALOG if m.optional}


def test_a_required_metric_without_a_value_is_an_error():
    broken = dataclasses.replace(fixed_snapshot(), batch_size=None)
    with pytest.raises(ValueError, match="only an optional metric may be left out"):
        list(_series.families(broken))
