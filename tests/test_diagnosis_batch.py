"""The forward's cost in tokens (:func:`specobs.tools._diagnosis.forward_cost`), the advisor's
verify scaling from it, and the batch size above which speculation stops paying
(``SPEC-ADVICE-BATCH``), on constructed intervals checked against the cost model written out
again here, on both sides of the threshold."""

from __future__ import annotations

import pytest

from specobs import catalog
from specobs.tools import _diagnosis as dg
from specobs.tools._scrape import Delta
from tests.test_diagnosis import delta

POSITIONS = (0.85, 0.83, 0.80, 0.78)  # unconditional: E = 1 + their sum = 4.26
E = 1 + sum(POSITIONS)
HOST = {"draft": 2e-3, "verify": 6e-3, "bookkeeping": 0.2e-3}


def measured(d: Delta, tokens_per_second: float, source: str = "demo_measured") -> Delta:
    """``d`` with a baseline gauge of ``source``."""
    d.gauges.add(catalog.BASELINE_SEQUENCE_TOKENS.name, {"source": source}, tokens_per_second)
    return d


def modelled_speedup(batch: float, plain_now: float, host: dict[str, float], k: int = 4,
                     at: float = 4.0) -> float:
    """The docstring's model, written out: forward(n) = f + p n through the plain step (n = B)
    and verify (n = B (k + 1)) at batch ``at``; the cycle scales with verify."""
    v = host["verify"]
    p = (v - plain_now) / (at * k)
    f = v - p * at * (k + 1)
    verify = f + p * batch * (k + 1)
    cycle = verify * sum(host.values()) / v
    return E * (f + p * batch) / cycle


def test_the_forward_is_fitted_through_the_plain_step_and_verify() -> None:
    b = dg.window(delta(host=HOST, positions=POSITIONS)).breakdown
    cost = dg.forward_cost(b, 2e-3)
    assert cost is not None and cost.k == 4 and cost.batch == 4.0
    # verify 6 ms over 4 x 5 tokens, the plain step 2 ms over 4: 0.25 ms a token, 1 ms fixed.
    assert cost.per_token_seconds == pytest.approx(0.25e-3)
    assert cost.fixed_seconds == pytest.approx(1e-3)
    assert dg.verify_scaling(cost) == pytest.approx(0.25e-3 * 20 / 6e-3)
    # A verify no dearer than the plain step: nothing grows with tokens.
    flat = dg.forward_cost(b, 7e-3)
    assert flat is not None and flat.per_token_seconds == 0.0
    assert dg.verify_scaling(flat) == 0.0
    assert dg.forward_cost(b, None) is None and dg.verify_scaling(None) == 0.0


def test_the_threshold_is_where_the_model_crosses_1() -> None:
    b = dg.window(delta(host=HOST, positions=POSITIONS)).breakdown
    f = dg.batch_threshold(b, 2e-3)
    assert f is not None and (f.code, f.severity) == ("SPEC-ADVICE-BATCH", "info")
    t = f.evidence["threshold_batch"]
    assert isinstance(t, float)
    # 4.26 (1 + 0.25 B) = 1.3667 (1 + 1.25 B): B = 4.50
    assert t == pytest.approx(4.497, rel=0.01)
    assert modelled_speedup(0.99 * t, 2e-3, HOST) > 1.0 > modelled_speedup(1.03 * t, 2e-3, HOST)
    assert f.evidence["modelled_speedup"] == pytest.approx(modelled_speedup(4.0, 2e-3, HOST))
    assert "stops paying above batch 4 " in f.sentence
    assert "extrapolated beyond the mean batch 4.0" in f.sentence
    assert "disable_by_batch_size" in f.advice


def test_a_cheaper_plain_step_moves_the_threshold_below_the_batch_measured() -> None:
    b = dg.window(delta(host=HOST, positions=POSITIONS)).breakdown
    f = dg.batch_threshold(b, 1.6e-3)
    assert f is not None
    t = f.evidence["threshold_batch"]
    assert isinstance(t, float) and 1.0 < t < 4.0
    assert modelled_speedup(0.99 * t, 1.6e-3, HOST) > 1.0 > modelled_speedup(1.03 * t, 1.6e-3,
                                                                              HOST)
    assert "interpolated below the mean batch 4.0" in f.sentence


def test_a_verify_no_dearer_than_a_plain_step_never_stops_paying() -> None:
    b = dg.window(delta(host=HOST, positions=POSITIONS)).breakdown
    f = dg.batch_threshold(b, 6.5e-3)
    assert f is not None and f.severity == "ok" and f.evidence["threshold_batch"] is None
    assert f.sentence.startswith("no batch size up to 256 where speculation stops paying")


def test_a_draft_that_pays_at_no_batch_size() -> None:
    b = dg.window(delta(host=HOST, positions=(0.1, 0.05, 0.0, 0.0))).breakdown
    f = dg.batch_threshold(b, 2e-3)
    assert f is not None and f.evidence["threshold_batch"] == 1.0
    assert f.sentence.startswith("speculation does not pay at any batch size")


def test_only_a_baseline_measured_on_the_served_batch_is_a_plain_step() -> None:
    assert dg.window(measured(delta(host=HOST), 500.0)).baseline_measured
    assert not dg.window(measured(delta(host=HOST), 500.0, "configured")).baseline_measured
    assert not dg.window(delta(host=HOST, baseline=500.0)).baseline_measured
    assert not dg.window(delta(host=HOST)).baseline_measured
    # diagnose() gives the threshold and a measured verify scaling only for a measured one.
    found = {f.code: f for f in dg.diagnose(dg.window(measured(
        delta(host=HOST, positions=POSITIONS), 500.0)))}
    assert found["SPEC-ADVICE-BATCH"].evidence["plain_step_seconds"] == pytest.approx(2e-3)
    assert found["SPEC-ADVICE-K"].evidence["verify_scaling"] == pytest.approx(20 / 24)
    plain = {f.code: f for f in dg.diagnose(dg.window(delta(host=HOST, positions=POSITIONS,
                                                            baseline=500.0)))}
    assert "SPEC-ADVICE-BATCH" not in plain
    assert plain["SPEC-ADVICE-K"].evidence["verify_scaling"] == 0.0
