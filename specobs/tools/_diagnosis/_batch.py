"""The batch size above which speculation stops paying (``SPEC-ADVICE-BATCH``), from windows of
one server at the batch sizes it served."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._findings import Evidence, Finding, Window, _clock, _mean
from specobs.tools._diagnosis._words import found

__all__ = ["BatchPoint", "batch_point", "batch_threshold", "line_threshold"]


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
    top = batch * th.BATCH_SEARCH_MAX_FACTOR
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
        if groups and p.batch <= groups[-1][0].batch * th.BATCH_SAME_FACTOR:
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
    size should reach k = 0), from windows of one server at the batch sizes it served
    (:func:`batch_point` of each); ``None`` without a point.

    Each point's speedup is measured: its tokens per sequence-cycle E times the plain step over
    the cycle (the realized speedup against a baseline measured on that batch). Between two
    batch sizes observed, the threshold is read off where the measured speedups cross 1
    (interpolated in log batch). Beyond the largest observed, it is extrapolated
    (:func:`_extrapolated`). One batch size observed names none (where a cost bends cannot be
    read from one batch)."""
    if not points:
        return None
    obs = _distinct(points)
    lo_b, hi_b = obs[0].batch, obs[-1].batch
    speedups = [p.speedup for p in obs]
    evidence: Evidence = {
        "k": float(obs[0].k), "batches_observed": float(len(obs)), "min_batch": lo_b,
        "max_batch": hi_b, "min_speedup": min(speedups), "max_speedup": max(speedups),
        "line_threshold_batch": line_threshold(obs[-1]), "extrapolation_factor": None,
        "confidence": None, "extrapolated_batch": None,
        **{f"speedup_batch{p.batch:.1f}": s for p, s in zip(obs, speedups, strict=True)},
    }
    # Where the measured speedups cross 1: the last batch that still pays, and the next.
    paying = [i for i, s in enumerate(speedups) if s >= 1.0]
    if not paying:
        return found("SPEC-ADVICE-BATCH", "info",
                     {**evidence, "threshold_batch": 1.0 if lo_b <= 1.5 else None,
                      "confidence": "measured"}, "none-pays")
    last = paying[-1]
    if last < len(obs) - 1:
        return _between(obs[last], obs[last + 1], evidence)
    # A batch below the largest that did not pay (noise, or a warming draft) is in ``seen``.
    if len(obs) == 1:
        return found("SPEC-ADVICE-BATCH", "ok", {**evidence, "threshold_batch": None}, "one")
    return _extrapolated(obs, evidence, every_batch_pays=len(paying) == len(obs))


def _between(a: BatchPoint, b: BatchPoint, evidence: Evidence) -> Finding:
    """The threshold between two batch sizes observed, ``a`` paying and ``b`` not: log speedup
    linear in log batch between them."""
    sa, sb = a.speedup, b.speedup
    t = math.log(sa) / (math.log(sa) - math.log(sb)) if sa > sb else 0.0
    cross = math.exp(math.log(a.batch) + t * (math.log(b.batch) - math.log(a.batch)))
    return found("SPEC-ADVICE-BATCH", "info",
                 {**evidence, "threshold_batch": cross, "confidence": "measured"}, "between",
                 paying_batch=a.batch, paying_speedup=sa, losing_batch=b.batch,
                 losing_speedup=sb)


def _extrapolated(obs: Sequence[BatchPoint], evidence: Evidence,
                  every_batch_pays: bool) -> Finding:
    """Beyond the largest batch observed: the plain step, verify and the rest of the cycle each
    grow with the batch as a power law, its exponent the log-log slope of that cost over the top
    ``BATCH_FIT_POINTS`` batch sizes observed (clipped to [0, 1]), E held at the largest
    batch's. A threshold is named only up to ``BATCH_EXTRAPOLATION_MAX`` times the largest
    batch observed, with the batches it was fitted on and a confidence."""
    top = obs[-int(th.BATCH_FIT_POINTS):]
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

    evidence = {**evidence, "plain_exponent": e_plain, "verify_exponent": e_verify,
                "rest_exponent": e_rest, "fitted_on": f"{xs[0]:.1f}..{xs[-1]:.1f}"}
    hi_b = last_p.batch
    far = hi_b * th.BATCH_SEARCH_MAX_FACTOR
    at: float | None = None if gain(far) >= 1.0 else _crossing(gain, hi_b, far)
    factor = None if at is None else at / hi_b
    evidence.update({"extrapolated_batch": at, "extrapolation_factor": factor})
    words: dict[str, Any] = {"every_batch_pays": every_batch_pays, "searched_batch": far}
    if at is None or factor is None:
        return found("SPEC-ADVICE-BATCH", "ok", {**evidence, "threshold_batch": None}, "stays",
                     **words)
    if factor > th.BATCH_EXTRAPOLATION_MAX:
        return found("SPEC-ADVICE-BATCH", "ok", {**evidence, "threshold_batch": None},
                     "too-far", **words)
    confidence = "medium" if factor <= th.BATCH_CONFIDENT_FACTOR else "low"
    return found("SPEC-ADVICE-BATCH", "info",
                 {**evidence, "threshold_batch": at, "confidence": confidence}, "extrapolated",
                 **words)
