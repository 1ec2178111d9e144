"""The advisor: the speculation length k the measured acceptance and costs favour, the
forward's cost in tokens, and the batch size above which speculation stops paying."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specobs.tools._breakdown import Breakdown
from specobs.tools._diagnosis._findings import Finding, _clock, _mean, _ms
from specobs.tools._diagnosis._window import conditional_acceptance

__all__ = [
    "ADVICE_MAX_K", "ADVICE_MIN_GAIN", "BATCH_SEARCH_MAX_FACTOR", "ForwardCost", "advise_k",
    "batch_threshold", "expected_tokens", "forward_cost", "verify_scaling",
]

#: The advisor considers k from 1 to this, and names another k only for a predicted gain of at
#: least ADVICE_MIN_GAIN.
ADVICE_MAX_K = 8
ADVICE_MIN_GAIN = 0.03


# -- the advisor ----------------------------------------------------------------------------------


def expected_tokens(conditional: Sequence[float], k: int) -> float:
    """Tokens one sequence gains per cycle drafting ``k``: 1 + a_0 + a_0 a_1 + ... +
    a_0 ... a_(k-1), with the conditional rates beyond the measured ones taken as the last one."""
    total, survive = 1.0, 1.0
    for i in range(k):
        a = conditional[min(i, len(conditional) - 1)]
        survive *= a
        total += survive
    return total


def advise_k(b: Breakdown, verify_scaling: float = 0.0) -> Finding | None:
    """The k that maximizes tokens/s per sequence under a stated cost model, from the measured
    conditional acceptance and phase costs (GPU clock first); ``None`` without the data.

    Cost model: a cycle drafting k' costs t_bookkeeping + t_verify * (1 + s * (k' - k) / (k + 1))
    + t_draft * k' / k, where k is the length measured, t_* the measured means and s =
    ``verify_scaling`` the part of verify that grows with the positions verified (0: verify
    costs the same for any k', true where verify is memory- or launch-bound, as on a GPU at small
    batch; 1: proportional to the k' + 1 positions). Tokens per cycle are
    :func:`expected_tokens`, the measured conditional rates held fixed: beyond the measured k
    the last rate is extrapolated, and the first position's rate itself moves with k (where
    cycles start depends on k: docs/diagnosis.md), so a recommendation away from the measured k
    is a direction to try, not a promise."""
    clock = _clock(b)
    cond = [a for _, a in conditional_acceptance(b)]
    k = sum(1 for _, rate in b.position_acceptance if rate is not None)
    if clock is None or not cond or k < 1 or len(cond) < k:
        return None
    means = {p: b.stats[(p, clock)].mean_seconds for p in b.phases if (p, clock) in b.stats}
    d, v = means.get("draft"), means.get("verify")
    if d is None or v is None or not v > 0:
        return None
    rest = math.fsum(m for p, m in means.items() if p not in ("draft", "verify") and m)

    def rate(kk: int) -> float:
        cost = rest + v * (1 + verify_scaling * (kk - k) / (k + 1)) + d * kk / k
        return expected_tokens(cond, kk) / cost

    current = rate(k)
    best = max(range(1, ADVICE_MAX_K + 1), key=rate)
    gain = rate(best) / current - 1
    evidence: dict[str, float | str | None] = {
        "clock": clock, "k": float(k), "best_k": float(best), "predicted_gain": gain,
        "verify_scaling": verify_scaling,
        **{f"predicted_tokens_per_second_k{kk}": rate(kk) for kk in range(1, ADVICE_MAX_K + 1)},
    }
    if best == k or gain < ADVICE_MIN_GAIN:
        return Finding("SPEC-ADVICE-K", "ok",
                       f"k={k} is the best speculation length the measured acceptance and "
                       f"{clock} costs predict (another k gains under "
                       f"{ADVICE_MIN_GAIN * 100:.0f}%)", evidence)
    beyond = " (extrapolated beyond the measured k)" if best > k else ""
    return Finding(
        "SPEC-ADVICE-K", "info",
        f"k={best} is predicted {gain * 100:+.0f}% tokens/s per sequence against the k={k} "
        f"measured{beyond}, from the conditional acceptance and the {clock} phase costs",
        evidence,
        f"try k={best} and compare; the model holds acceptance fixed per position and verify's "
        "cost fixed in k",
    )


# -- the forward's cost in tokens, and the batch size where speculation stops paying -------------

#: Batch sizes the threshold search looks at, as multiples of the measured mean batch.
BATCH_SEARCH_MAX_FACTOR = 64.0


@dataclass(frozen=True)
class ForwardCost:
    """A target forward over n tokens costs ``fixed_seconds + per_token_seconds * n``: fitted
    through the plain decode step (the measured baseline: n = B, one token per sequence) and the
    verify phase (n = B (k + 1)) at the window's mean batch B."""

    fixed_seconds: float
    per_token_seconds: float
    batch: float
    k: int


def forward_cost(b: Breakdown, plain_step_seconds: float | None) -> ForwardCost | None:
    """The :class:`ForwardCost` of ``b``'s target from ``plain_step_seconds`` (1 / a baseline
    measured on the served batch) and the measured verify mean (GPU clock first); ``None``
    without either. A verify no dearer than the plain step gives ``per_token_seconds`` 0: the
    forward is bound by reading weights or launching kernels, not by the tokens it computes."""
    clock = _clock(b)
    k = sum(1 for _, rate in b.position_acceptance if rate is not None)
    batch = b.mean_batch_size
    if clock is None or k < 1 or batch is None or not batch > 0 or plain_step_seconds is None \
            or not plain_step_seconds > 0:
        return None
    v = _mean(b, "verify", clock)
    if v is None or not v > 0:
        return None
    per_token = max(0.0, (v - plain_step_seconds) / (batch * k))
    return ForwardCost(v - per_token * batch * (k + 1), per_token, batch, k)


def verify_scaling(cost: ForwardCost | None) -> float:
    """The part of verify that grows with the positions verified (:func:`advise_k`'s ``s``):
    0 without a :class:`ForwardCost`."""
    if cost is None:
        return 0.0
    v = cost.fixed_seconds + cost.per_token_seconds * cost.batch * (cost.k + 1)
    return min(1.0, max(0.0, cost.per_token_seconds * cost.batch * (cost.k + 1) / v))


def batch_threshold(b: Breakdown, plain_step_seconds: float | None) -> Finding | None:
    """The batch size above which speculation stops paying (what vLLM users set as
    ``disable_by_batch_size``), from the window's :class:`ForwardCost`; ``None`` without one.

    Model: at batch B' a plain step costs f + p B' and verify f + p B' (k + 1), the draft and
    bookkeeping scale with verify's cost (the draft is a smaller forward over as many sequences),
    and the tokens per sequence-cycle stay the measured ones. Speculation pays at B' while
    E / (cycle at B') exceeds 1 / (plain step at B'). The forward's costs are fitted at the one
    mean batch measured, so a threshold away from it is extrapolated along a straight line (a
    GPU's cost per token drops as it saturates): a direction and an order of magnitude."""
    cost = forward_cost(b, plain_step_seconds)
    clock = _clock(b)
    host_cycle = b.cycle_mean_seconds.get("host")
    if cost is None or clock is None or host_cycle is None or b.sequence_tokens_per_second is None:
        return None
    assert plain_step_seconds is not None
    tokens = b.sequence_tokens_per_second * host_cycle
    means = {p: b.stats[(p, clock)].mean_seconds for p in b.phases if (p, clock) in b.stats}
    v = means.get("verify") or 0.0
    others = math.fsum(m for p, m in means.items() if p != "verify" and m)
    # Time of the host cycle outside the phases on this clock (host overhead) stays fixed.
    outside = max(0.0, host_cycle - v - others) if clock == "host" else 0.0

    def gain(batch: float) -> float:
        verify = cost.fixed_seconds + cost.per_token_seconds * batch * (cost.k + 1)
        cycle = verify * (1 + others / v) + outside if v > 0 else verify + outside
        plain = cost.fixed_seconds + cost.per_token_seconds * batch
        return tokens * plain / cycle

    now = gain(cost.batch)
    evidence: dict[str, float | str | None] = {
        "clock": clock, "k": float(cost.k), "mean_batch": cost.batch,
        "plain_step_seconds": plain_step_seconds, "fixed_seconds": cost.fixed_seconds,
        "per_token_seconds": cost.per_token_seconds, "tokens_per_sequence_cycle": tokens,
        "modelled_speedup": now,
    }
    top = cost.batch * BATCH_SEARCH_MAX_FACTOR
    if gain(1.0) < 1.0:
        return Finding(
            "SPEC-ADVICE-BATCH", "info",
            f"speculation does not pay at any batch size by the cost model: {tokens:.2f} tokens "
            f"per sequence-cycle do not cover a cycle of {_ms(host_cycle)} against a plain step "
            f"of {_ms(plain_step_seconds)} at mean batch {cost.batch:.1f}",
            {**evidence, "threshold_batch": 1.0}, "see the speedup and acceptance findings",
        )
    if cost.per_token_seconds <= 0 or gain(top) >= 1.0:
        return Finding(
            "SPEC-ADVICE-BATCH", "ok",
            f"no batch size up to {top:.0f} where speculation stops paying: verify costs "
            f"{'no more than' if cost.per_token_seconds <= 0 else 'little more than'} a plain "
            f"step at mean batch {cost.batch:.1f} ({_ms(v)} against {_ms(plain_step_seconds)}, "
            f"{clock} clock), so the forward is bound by weights or launches, not tokens",
            {**evidence, "threshold_batch": None},
        )
    lo, hi = 1.0, top  # gain(lo) >= 1 > gain(hi); gain falls with the batch
    while hi - lo > 0.01 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) >= 1.0 else (lo, mid)
    where = ("extrapolated beyond" if lo > cost.batch else "interpolated below")
    return Finding(
        "SPEC-ADVICE-BATCH", "info",
        f"speculation stops paying above batch {lo:.0f} by the cost model ({where} the mean "
        f"batch {cost.batch:.1f} measured: verify {_ms(v)} against a plain step of "
        f"{_ms(plain_step_seconds)}, {cost.per_token_seconds * 1e6:.1f} µs per token, "
        f"{tokens:.2f} tokens per sequence-cycle)",
        {**evidence, "threshold_batch": lo},
        f"disable speculation above batch {lo:.0f} (vLLM: disable_by_batch_size) and check it "
        "by measuring both sides of it",
    )
