"""The advisor: the speculation length k the measured acceptance and costs favour, the speedup
the cost model predicts (:mod:`._cost`) and the draft's cost."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specobs.tools._breakdown import Breakdown
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._cost import CycleCosts, ForwardModel, Prediction, cycle_costs
from specobs.tools._diagnosis._findings import Finding
from specobs.tools._diagnosis._window import conditional_acceptance
from specobs.tools._diagnosis._words import found

__all__ = [
    "FirstPosition", "Prospects", "advise_k", "candidates", "draft_cost", "expected_tokens",
    "extended_rates", "nearest_best", "predict", "prospects", "rate_interval", "slopes",
]


# -- the advisor ----------------------------------------------------------------------------------


def extended_rates(conditional: Sequence[float], n: int) -> list[float]:
    """The conditional rates a_0 .. a_(n-1): the measured ones, and beyond them the in-cycle
    rates' (a_1 ..) straight line, fitted weighted by how many drafts each position judged (the
    share of cycles that reach it, a_0 ... a_(i-1)), held level where it rises (a draft does not
    get better further from its last verified token) and from fewer than
    :data:`TREND_MIN_RATES` rates; with a_0 alone measured (k = 1), a_0 (docs/diagnosis.md)."""
    rates = list(conditional[:n])
    if len(rates) >= n or not conditional:
        return rates
    inner = list(conditional[1:])
    if not inner:
        return rates + [conditional[0]] * (n - len(rates))
    xs = range(1, len(conditional))
    weights = [math.prod(conditional[:i]) for i in xs]
    total = math.fsum(weights)
    if not total > 0:
        return rates + [inner[-1]] * (n - len(rates))
    mean_x = math.fsum(w * x for w, x in zip(weights, xs, strict=True)) / total
    level = math.fsum(w * a for w, a in zip(weights, inner, strict=True)) / total
    slope = 0.0
    if len(inner) >= th.TREND_MIN_RATES:
        spread = math.fsum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs, strict=True))
        if spread > 0:
            slope = min(0.0, math.fsum(w * (x - mean_x) * (a - level) for w, x, a
                                       in zip(weights, xs, inner, strict=True)) / spread)
    return rates + [min(1.0, max(0.0, level + slope * (i - mean_x)))
                    for i in range(len(rates), n)]


def expected_tokens(conditional: Sequence[float], k: int) -> float:
    """Tokens one sequence gains per cycle drafting ``k``: 1 + a_0 + a_0 a_1 + ... +
    a_0 ... a_(k-1), the conditional rates beyond the measured ones extrapolated
    (:func:`extended_rates`)."""
    total, survive = 1.0, 1.0
    for a in extended_rates(conditional, k):
        survive *= a
        total += survive
    return total


@dataclass(frozen=True)
class FirstPosition:
    """The first draft position's acceptance as a mix of two starts: a cycle that follows one
    whose drafts were all accepted starts after text the draft predicted, then the target's
    bonus token (accepted at ``after_full``); one that follows a rejection starts where the
    draft just failed (accepted at ``after_rejection``). With g the in-cycle rate after an
    accepted draft (the geometric mean of a_1 .. a_(k-1)), the bonus token is easy text with
    chance g and hard otherwise, so h = ``after_full`` = g^2 + (1 - g) r; r is solved from the
    measured a_0 and the measured share of full cycles f: a_0 = f h + (1 - f) r. The share of
    full cycles falls as k grows, and with it a_0: :meth:`at` gives a_0 at another k, the fixed
    point of a_0 = r + (h - r) a_0 P(k'), with P(k') = a_1 ... a_(k'-1)."""

    after_full: float
    after_rejection: float
    conditional: tuple[float, ...]

    @classmethod
    def fit(cls, conditional: Sequence[float], k: int) -> FirstPosition | None:
        """From the rates measured at ``k``; ``None`` where the mix cannot be told: k = 1 (no
        in-cycle rate), a first position accepted at least as often as the later ones, or one
        the whole cycles before it account for entirely."""
        cond = tuple(conditional)
        if k < 2 or len(cond) < k or not all(0 < a <= 1 for a in cond[:k]):
            return None
        later = cond[1:k]
        in_cycle = math.exp(math.fsum(math.log(a) for a in later) / len(later))
        full = cond[0] * math.prod(later)
        if not cond[0] < in_cycle or not full < 1:
            return None
        # a_0 = f (g^2 + (1 - g) r) + (1 - f) r, solved for r.
        after_rejection = (cond[0] - full * in_cycle**2) / (1 - full * in_cycle)
        if not after_rejection > 0:
            # Every first-position acceptance explained by whole cycles before it: a draft that
            # never recovers after a rejection, which the mix cannot extrapolate (and its fixed
            # point would divide by zero where the later rates are all 1).
            return None
        after_full = in_cycle**2 + (1 - in_cycle) * after_rejection
        return cls(after_full, after_rejection, cond)

    def at(self, k: int) -> float:
        """a_0 at ``k``: the share of full cycles there from the measured a_1 .. (extrapolated
        beyond the measured k by :func:`extended_rates`)."""
        later = math.prod(extended_rates(self.conditional, k)[1:])
        return self.after_rejection / (1 - (self.after_full - self.after_rejection) * later)


def rate_interval(conditional: Sequence[float], drafted_first: float | None,
                  z: float = th.ADVICE_Z) -> tuple[list[float], list[float]]:
    """The conditional rates ``z`` standard errors below and above the measured ones: a_i was
    judged on the sequence-cycles that reached position i, ``drafted_first`` times a_0 ...
    a_(i-1). Without ``drafted_first`` both ends are the measured rates."""
    rates = list(conditional)
    if drafted_first is None or not drafted_first > 0:
        return rates, rates
    low, high, reach = [], [], drafted_first
    for a in rates:
        se = math.sqrt(max(a * (1 - a), 0.0) / reach) if reach > 0 else 1.0
        low.append(max(0.0, a - z * se))
        high.append(min(1.0, a + z * se))
        reach *= a
    return low, high


@dataclass(frozen=True)
class Prospects:
    """Tokens/s per sequence at each k for one window, under the cost model: the window's
    :class:`CycleCosts` with verify moved along the :class:`ForwardModel`, and tokens per cycle
    from its conditional rates (:func:`expected_tokens`; the first position's moved with k by
    :class:`FirstPosition` where it can be fitted)."""

    costs: CycleCosts
    model: ForwardModel | None
    conditional: tuple[float, ...]

    def tokens(self, k: int, rates: Sequence[float] | None = None) -> float:
        cond = list(self.conditional if rates is None else rates)
        if k == 0:
            return 1.0
        first = FirstPosition.fit(cond, self.costs.k)
        if first is not None and k != self.costs.k:
            cond = [first.at(k), *cond[1:]]
        return expected_tokens(cond, k)

    def cycle(self, k: int) -> float:
        return self.costs.at(k, self.model)

    def rate(self, k: int, rates: Sequence[float] | None = None) -> float:
        """Tokens/s per sequence drafting ``k`` (k >= 1)."""
        return self.tokens(k, rates) / self.cycle(k)

    def plain(self) -> float | None:
        """Host seconds of a plain step of this batch: the model's forward where its slope was
        measured, and the cycle's bookkeeping and host work, which a plain step pays too;
        ``None`` otherwise."""
        if self.model is None or not self.model.sure:
            return None
        return self.model.at(self.costs.batch) + self.costs.rest

    def speedup(self, k: int, rates: Sequence[float] | None = None) -> float | None:
        """Predicted speedup over a plain step drafting ``k``; ``None`` without a plain step."""
        plain = self.plain()
        return None if plain is None else self.rate(k, rates) * plain


def slopes(pr: Prospects) -> list[ForwardModel]:
    """The forward with its slope at both ends of what a plain step off by
    :data:`PLAIN_STEP_SPREAD` allows (the slope is the difference between verify and the plain
    step over the B k tokens between them, so a plain step 10% off moves it by 0.1 plain / B k);
    none where the slope was not measured."""
    model, costs = pr.model, pr.costs
    if model is None or not model.sure:
        return []
    shift = th.PLAIN_STEP_SPREAD * model.at(costs.batch) / (costs.batch * costs.k)
    return [dataclasses.replace(model, per_token_seconds=max(0.0, model.per_token_seconds + d))
            for d in (-shift, shift)]


def candidates(k: int, model: ForwardModel | None) -> list[int]:
    """The lengths the advisor weighs from a measured ``k``: 1 .. k + :data:`ADVICE_BEYOND`
    (at most :data:`ADVICE_MAX_K`) where the forward's growth with tokens was measured, so that
    acceptance is not extrapolated far beyond the positions measured; one step either side where
    the forward's growth was not measured."""
    if model is not None and model.sure:
        return list(range(1, int(min(th.ADVICE_MAX_K, k + th.ADVICE_BEYOND)) + 1))
    return [kk for kk in (k - 1, k, k + 1) if 1 <= kk <= th.ADVICE_MAX_K]


def nearest_best(ks: Sequence[int], rate: Callable[[int], float], k: int) -> int:
    """Of ``ks``, the one nearest ``k`` among those within :data:`ADVICE_ALIKE` of the best
    ``rate``."""
    top = max(rate(kk) for kk in ks)
    alike = [kk for kk in ks if rate(kk) >= top * (1 - th.ADVICE_ALIKE)]
    return min(alike, key=lambda kk: (abs(kk - k), kk))


def prospects(b: Breakdown, model: ForwardModel | None) -> Prospects | None:
    """The :class:`Prospects` of ``b``; ``None`` without acceptance or phase costs."""
    costs = cycle_costs(b)
    cond = [a for _, a in conditional_acceptance(b)]
    if costs is None or len(cond) < costs.k:
        return None
    return Prospects(costs, model, tuple(cond[:costs.k]))


def advise_k(b: Breakdown, model: ForwardModel | None = None,
             drafted_first: float | None = None) -> Finding | None:
    """The k that maximizes tokens/s per sequence under the cost model, from the measured
    conditional acceptance and phase costs (GPU clock first); ``None`` without the data.

    A cycle drafting k' costs rest + verify + p B (k' - k) + f + (draft - f) k' / k in host
    seconds (:class:`CycleCosts`), where p is the forward's cost per token fitted from the
    server's own points (:func:`fit_forward`: plain steps, verifies at each k served), f the
    draft's part that does not grow with k (:func:`draft_fixed`). Where the slope could not be
    measured (one token count seen) verify is held and k moves one step at a time. Tokens per
    cycle are :func:`expected_tokens` of the conditional rates (beyond the measured positions
    their trend, never rising; a_0 moved with k by :class:`FirstPosition`). Another k is named
    only where its gain is at least :data:`ADVICE_MIN_GAIN` at the pessimistic end of the
    rates' interval (:func:`rate_interval`), so a window too short to tell gives no advice that
    a longer one would reverse."""
    pr = prospects(b, model)
    if pr is None:
        return None
    k, costs = pr.costs.k, pr.costs
    ks = candidates(k, model)
    first = FirstPosition.fit(pr.conditional, k)
    low, high = rate_interval(pr.conditional, drafted_first)
    alternatives = [pr, *(dataclasses.replace(pr, model=m) for m in slopes(pr))]

    def gains(kk: int) -> tuple[float, float, float]:
        """The gain of ``kk`` over ``k``: predicted, and its pessimistic and optimistic ends
        over the acceptance's interval and the forward's slope's."""
        g = pr.rate(kk) / pr.rate(k) - 1
        ends = [a.rate(kk, r) / a.rate(k, r) - 1 for a in alternatives for r in (low, high)]
        return g, min(*ends, g), max(*ends, g)

    # Of the lengths alike the best, the nearest whose gain holds at the data's pessimistic
    # end; the best itself where none does (its gain then says how sure it is).
    best = nearest_best(ks, pr.rate, k)
    top = max(ks, key=pr.rate)
    alike = sorted((kk for kk in ks if pr.rate(kk) >= pr.rate(top) * (1 - th.ADVICE_ALIKE)),
                   key=lambda kk: (abs(kk - k), kk))
    best = next((kk for kk in alike if gains(kk)[1] >= th.ADVICE_MIN_GAIN), best)
    gain, gain_low, gain_high = gains(best)
    evidence: dict[str, float | str | None] = {
        "clock": costs.clock, "k": float(k), "best_k": float(best), "predicted_gain": gain,
        "predicted_gain_low": gain_low, "predicted_gain_high": gain_high,
        "batch": costs.batch, "candidates": ",".join(map(str, ks)),
        "draft_fixed_seconds": costs.draft_fixed,
        "draft_per_position_seconds": costs.draft_per_position,
        "draft_fixed_from": costs.draft_fixed_from,
        "verify_seconds": costs.verify, "rest_seconds": costs.rest,
        "first_position_after_full": None if first is None else first.after_full,
        "first_position_after_rejection": None if first is None else first.after_rejection,
        **(model.evidence() if model is not None else {"forward_points": 0.0}),
        **{f"predicted_tokens_per_second_k{kk}": pr.rate(kk) for kk in ks},
    }
    plain = pr.plain()
    if plain is not None:
        evidence["plain_step_seconds"] = plain
        evidence.update({f"predicted_speedup_k{kk}": pr.rate(kk) * plain for kk in ks})
    fitted_on = _points_text(model) if model is not None and model.sure else None
    words: dict[str, Any] = {"k": k, "best": best, "fitted_on": fitted_on}
    if best == k or gain_low < th.ADVICE_MIN_GAIN:
        return found("SPEC-ADVICE-K", "ok", evidence, "best", **words)
    return found("SPEC-ADVICE-K", "info", evidence, **words)


def _points_text(model: ForwardModel | None) -> str:
    if model is None:
        return "no point"
    kinds = sorted({p.source for p in model.points})
    return f"{len(model.points)} points ({', '.join(kinds)})"


# -- the speedup predicted, against the realized one ---------------------------------------------

def predict(b: Breakdown, model: ForwardModel | None) -> Prediction | None:
    """The :class:`Prediction` of ``b``: tokens per sequence-cycle from acceptance, times the
    model's plain step, over the model's cycle (draft and the rest as measured, verify from the
    fitted forward at B (k + 1)); ``None`` without a fitted slope or the window's costs."""
    pr = prospects(b, model)
    if pr is None or model is None or not model.sure:
        return None
    costs = pr.costs
    plain = model.at(costs.batch) + costs.rest
    cycle = costs.rest + costs.draft + model.at(costs.batch * (costs.k + 1))
    tokens = pr.tokens(costs.k)
    if not plain > 0 or not cycle > 0:
        return None
    measured_tokens = (b.sequence_tokens_per_second * costs.cycle
                       if b.sequence_tokens_per_second is not None else None)
    base = b.baseline_tokens_per_second
    return Prediction(tokens * plain / cycle, tokens, measured_tokens, plain,
                      1.0 / base if base else None, cycle, costs.cycle)


# -- the draft's cost ----------------------------------------------------------------------------


def draft_cost(b: Breakdown, past: Breakdown | None = None,
               model: ForwardModel | None = None) -> Finding | None:
    """``SPEC-DRAFT-COSTLY`` (warn) when the draft phase costs at least
    :data:`DRAFT_MAX_OF_VERIFY` of a verify and eats at least :data:`DRAFT_EATS_GAIN` of the
    gain a free draft would give (the cycle without its draft phase against a plain step), with
    its cost a position against a plain target step, its trend against ``past`` and the best k
    at its cost;
    ``SPEC-DRAFT-COST`` (ok) otherwise; ``None`` without the phase costs or a plain step to
    compare with."""
    pr = prospects(b, model)
    if pr is None:
        return None
    costs = pr.costs
    plain = pr.plain()
    base = b.baseline_tokens_per_second
    if plain is None and base:
        plain = 1.0 / base
    if plain is None or not plain > 0:
        return None
    k = costs.k
    tokens = pr.tokens(k)
    speedup = tokens * plain / costs.cycle
    free = tokens * plain / max(costs.cycle - costs.draft, 1e-12)
    eaten = 1.0 if free <= 1 else min(1.0, max(0.0, (free - speedup) / (free - 1)))
    per_step = costs.draft_per_position / plain
    ks = candidates(k, model)
    best = max(ks, key=pr.rate)
    evidence: dict[str, float | str | None] = {
        "k": float(k), "draft_seconds": costs.draft, "verify_seconds": costs.verify,
        "draft_of_verify": costs.draft / costs.verify, "plain_step_seconds": plain,
        "draft_per_position_of_plain_step": per_step, "predicted_speedup": speedup,
        "speedup_with_a_free_draft": free, "gain_eaten_by_draft": eaten,
        "best_k_at_this_draft_cost": float(best),
    }
    if past is not None:
        before = cycle_costs(past)
        if before is not None and before.draft_per_position > 0:
            evidence["draft_per_position_against_past"] = \
                costs.draft_per_position / before.draft_per_position
    if costs.draft >= th.DRAFT_MAX_OF_VERIFY * costs.verify and eaten >= th.DRAFT_EATS_GAIN:
        return found("SPEC-DRAFT-COSTLY", "warn", evidence, k=k, best=best)
    return found("SPEC-DRAFT-COST", "ok", evidence, k=k, best=best)
