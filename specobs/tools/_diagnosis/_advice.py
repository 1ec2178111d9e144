"""The advisor: the speculation length k the measured acceptance and costs favour, the
forward's cost in tokens, and the batch size above which speculation stops paying."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specobs.tools._breakdown import Breakdown
from specobs.tools._diagnosis._findings import Finding, Window, _clock, _mean, _x
from specobs.tools._diagnosis._window import conditional_acceptance

__all__ = [
    "ADVICE_MAX_K", "ADVICE_MIN_GAIN", "BATCH_CONFIDENT_FACTOR", "BATCH_EXTRAPOLATION_MAX",
    "BATCH_FIT_POINTS", "BATCH_SAME_FACTOR", "BATCH_SEARCH_MAX_FACTOR", "DRAFT_FIXED_STEPS",
    "TREND_MIN_RATES", "BatchPoint", "FirstPosition", "ForwardCost", "advise_k", "batch_point",
    "batch_threshold", "draft_fixed", "expected_tokens", "extended_rates", "forward_cost",
    "line_threshold", "verify_scaling",
]

#: The advisor considers k from 1 to this, and names another k only for a predicted gain of at
#: least ADVICE_MIN_GAIN.
ADVICE_MAX_K = 8
ADVICE_MIN_GAIN = 0.03
#: The draft's part that does not grow with k, in draft steps, where the host's draft time does
#: not give it (:func:`draft_fixed`): the draft phase of k is taken to cost k + DRAFT_FIXED_STEPS
#: steps (docs/diagnosis.md: on the demo's CPU runs a line through the draft gives 0.37-0.58).
DRAFT_FIXED_STEPS = 0.5


# -- the advisor ----------------------------------------------------------------------------------


#: Beyond the measured positions the in-cycle rates' trend is taken from at least this many of
#: them (k >= 4); from fewer, their level alone.
TREND_MIN_RATES = 3


def _k_zero_above(batch: float) -> str:
    """How each engine turns speculation off above a batch size: a k = 0 band of its
    batch-size schedule (vLLM 0.33+ ``num_speculative_tokens_per_batch_size``, SGLang's
    ``--speculative-adaptive-config`` tiers, TensorRT-LLM's ``draft_len_schedule``)."""
    n = max(round(batch), 1)
    return (f"vLLM: a k = 0 band in num_speculative_tokens_per_batch_size, "
            f"[[1, {n}, k], [{n + 1}, max_num_seqs, 0]]; SGLang: candidate_steps [0] from batch "
            f"{n + 1} in --speculative-adaptive-config; TensorRT-LLM: draft_len_schedule "
            f"{{{n + 1}: 0}}")

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
    if len(inner) >= TREND_MIN_RATES:
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


def draft_fixed(b: Breakdown, clock: str, draft: float, k: int) -> tuple[float, str]:
    """The part of the draft phase's mean ``draft`` (on ``clock``, drafting ``k``) that does not
    grow with k, and what it was read from. On the GPU clock: the host's time in the draft phase,
    where that is shorter. An engine that waits for its tokens at the end of each cycle leaves
    the GPU idle while the host prepares the next draft, and the GPU-clock draft phase begins
    with that wait; then its kernels, one step a position (docs/diagnosis.md: on the demo the
    GPU draft less the host's is 0.165-0.168 ms a position at every k from 1 to 8, in each of
    four runs whose host draft ranged 0.08 to 0.18 ms). Otherwise
    :data:`DRAFT_FIXED_STEPS` steps of k + DRAFT_FIXED_STEPS."""
    if clock == "gpu":
        host = _mean(b, "draft", "host")
        if host is not None and 0 <= host < draft:
            return host, "host"
    return draft * DRAFT_FIXED_STEPS / (k + DRAFT_FIXED_STEPS), "steps"


def advise_k(b: Breakdown, verify_scaling: float = 0.0) -> Finding | None:
    """The k that maximizes tokens/s per sequence under a stated cost model, from the measured
    conditional acceptance and phase costs (GPU clock first); ``None`` without the data.

    Cost model: a cycle drafting k' costs t_bookkeeping + t_verify * (1 + s * (k' - k) / (k + 1))
    + f + (t_draft - f) * k' / k, where k is the length measured, t_* the measured means, f the
    draft's part that does not grow with k (:func:`draft_fixed`: on the GPU clock the host's
    draft time the GPU waits through; else c / (k + c) of it, c = :data:`DRAFT_FIXED_STEPS`) and
    s =
    ``verify_scaling`` the part of verify that grows with the positions verified (0: verify
    costs the same for any k', true where verify is memory- or launch-bound, as on a GPU at small
    batch; 1: proportional to the k' + 1 positions). Tokens per cycle are
    :func:`expected_tokens` with the measured conditional rates a_1 .. held fixed (beyond the
    measured k their trend, :func:`extended_rates`) and a_0 moved with k by
    :class:`FirstPosition` (held at its measured value where that cannot be fitted). A
    recommendation away from the measured k is a direction to try, not a promise
    (docs/diagnosis.md has the model's measured errors)."""
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
    fixed, fixed_from = draft_fixed(b, clock, d, k)
    per_position = (d - fixed) / k
    first = FirstPosition.fit(cond, k)

    def rate(kk: int) -> float:
        cost = rest + v * (1 + verify_scaling * (kk - k) / (k + 1)) + fixed + per_position * kk
        rates = cond if first is None or kk == k else [first.at(kk), *cond[1:]]
        return expected_tokens(rates, kk) / cost

    current = rate(k)
    best = max(range(1, ADVICE_MAX_K + 1), key=rate)
    gain = rate(best) / current - 1
    evidence: dict[str, float | str | None] = {
        "clock": clock, "k": float(k), "best_k": float(best), "predicted_gain": gain,
        "verify_scaling": verify_scaling,
        "draft_fixed_seconds": fixed, "draft_per_position_seconds": per_position,
        "draft_fixed_from": fixed_from,
        "first_position_after_full": None if first is None else first.after_full,
        "first_position_after_rejection": None if first is None else first.after_rejection,
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
        f"try k={best} and compare; the model holds the later positions' conditional "
        "acceptance as measured (beyond them, their trend, never rising), moves the first "
        "position's with the share of cycles accepted whole, and grows the draft by "
        f"{per_position * 1e3:.3f} ms a position over {fixed * 1e3:.3f} ms that does not grow",
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


#: Windows whose mean batches are within this factor of each other are one batch size observed.
BATCH_SAME_FACTOR = 1.25
#: The top batch sizes observed whose costs' log-log slopes extrapolate beyond them.
BATCH_FIT_POINTS = 3
#: A threshold extrapolated beyond the largest batch observed is named only up to this factor
#: of it, with confidence "medium" up to BATCH_CONFIDENT_FACTOR and "low" beyond.
BATCH_EXTRAPOLATION_MAX = 4.0
BATCH_CONFIDENT_FACTOR = 2.0


@dataclass(frozen=True)
class BatchPoint:
    """What one window says about one batch size: its mean ``batch``, the plain decode step
    there (1 / a baseline measured on that batch), the host cycle, verify (on the window's
    clock), the tokens per sequence-cycle and k, over ``cycles`` cycles."""

    batch: float
    plain_seconds: float
    cycle_seconds: float
    verify_seconds: float
    tokens: float
    k: int
    cycles: float

    @property
    def speedup(self) -> float:
        """Tokens per second per sequence against the plain step's: the realized speedup."""
        return self.tokens * self.plain_seconds / self.cycle_seconds


def batch_point(w: Window) -> BatchPoint | None:
    """The :class:`BatchPoint` of a window whose baseline the engine measured on the served
    batch (a configured one may be of any batch), with verify and the host cycle timed; else
    ``None``."""
    b = w.breakdown
    clock = _clock(b)
    host_cycle = b.cycle_mean_seconds.get("host")
    baseline = b.baseline_tokens_per_second
    k = sum(1 for _, rate in b.position_acceptance if rate is not None)
    if not w.baseline_measured or not baseline or clock is None or host_cycle is None \
            or not host_cycle > 0 or b.sequence_tokens_per_second is None or k < 1 \
            or b.mean_batch_size is None or not b.mean_batch_size > 0:
        return None
    v = _mean(b, "verify", clock)
    if v is None or not v > 0:
        return None
    # Under a GPU clock verify is the device's time and the cycle the host's: scale verify's
    # share of the GPU phases onto the host cycle, which is what the tokens/s are over.
    if clock != "host":
        phases = math.fsum(s.mean_seconds for (p, c), s in b.stats.items()
                           if c == clock and s.mean_seconds)
        v = host_cycle * v / phases if phases > 0 else v
    return BatchPoint(b.mean_batch_size, 1.0 / baseline, host_cycle, min(v, host_cycle),
                      b.sequence_tokens_per_second * host_cycle, k, b.cycles)


def line_threshold(point: BatchPoint) -> float | None:
    """The batch where a straight line through ``point``'s one batch crosses 1 (the fit this
    module made before it fitted over several batches; evidence ``line_threshold_batch``):
    forward(n) = f + p n through the plain step (n = B) and verify (n = B (k + 1)), the rest of
    the cycle scaling with verify. ``None`` where the line stays above 1 (p = 0, or up to
    :data:`BATCH_SEARCH_MAX_FACTOR` times the batch), 1.0 where it is below 1 at batch 1. A
    forward's cost per token changes with the batch, so this errs, low on the CPU demo (12 from
    batch 1, 229 from 64, while speculation paid 1.6-2.1x at every batch 1..64)."""
    batch, k = point.batch, point.k
    per_token = max(0.0, (point.verify_seconds - point.plain_seconds) / (batch * k))
    fixed = point.verify_seconds - per_token * batch * (k + 1)
    scale = point.cycle_seconds / point.verify_seconds

    def gain(bb: float) -> float:
        return point.tokens * (fixed + per_token * bb) / (
            (fixed + per_token * bb * (k + 1)) * scale)

    if gain(1.0) < 1.0:
        return 1.0
    top = batch * BATCH_SEARCH_MAX_FACTOR
    if per_token <= 0 or gain(top) >= 1.0:
        return None
    return _crossing(gain, 1.0, top)


def _crossing(gain: Callable[[float], float], lo: float, hi: float) -> float:
    """Where the falling ``gain`` crosses 1 between ``lo`` (>= 1) and ``hi`` (< 1), to 1%."""
    while hi - lo > 0.01 * lo:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gain(mid) >= 1.0 else (lo, mid)
    return lo


def _distinct(points: Sequence[BatchPoint]) -> list[BatchPoint]:
    """One point per batch size observed: points whose mean batches are within
    :data:`BATCH_SAME_FACTOR` of each other merged (costs weighted by cycles, batch
    geometric), sorted by batch."""
    groups: list[list[BatchPoint]] = []
    for p in sorted(points, key=lambda p: p.batch):
        if groups and p.batch <= groups[-1][0].batch * BATCH_SAME_FACTOR:
            groups[-1].append(p)
        else:
            groups.append([p])
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(g[0])
            continue
        w = math.fsum(p.cycles for p in g) or float(len(g))

        def avg(attr: str, g: list[BatchPoint] = g, w: float = w) -> float:
            return math.fsum(getattr(p, attr) * (p.cycles or 1.0) for p in g) / w

        out.append(BatchPoint(
            batch=math.exp(math.fsum(math.log(p.batch) for p in g) / len(g)),
            plain_seconds=avg("plain_seconds"), cycle_seconds=avg("cycle_seconds"),
            verify_seconds=avg("verify_seconds"), tokens=avg("tokens"), k=g[0].k,
            cycles=math.fsum(p.cycles for p in g)))
    return out


def _elasticity(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of log y on log x, clipped to [0, 1]: how a cost grows with the
    batch (0: not at all, 1: in proportion)."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = math.fsum(lx) / len(lx), math.fsum(ly) / len(ly)
    den = math.fsum((x - mx) ** 2 for x in lx)
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den
    return min(1.0, max(0.0, slope))


def batch_threshold(points: Sequence[BatchPoint]) -> Finding | None:
    """The batch size above which speculation stops paying (where a schedule of k by batch
    size should reach k = 0: :func:`_k_zero_above`), from windows of one server at the batch
    sizes it served
    (:func:`batch_point` of each); ``None`` without a point.

    Each point's speedup is measured: its tokens per sequence-cycle E times the plain step over
    the cycle (the realized speedup against a baseline measured on that batch). Between two
    batch sizes observed, the threshold is read off where the measured speedups cross 1
    (interpolated in log batch). Beyond the largest observed, it is extrapolated: the plain
    step, verify and the rest of the cycle each grow with the batch as a power law, its
    exponent the log-log slope of that cost over the top :data:`BATCH_FIT_POINTS` batch sizes
    observed (clipped to [0, 1]), E held at the largest batch's. The finding names an
    extrapolated threshold only up to :data:`BATCH_EXTRAPOLATION_MAX` times the largest batch
    observed, with the batches it was fitted on and a confidence; one batch size observed names
    none (where a cost bends cannot be read from one batch)."""
    if not points:
        return None
    obs = _distinct(points)
    lo_b, hi_b = obs[0].batch, obs[-1].batch
    speedups = [p.speedup for p in obs]
    span = f"batch {lo_b:.1f}" if len(obs) == 1 else f"batches {lo_b:.1f}..{hi_b:.1f}"
    seen = ", ".join(f"{_x(s)} at {p.batch:.1f}" for p, s in zip(obs, speedups, strict=True))
    evidence: dict[str, float | str | None] = {
        "k": float(obs[0].k), "batches_observed": float(len(obs)), "min_batch": lo_b,
        "max_batch": hi_b, "min_speedup": min(speedups), "max_speedup": max(speedups),
        "line_threshold_batch": line_threshold(obs[-1]), "extrapolation_factor": None,
        "confidence": None, "extrapolated_batch": None,
        **{f"speedup_batch{p.batch:.1f}": s for p, s in zip(obs, speedups, strict=True)},
    }
    # Where the measured speedups cross 1: the last batch that still pays, and the next.
    paying = [i for i, s in enumerate(speedups) if s >= 1.0]
    if not paying:
        where = (" at any batch size" if lo_b <= 1.5
                 else f"; below batch {lo_b:.1f} it was not measured")
        return Finding(
            "SPEC-ADVICE-BATCH", "info",
            f"speculation did not pay at any batch size observed ({seen}){where}",
            {**evidence, "threshold_batch": 1.0 if lo_b <= 1.5 else None,
             "confidence": "measured"},
            "see the speedup and acceptance findings",
        )
    last = paying[-1]
    if last < len(obs) - 1:
        a, b = obs[last], obs[last + 1]
        sa, sb = speedups[last], speedups[last + 1]
        # log speedup linear in log batch between the two batch sizes
        t = math.log(sa) / (math.log(sa) - math.log(sb)) if sa > sb else 0.0
        cross = math.exp(math.log(a.batch) + t * (math.log(b.batch) - math.log(a.batch)))
        return Finding(
            "SPEC-ADVICE-BATCH", "info",
            f"speculation stops paying between batch {a.batch:.1f} ({_x(sa)}) and "
            f"{b.batch:.1f} ({_x(sb)}), about {cross:.0f} (measured at {span}: {seen})",
            {**evidence, "threshold_batch": cross, "confidence": "measured"},
            f"disable speculation above batch {cross:.0f} ({_k_zero_above(cross)})",
        )
    # A batch below the largest that did not pay (noise, or a warming draft) is in ``seen``.
    pays = ("every batch size observed" if len(paying) == len(obs)
            else "the largest batch size observed")
    if len(obs) == 1:
        line = evidence["line_threshold_batch"]
        guess = "" if line is None else (
            f"; a straight line through its plain step and verify would say {line:.0f}, a "
            "guess that erred low on the CPU demo (12 from batch 1, which paid 1.6x at 64)")
        return Finding(
            "SPEC-ADVICE-BATCH", "ok",
            f"speculation pays at the one batch size observed ({seen}); where it stops paying "
            f"cannot be told from one batch size{guess}",
            {**evidence, "threshold_batch": None},
            "to find it, serve (or run advisor_k.py --batches) at several batch sizes and "
            "diagnose their windows together",
        )
    top = obs[-BATCH_FIT_POINTS:]
    xs = [p.batch for p in top]
    e_plain = _elasticity(xs, [p.plain_seconds for p in top])
    e_verify = _elasticity(xs, [p.verify_seconds for p in top])
    e_rest = _elasticity(xs, [max(p.cycle_seconds - p.verify_seconds, 1e-12) for p in top])
    last_p = obs[-1]
    rest = max(last_p.cycle_seconds - last_p.verify_seconds, 0.0)

    def gain(bb: float) -> float:
        r = bb / last_p.batch
        cycle = last_p.verify_seconds * math.pow(r, e_verify) + rest * math.pow(r, e_rest)
        return last_p.tokens * last_p.plain_seconds * math.pow(r, e_plain) / cycle

    evidence.update({"plain_exponent": e_plain, "verify_exponent": e_verify,
                     "rest_exponent": e_rest, "fitted_on": f"{xs[0]:.1f}..{xs[-1]:.1f}"})
    far = hi_b * BATCH_SEARCH_MAX_FACTOR
    at: float | None = None if gain(far) >= 1.0 else _crossing(gain, hi_b, far)
    factor = None if at is None else at / hi_b
    evidence.update({"extrapolated_batch": at, "extrapolation_factor": factor})
    if at is None or factor is None or factor > BATCH_EXTRAPOLATION_MAX:
        trend = (f"the costs' trend stays above 1 up to {far:.0f}" if at is None else
                 f"the costs' trend reaches 1 only at about {at:.0f}, {factor:.0f}x the "
                 f"largest batch observed, too far to name")
        return Finding(
            "SPEC-ADVICE-BATCH", "ok",
            f"speculation pays at {pays} ({seen}); extrapolated from "
            f"batches {xs[0]:.1f}..{xs[-1]:.1f}, {trend}",
            {**evidence, "threshold_batch": None},
        )
    confidence = "medium" if factor <= BATCH_CONFIDENT_FACTOR else "low"
    return Finding(
        "SPEC-ADVICE-BATCH", "info",
        f"speculation pays at {pays} ({seen}); extrapolated from batches "
        f"{xs[0]:.1f}..{xs[-1]:.1f}, it stops paying above about {at:.0f} ({factor:.1f}x the "
        f"largest batch observed, confidence {confidence})",
        {**evidence, "threshold_batch": at, "confidence": confidence},
        f"disable speculation above batch {at:.0f} ({_k_zero_above(at)}) once a window at "
        "that batch confirms it",
    )
