"""The forward's cost in tokens (:func:`specobs.tools._diagnosis.fit_forward` on the points
of :func:`~specobs.tools._diagnosis.cost_points`), and the batch size above which speculation
stops paying
(``SPEC-ADVICE-BATCH``), on constructed intervals checked against the cost model written out
again here, on both sides of the threshold."""

from __future__ import annotations

import pytest

from specobs import catalog
from specobs.tools import _diagnosis as dg
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._scrape import Delta
from tests.test_diagnosis import delta

POSITIONS = (0.85, 0.83, 0.80, 0.78)  # unconditional: E = 1 + their sum = 4.26
E = 1 + sum(POSITIONS)
HOST = {"draft": 2e-3, "verify": 6e-3, "bookkeeping": 0.2e-3}


def measured(d: Delta, tokens_per_second: float, source: str = "demo_measured") -> Delta:
    """``d`` with a baseline gauge of ``source``."""
    d.gauges.add(catalog.BASELINE_SEQUENCE_TOKENS.name, {"source": source}, tokens_per_second)
    return d


def test_the_forward_is_fitted_through_the_plain_step_and_verify() -> None:
    w = dg.window(measured(delta(host=HOST, positions=POSITIONS), 1 / 2.2e-3))
    points = dg.cost_points(w.breakdown, w.baseline_measured)
    # the plain step less the cycle's bookkeeping (0.2 ms), which a plain step pays too
    assert sorted((p.tokens, round(p.seconds, 9), p.source) for p in points) == [
        (4.0, 2e-3, "measured baseline"), (20.0, 6e-3, "verify k=4")]
    model = dg.fit_forward(points)
    assert model is not None and model.sure
    # verify 6 ms over 4 x 5 tokens, the plain step 2 ms over 4: 0.25 ms a token, 1 ms fixed.
    assert model.per_token_seconds == pytest.approx(0.25e-3)
    assert model.fixed_seconds == pytest.approx(1e-3)
    assert model.residual == pytest.approx(0.0, abs=1e-9)
    # A verify no dearer than the plain step: nothing grows with tokens.
    flat = dg.fit_forward(dg.cost_points(
        dg.window(measured(delta(host=HOST), 1 / 7.2e-3)).breakdown, True))
    assert flat is not None and flat.per_token_seconds == 0.0
    # A configured baseline is no point: one token count, no slope.
    alone = dg.fit_forward(dg.cost_points(dg.window(delta(host=HOST, baseline=500.0)).breakdown,
                                          False))
    assert alone is not None and not alone.sure and alone.per_token_seconds == 0.0


# -- the threshold over the batch sizes observed ------------------------------------------------

K = 4


def costs(batch: float, *, fixed: float = 1e-3, per: float = 0.1e-3, exponent: float = 0.8,
          draft: tuple[float, float] = (0.8e-3, 0.03e-3), bookkeeping: float = 0.2e-3
          ) -> tuple[float, float, float]:
    """A constructed server: a forward over n tokens costs fixed + per n^exponent (sublinear
    below 1: the cost per token falls with the batch, as on the CPU demo), the plain step is
    one over the batch, verify one over batch (k + 1) tokens, the draft d0 + d1 batch^exponent.
    The plain step, verify and the cycle at ``batch``."""
    plain = fixed + per * batch ** exponent
    verify = fixed + per * (batch * (K + 1)) ** exponent
    return plain, verify, draft[0] + draft[1] * batch ** exponent + verify + bookkeeping


def point(batch: float, tokens: float = 3.4, cycles: float = 1000.0, **kw: float
          ) -> dg.BatchPoint:
    plain, verify, cycle = costs(batch, **kw)  # type: ignore[arg-type]
    return dg.BatchPoint(batch, plain, cycle, verify, tokens, K, cycles)


def true_threshold(tokens: float = 3.4, **kw: float) -> float:
    """Where the constructed server's speedup crosses 1, by bisection on its own costs."""
    lo, hi = 1.0, 1e6
    assert point(lo, tokens, **kw).speedup >= 1.0 > point(hi, tokens, **kw).speedup
    while hi - lo > 1e-4 * lo:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if point(mid, tokens, **kw).speedup >= 1.0 else (lo, mid)
    return lo


def test_the_one_batch_line_errs_low_where_several_batches_do_not() -> None:
    # Verify grows sublinearly (exponent 0.8): speculation pays 1.56x at batch 1, 1.16x at 16,
    # and stops paying only at about 61.
    truth = true_threshold()
    assert truth == pytest.approx(60.7, rel=0.01)
    # The straight line through batch 4 alone (the old fit) names 10: 6x too low.
    line = dg.line_threshold(point(4.0))
    assert line is not None and line < truth / 4
    # Fitted over batches 1..16 it is extrapolated 2.5x beyond them and named as such, low.
    f = dg.batch_threshold([point(b) for b in (1, 2, 4, 8, 16)])
    assert f is not None and (f.severity, f.evidence["confidence"]) == ("info", "low")
    t = f.evidence["threshold_batch"]
    assert isinstance(t, float) and 0.6 * truth < t < 1.1 * truth
    assert f.evidence["extrapolation_factor"] == pytest.approx(t / 16)
    assert "extrapolated from batches 4.0..16.0" in f.sentence
    assert "x the largest batch observed, confidence low" in f.sentence
    assert "1.56x at 1.0" in f.sentence and "1.16x at 16.0" in f.sentence
    # With batch 32 observed too it is 1.5x beyond: medium confidence, and closer.
    f32 = dg.batch_threshold([point(b) for b in (1, 2, 4, 8, 16, 32)])
    assert f32 is not None and f32.evidence["confidence"] == "medium"
    t32 = f32.evidence["threshold_batch"]
    assert isinstance(t32, float) and abs(t32 - truth) < abs(t - truth)


def test_one_batch_size_names_no_threshold() -> None:
    f = dg.batch_threshold([point(4.0)])
    assert f is not None and (f.code, f.severity) == ("SPEC-ADVICE-BATCH", "ok")
    assert f.evidence["threshold_batch"] is None and f.evidence["batches_observed"] == 1.0
    assert f.sentence.startswith("speculation pays at the one batch size observed (1.39x at "
                                 "4.0); where it stops paying cannot be told from one batch")
    # The straight line's guess stays in the evidence, not in a sentence no one can act on.
    assert "would say" not in f.sentence
    assert f.evidence["line_threshold_batch"] == pytest.approx(dg.line_threshold(point(4.0)))
    assert "several batch sizes" in f.advice
    # Windows within 1.25x of each other's batch are one batch size.
    same = dg.batch_threshold([point(4.0), point(4.9, cycles=3000.0)])
    assert same is not None and same.evidence["batches_observed"] == 1.0
    assert same.evidence["threshold_batch"] is None
    two = dg.batch_threshold([point(4.0), point(5.1)])
    assert two is not None and two.evidence["batches_observed"] == 2.0


def test_a_crossing_between_batches_observed_is_measured() -> None:
    # Speculation pays 1.56x at 1 ... 1.07x at 32 and 0.998x at 64; 0.95x at 128.
    pts = [point(b) for b in (1, 4, 16, 32, 64, 128)]
    assert pts[3].speedup > 1.0 > pts[4].speedup
    f = dg.batch_threshold(pts)
    assert f is not None and (f.severity, f.evidence["confidence"]) == ("info", "measured")
    t = f.evidence["threshold_batch"]
    assert isinstance(t, float) and 32 < t < 64
    assert t == pytest.approx(true_threshold(), rel=0.1)
    assert f.sentence.startswith("speculation stops paying between batch 32.0 (1.07x) and "
                                 "64.0 (1.00x), about 61 (measured at batches 1.0..128.0:")
    assert "num_speculative_tokens_per_batch_size" in f.advice
    # The order the windows come in does not matter.
    assert dg.batch_threshold(pts[::-1]) == f


def test_a_draft_that_pays_at_no_batch_size() -> None:
    low = [point(b, tokens=1.2) for b in (1, 4, 16)]
    f = dg.batch_threshold(low)
    assert f is not None and f.evidence["threshold_batch"] == 1.0
    assert f.sentence.startswith("speculation did not pay at any batch size observed")
    assert f.sentence.endswith("at any batch size")
    # Not measured below batch 8: no threshold named.
    f8 = dg.batch_threshold([point(b, tokens=1.2) for b in (8, 16)])
    assert f8 is not None and f8.evidence["threshold_batch"] is None
    assert f8.sentence.endswith("below batch 8.0 it was not measured")


def test_a_trend_too_far_beyond_the_batches_observed_is_not_named() -> None:
    # Sublinear costs that keep speculation above 1 far out (E = 4.26): the trend crosses 1
    # only beyond 4x the largest batch observed, or never within 64x.
    f = dg.batch_threshold([point(b, tokens=E, exponent=0.9) for b in (1, 2, 4, 8)])
    assert f is not None and f.severity == "ok" and f.evidence["threshold_batch"] is None
    far = f.evidence["extrapolated_batch"]
    assert isinstance(far, float) and far > th.BATCH_EXTRAPOLATION_MAX * 8
    assert "too far to name" in f.sentence
    never = dg.batch_threshold([point(b, tokens=E, exponent=0.5) for b in (1, 2, 4, 8)])
    assert never is not None and never.evidence["extrapolated_batch"] is None
    assert "stays above 1 up to 512" in never.sentence


def test_a_smaller_batch_that_did_not_pay_is_not_called_paying() -> None:
    pts = [point(b, exponent=0.0) for b in (4, 16)]
    slow = dg.BatchPoint(1.0, 1e-3, 5e-3, 3e-3, 3.4, K, 1000.0)  # 0.68x
    f = dg.batch_threshold([slow, *pts])
    assert f is not None and f.evidence["threshold_batch"] is None
    assert f.sentence.startswith("speculation pays at the largest batch size observed (0.68x "
                                 "at 1.0, ")


def test_costs_flat_in_the_batch_never_stop_paying() -> None:
    # A GPU at small batch: the plain step, verify and the draft do not grow with the batch.
    flat = [point(b, exponent=0.0) for b in (1, 4, 16)]
    f = dg.batch_threshold(flat)
    assert f is not None and f.severity == "ok" and f.evidence["threshold_batch"] is None
    assert f.evidence["verify_exponent"] == 0.0 and f.evidence["plain_exponent"] == 0.0


def test_the_cpu_demos_batches_name_no_threshold() -> None:
    # Recorded with advisor_k.py --batches on a CPU (docs/diagnosis.md): speculation
    # paid 2.10x at batch 1 to 1.61x at 64, where the one-batch line named 12 from batch 1.
    recorded = [  # batch, plain step, host cycle, verify (seconds), tokens per sequence-cycle
        (1.0, 2.137e-3, 4.577e-3, 2.521e-3, 4.495), (2.0, 2.450e-3, 5.072e-3, 2.825e-3, 4.310),
        (4.0, 3.053e-3, 6.650e-3, 3.772e-3, 4.376), (8.0, 4.479e-3, 9.875e-3, 5.868e-3, 4.347),
        (16.0, 6.159e-3, 15.600e-3, 9.483e-3, 4.366),
        (32.0, 10.787e-3, 27.492e-3, 17.290e-3, 4.371),
        (64.0, 23.326e-3, 63.499e-3, 40.947e-3, 4.373),
    ]
    pts = [dg.BatchPoint(b, p, c, v, e, 4, 600.0) for b, p, c, v, e in recorded]
    assert [round(p.speedup, 2) for p in pts] == [2.10, 2.08, 2.01, 1.97, 1.72, 1.72, 1.61]
    assert [round(dg.line_threshold(p) or 0) for p in pts] == [12, 27, 37, 62, 72, 139, 229]
    # Every prefix of the batches, as a server that served only those would be told: no
    # threshold, where the one-batch line named one far inside the batches that paid.
    for n in range(1, len(pts) + 1):
        f = dg.batch_threshold(pts[:n])
        assert f is not None and f.severity == "ok" and f.evidence["threshold_batch"] is None
    assert "extrapolated from batches 16.0..64.0" in f.sentence
    assert f.evidence["verify_exponent"] == pytest.approx(1.0)


def test_windows_of_other_batch_sizes_join_the_fit() -> None:
    def window_at(batch: float, source: str = "demo_measured") -> dg.Window:
        plain, verify, cycle = costs(batch)
        rest = cycle - verify
        d = delta(batch=batch, positions=(0.75, 0.65, 0.55, 0.45),
                  host={"draft": rest - 0.2e-3, "verify": verify, "bookkeeping": 0.2e-3})
        return dg.window(measured(d, 1.0 / plain, source))

    recent = window_at(16.0)
    p = dg.batch_point(recent)
    assert p is not None and p.batch == 16.0 and p.tokens == pytest.approx(3.4)
    assert p.speedup == pytest.approx(point(16.0).speedup)
    alone = {f.code: f for f in dg.diagnose(recent)}["SPEC-ADVICE-BATCH"]
    assert alone.evidence["threshold_batch"] is None
    others = [window_at(b) for b in (1.0, 2.0, 4.0, 8.0)]
    joined = {f.code: f for f in dg.diagnose(recent, batch_windows=others)}["SPEC-ADVICE-BATCH"]
    direct = dg.batch_threshold([point(b) for b in (1, 2, 4, 8, 16)])
    assert direct is not None and joined.sentence == direct.sentence
    assert joined.evidence["threshold_batch"] == pytest.approx(direct.evidence["threshold_batch"])
    # A configured baseline may be of any batch: such a window is no point.
    assert dg.batch_point(window_at(8.0, "configured")) is None
    few = {f.code: f for f in dg.diagnose(recent, batch_windows=[
        window_at(b, "configured") for b in (1.0, 2.0)])}["SPEC-ADVICE-BATCH"]
    assert few.evidence["batches_observed"] == 1.0


def test_only_a_baseline_measured_on_the_served_batch_is_a_plain_step() -> None:
    assert dg.window(measured(delta(host=HOST), 500.0)).baseline_measured
    assert not dg.window(measured(delta(host=HOST), 500.0, "configured")).baseline_measured
    assert not dg.window(delta(host=HOST, baseline=500.0)).baseline_measured
    assert not dg.window(delta(host=HOST)).baseline_measured
    # diagnose() gives the threshold and a measured verify scaling only for a measured one.
    found = {f.code: f for f in dg.diagnose(dg.window(measured(
        delta(host=HOST, positions=POSITIONS), 500.0)))}
    assert found["SPEC-ADVICE-BATCH"].evidence["speedup_batch4.0"] == pytest.approx(
        E * 2e-3 / sum(HOST.values()))
    # plain step 2 ms - 0.2 ms of bookkeeping over 4 tokens, verify 6 ms over 20
    assert found["SPEC-ADVICE-K"].evidence["forward_per_token_seconds"] == pytest.approx(
        (6e-3 - 1.8e-3) / 16)
    plain = {f.code: f for f in dg.diagnose(dg.window(delta(host=HOST, positions=POSITIONS,
                                                            baseline=500.0)))}
    assert "SPEC-ADVICE-BATCH" not in plain
    assert plain["SPEC-ADVICE-K"].evidence["forward_points"] == 1.0
    assert plain["SPEC-ADVICE-K"].evidence["candidates"] == "3,4,5"
