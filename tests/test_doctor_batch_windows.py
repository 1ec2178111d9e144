"""How ``doctor --prometheus`` splits its history for the batch threshold
(:func:`specobs.tools._doctor._prometheus.history_split`); tests/test_diagnosis_batch_prometheus.py
runs it against a real Prometheus."""

from __future__ import annotations

import pytest

from specobs.tools._doctor._prometheus import BATCH_WINDOWS_MAX, history_split

AT = 1_800_000_000.25


def test_windows_as_long_as_the_recent_one_end_where_it_begins() -> None:
    start, end, step = history_split(300.0, 3600.0, AT)
    assert step == 300.0 and end == pytest.approx(AT - 300.0)
    assert (end - start) / step == pytest.approx(12)


def test_a_long_history_is_split_into_at_most_the_maximum() -> None:
    start, end, step = history_split(300.0, 86400.0, AT)
    assert step == 86400.0 / BATCH_WINDOWS_MAX
    assert (end - start) / step == pytest.approx(BATCH_WINDOWS_MAX)


def test_a_history_that_is_no_multiple_leaves_out_its_oldest_part() -> None:
    start, end, step = history_split(15.0, 50.0, AT)
    assert step == 15.0 and (end - start) == pytest.approx(45.0)
    # Shorter than one window: the history is one window.
    start, end, step = history_split(15.0, 10.0, AT)
    assert step == 10.0 and (end - start) == pytest.approx(10.0)
