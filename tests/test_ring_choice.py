"""Which ring the suite runs: ``SPECOBS_CORE=python`` (scripts/check's second pass) must reach
specobs through the test harness, or the pure-Python ring's pass tests the native one again."""

from __future__ import annotations

import os

from specobs import _ring


def test_the_ring_the_environment_asks_for_is_the_ring_that_runs() -> None:
    wants_python = os.environ.get("SPECOBS_CORE", "").strip().lower() == "python"
    assert _ring.NATIVE == (_ring.BUILT and not wants_python)
    assert (_ring.Ring is _ring.PyRing) == (not _ring.NATIVE)
