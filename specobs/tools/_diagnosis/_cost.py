"""The cycle's cost model: what the target's forward costs as a function of the tokens it
computes, fitted from what a server already shows, and what a cycle drafting k costs in host
seconds. The advisor (:mod:`._advice`), the speedup finding and the k schedule all predict from
this one model, so that a prediction at the measured k can be checked against what was realized.

A forward over n tokens costs ``fixed + per_token * n`` (:class:`ForwardModel`). The points it is
fitted on (:func:`cost_points`):

* a plain decode step of batch B computes n = B tokens: the forward of the engine's own plain
  steps (draft length 0), else a baseline the engine measured on the served batch less the
  cycle's bookkeeping, which a plain step pays too;
* a verify of batch B drafting k computes n = B (k + 1): one point per draft length in effect
  (an engine that changes k at run time gives several), else the window's verify.

Every time is in host seconds of the cycle (:class:`CycleCosts`): on the GPU clock a phase's
share of the GPU phases is laid onto the host cycle, which is what tokens/s are measured over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specobs.tools._breakdown import Breakdown
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._findings import _clock, _mean
from specobs.tools._diagnosis._words import ms as _ms

__all__ = [
    "CostPoint", "CycleCosts", "ForwardModel", "Prediction", "cost_points", "cycle_costs",
    "draft_fixed", "fit_forward",
]


@dataclass(frozen=True)
class CostPoint:
    """One measured forward: ``tokens`` computed in ``seconds`` (host seconds of the cycle), by
    ``cycles`` cycles of batch ``batch`` drafting ``k`` (0: a plain step), read from ``source``."""

    tokens: float
    seconds: float
    batch: float
    k: int
    cycles: float
    source: str


@dataclass(frozen=True)
class ForwardModel:
    """A forward over n tokens costs ``fixed_seconds + per_token_seconds * n``. ``points`` are
    what it was fitted on; ``distinct`` how many token counts apart they are (1: the slope could
    not be read, and ``per_token_seconds`` is 0: the advisor then moves k one step at a time);
    ``residual`` the points' weighted relative RMS distance from the line."""

    fixed_seconds: float
    per_token_seconds: float
    points: tuple[CostPoint, ...]
    distinct: int
    residual: float

    def at(self, tokens: float) -> float:
        """Seconds of a forward over ``tokens``."""
        return self.fixed_seconds + self.per_token_seconds * tokens

    @property
    def sure(self) -> bool:
        """Fitted through at least two token counts, so its slope was measured."""
        return self.distinct >= 2

    def evidence(self) -> dict[str, float | str | None]:
        """The fitted parameters and the points used, for a finding's evidence."""
        return {
            "forward_fixed_seconds": self.fixed_seconds,
            "forward_per_token_seconds": self.per_token_seconds,
            "forward_points": float(len(self.points)),
            "forward_distinct_token_counts": float(self.distinct),
            "forward_residual": self.residual,
            "forward_fitted_on": "; ".join(
                f"{p.source} n={p.tokens:.1f} {p.seconds * 1e3:.3f} ms" for p in self.points),
        }


def _groups(points: Sequence[CostPoint]) -> int:
    tokens = sorted(p.tokens for p in points)
    groups, start = 0, None
    for n in tokens:
        if start is None or n > start * th.SAME_TOKENS:
            groups, start = groups + 1, n
    return groups


def fit_forward(points: Sequence[CostPoint]) -> ForwardModel | None:
    """The least-squares line through ``points``, each weighted by the square root of its
    cycles (a point of many cycles counts more, without one point drowning the rest); the
    slope is held at 0 or above (a forward over more tokens never costs less). ``None`` without
    a point."""
    pts = [p for p in points if p.tokens > 0 and p.seconds > 0 and p.cycles > 0]
    if not pts:
        return None
    ws = [math.sqrt(p.cycles) for p in pts]
    total = math.fsum(ws)
    mx = math.fsum(w * p.tokens for w, p in zip(ws, pts, strict=True)) / total
    my = math.fsum(w * p.seconds for w, p in zip(ws, pts, strict=True)) / total
    distinct = _groups(pts)
    slope = 0.0
    if distinct >= 2:
        sxx = math.fsum(w * (p.tokens - mx) ** 2 for w, p in zip(ws, pts, strict=True))
        sxy = math.fsum(w * (p.tokens - mx) * (p.seconds - my)
                        for w, p in zip(ws, pts, strict=True))
        slope = max(0.0, sxy / sxx) if sxx > 0 else 0.0
    fixed = my - slope * mx
    if fixed < 0:
        # A line through the origin, then: no forward costs less than nothing at zero tokens.
        fixed = 0.0
        slope = math.fsum(w * p.tokens * p.seconds for w, p in zip(ws, pts, strict=True)) / \
            math.fsum(w * p.tokens ** 2 for w, p in zip(ws, pts, strict=True))
    sq = math.fsum(w * ((fixed + slope * p.tokens) / p.seconds - 1) ** 2
                   for w, p in zip(ws, pts, strict=True))
    return ForwardModel(fixed, slope, tuple(pts), distinct, math.sqrt(sq / total))


def draft_fixed(b: Breakdown, clock: str, draft: float, k: int) -> tuple[float, str]:
    """The part of the draft phase's mean ``draft`` (on ``clock``, drafting ``k``) that does not
    grow with k, and what it was read from. On the GPU clock: the host's time in the draft phase,
    where that is shorter. An engine that waits for its tokens at the end of each cycle leaves
    the GPU idle while the host prepares the next draft, and the GPU-clock draft phase begins
    with that wait; then its kernels, one step a position (docs/diagnosis.md). Otherwise
    :data:`DRAFT_FIXED_STEPS` steps of k + DRAFT_FIXED_STEPS."""
    if clock == "gpu":
        host = _mean(b, "draft", "host")
        if host is not None and 0 <= host < draft:
            return host, "host"
    return draft * th.DRAFT_FIXED_STEPS / (k + th.DRAFT_FIXED_STEPS), "steps"


@dataclass(frozen=True)
class CycleCosts:
    """One window's cycle in host seconds: its mean ``batch`` and draft length ``k`` (positions
    measured), the ``draft`` phase (``draft_fixed`` of it does not grow with k, the rest grows by
    ``draft_per_position`` a position), ``verify``, and ``rest`` (every other second of the host
    cycle: bookkeeping, sampling, the engine's host work inside the cycle). ``scale``: host
    seconds per second of ``clock`` (1 on the host clock)."""

    clock: str
    batch: float
    k: int
    cycle: float
    draft: float
    draft_fixed: float
    draft_fixed_from: str
    draft_per_position: float
    verify: float
    rest: float
    scale: float

    def at(self, k: int, model: ForwardModel | None) -> float:
        """Host seconds of a cycle drafting ``k`` at this batch: verify moved along ``model``
        (held where there is none), the draft by its cost a position."""
        verify = self.verify
        if model is not None:
            verify += model.per_token_seconds * self.batch * (k - self.k)
        return self.rest + max(verify, 0.0) + self.draft_fixed + self.draft_per_position * k


def measured_k(b: Breakdown) -> int:
    """Draft positions measured in ``b`` (the k drafted, or the longest where k varies)."""
    return sum(1 for _, rate in b.position_acceptance if rate is not None)


def cycle_costs(b: Breakdown) -> CycleCosts | None:
    """The :class:`CycleCosts` of ``b``; ``None`` without a host cycle, a clock with enough
    cycles, a draft and a verify phase."""
    clock = _clock(b)
    host_cycle = b.cycle_mean_seconds.get("host")
    batch = b.mean_batch_size
    k = measured_k(b)
    if clock is None or host_cycle is None or not host_cycle > 0 or k < 1 or batch is None \
            or not batch > 0:
        return None
    d, v = _mean(b, "draft", clock), _mean(b, "verify", clock)
    if d is None or v is None or not v > 0 or d < 0:
        return None
    scale = 1.0
    if clock != "host":
        phases = math.fsum(s.mean_seconds for (_, c), s in b.stats.items()
                           if c == clock and s.mean_seconds)
        if phases > 0:
            scale = host_cycle / phases
    fixed, fixed_from = draft_fixed(b, clock, d, k)
    dh, vh, fh = d * scale, v * scale, fixed * scale
    return CycleCosts(
        clock=clock, batch=batch, k=k, cycle=host_cycle, draft=dh, draft_fixed=fh,
        draft_fixed_from=fixed_from, draft_per_position=max(0.0, dh - fh) / k, verify=vh,
        rest=max(0.0, host_cycle - dh - vh), scale=scale,
    )


def cost_points(b: Breakdown, baseline_measured: bool, costs: CycleCosts | None = None,
                ) -> list[CostPoint]:
    """The forward's measured points in ``b`` (see the module docstring). Per draft length in
    effect (an engine that changes k): its verify phase on the host clock, laid onto the
    window's clock by the ratio of the two clocks' verify means; its plain steps (k = 0), the
    whole step. Without per-k series: the window's verify, and a baseline the engine measured
    (1 / tokens/s per sequence: one plain step of the served batch)."""
    costs = costs if costs is not None else cycle_costs(b)
    out: list[CostPoint] = []
    host_verify = _mean(b, "verify", "host")
    to_window = 1.0
    if costs is not None and host_verify is not None and host_verify > 0:
        to_window = costs.verify / host_verify
    plain_seen = False
    for ks in b.by_draft_length:
        batch = ks.mean_batch
        if ks.cycles < th.MIN_POINT_CYCLES or batch is None or not batch > 0:
            continue
        if ks.k == 0:
            whole = math.fsum(ks.phase_seconds.values()) / ks.cycles
            step = ks.phase_mean_seconds("verify") or whole
            if step > 0:
                out.append(CostPoint(batch, step, batch, 0, ks.cycles, "plain steps"))
                plain_seen = True
            continue
        verify = ks.phase_mean_seconds("verify")
        if verify is not None and verify > 0:
            out.append(CostPoint(batch * (ks.k + 1), verify * to_window, batch, ks.k, ks.cycles,
                                 f"verify k={ks.k}"))
    if costs is not None and not any(p.k > 0 for p in out):
        out.append(CostPoint(costs.batch * (costs.k + 1), costs.verify, costs.batch, costs.k,
                             b.cycles, f"verify k={costs.k}"))
    base = b.baseline_tokens_per_second
    if baseline_measured and not plain_seen and base and base > 0 and costs is not None:
        # A plain step pays the cycle's bookkeeping too (sampling, handing tokens over): its
        # forward is what is left, never less than half the step.
        step = 1.0 / base
        out.append(CostPoint(costs.batch, max(step - costs.rest, step / 2), costs.batch, 0,
                             b.cycles, "measured baseline"))
    return out


# -- the speedup predicted, against the realized one ---------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """The speedup the cost model predicts for a window, and its parts: tokens per
    sequence-cycle (predicted from acceptance, and measured), the plain step (from the model,
    and from the baseline gauge) and the cycle (from the model, and measured), host seconds."""

    predicted: float
    tokens_model: float
    tokens_measured: float | None
    plain_model: float
    plain_baseline: float | None
    cycle_model: float
    cycle_measured: float

    def evidence(self) -> dict[str, float | str | None]:
        return {
            "predicted_tokens_per_cycle": self.tokens_model,
            "measured_tokens_per_cycle": self.tokens_measured,
            "model_plain_step_seconds": self.plain_model,
            "baseline_plain_step_seconds": self.plain_baseline,
            "model_cycle_seconds": self.cycle_model,
            "measured_cycle_seconds": self.cycle_measured,
        }

    def where(self, realized: float) -> str | None:
        """Where the prediction and ``realized`` part, the largest of three ratios: tokens,
        plain step, cycle; ``None`` within :data:`CALIBRATION_TOLERANCE`."""
        if abs(self.predicted / realized - 1) <= th.CALIBRATION_TOLERANCE:
            return None
        parts: list[tuple[float, str]] = []
        if self.tokens_measured:
            r = self.tokens_model / self.tokens_measured
            parts.append((abs(math.log(r)),
                          f"acceptance predicts {self.tokens_model:.2f} tokens a sequence-cycle "
                          f"and {self.tokens_measured:.2f} came (requests that end inside a "
                          "draft, or drafts the engine cut short)"))
        if self.plain_baseline:
            r = self.plain_model / self.plain_baseline
            parts.append((abs(math.log(r)),
                          f"the baseline gauge gives a plain step of "
                          f"{_ms(self.plain_baseline)} and the fitted forward "
                          f"{_ms(self.plain_model)} (a baseline configured or measured at "
                          "another batch, or long ago)"))
        r = self.cycle_model / self.cycle_measured
        parts.append((abs(math.log(r)),
                      f"the model's cycle is {_ms(self.cycle_model)} and the measured "
                      f"{_ms(self.cycle_measured)} (verify off the fitted forward: a phase "
                      "that grew, or a batch the fit did not see)"))
        return max(parts)[1]
