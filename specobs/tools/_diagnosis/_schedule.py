"""A k for each band of batch sizes (``SPEC-ADVICE-SCHEDULE``): the best k at each batch size
observed, under the cost model, as contiguous bands from batch 1 up."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specobs.tools._breakdown import Breakdown
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._advice import Prospects, candidates, prospects
from specobs.tools._diagnosis._cost import CycleCosts, ForwardModel
from specobs.tools._diagnosis._engine_config import Band
from specobs.tools._diagnosis._findings import Evidence, Finding, Window
from specobs.tools._diagnosis._words import found

__all__ = [
    "BandChoice", "bands_from", "by_draft_length", "choose_at", "schedule", "schedule_finding",
]


@dataclass(frozen=True)
class BandChoice:
    """The k chosen at one observed batch size, and the predicted tokens/s per sequence at each
    k considered there (k = 0: the plain step)."""

    batch: float
    k: int
    rates: dict[int, float]
    cycles: float


def choose_at(pr: Prospects) -> BandChoice | None:
    """The best k at ``pr``'s batch among 0 .. :data:`ADVICE_MAX_K` (or one step either side of
    the measured k where the forward's slope is unknown, and then 0 only where a plain step is
    known); ``None`` without any k to weigh."""
    plain = pr.plain()
    ks = candidates(pr.costs.k, pr.model)
    rates = {kk: pr.rate(kk) for kk in ks}
    if plain is not None:
        rates[0] = 1.0 / plain
    if not rates:
        return None
    best = max(rates, key=lambda kk: rates[kk])
    return BandChoice(pr.costs.batch, best, rates, 0.0)


def bands_from(choices: Sequence[BandChoice], threshold: float | None = None) -> list[Band]:
    """Contiguous bands from 1 up: each observed batch size's k over the batch sizes nearer to it
    than to the next (boundaries at the geometric midpoints), the last k carried beyond the
    largest observed batch (``measured`` False) up to ``threshold`` (the extrapolated batch where
    speculation stops paying) and k = 0 beyond it; adjacent bands of one k merged."""
    obs = sorted(choices, key=lambda c: c.batch)
    if not obs:
        return []
    raw: list[Band] = []
    lo = 1
    for i, c in enumerate(obs):
        if i + 1 < len(obs):
            hi = max(lo, math.floor(math.sqrt(c.batch * obs[i + 1].batch)))
        else:
            hi = max(lo, math.floor(c.batch))
        raw.append(Band(lo, hi, c.k, True))
        lo = hi + 1
    last = obs[-1].k
    if threshold is not None and last > 0 and threshold >= lo:
        raw.append(Band(lo, max(lo, math.floor(threshold)), last, False))
        lo = max(lo, math.floor(threshold)) + 1
        raw.append(Band(lo, None, 0, False))
    else:
        raw.append(Band(lo, None, last, False))
    merged: list[Band] = []
    for band in raw:
        if merged and merged[-1].k == band.k:
            prev = merged[-1]
            merged[-1] = Band(prev.lo, band.hi, band.k, prev.measured or band.measured)
        else:
            merged.append(band)
    return merged


def by_draft_length(b: Breakdown, pr: Prospects) -> list[tuple[Prospects, float]]:
    """An engine that changes k by batch size serves each k at its own batch: one
    :class:`Prospects` per draft length in effect (at least :data:`MIN_POINT_CYCLES` cycles),
    its costs from the per-k host phase times at that k's mean batch, the window's acceptance
    and forward; empty where fewer than two ks drafted."""
    out: list[tuple[Prospects, float]] = []
    for ks in b.by_draft_length:
        batch = ks.mean_batch
        if ks.k < 1 or ks.cycles < th.MIN_POINT_CYCLES or batch is None or not batch > 0 \
                or ks.k > len(pr.conditional):
            continue
        means = {p: s / ks.cycles for p, s in ks.phase_seconds.items()}
        draft, verify = means.get("draft"), means.get("verify")
        if draft is None or verify is None or not verify > 0:
            continue
        fixed = draft * th.DRAFT_FIXED_STEPS / (ks.k + th.DRAFT_FIXED_STEPS)
        rest = math.fsum(m for p, m in means.items() if p not in ("draft", "verify"))
        costs = CycleCosts(
            clock="host", batch=batch, k=ks.k, cycle=draft + verify + rest, draft=draft,
            draft_fixed=fixed, draft_fixed_from="steps",
            draft_per_position=max(0.0, draft - fixed) / ks.k, verify=verify, rest=rest,
            scale=1.0)
        out.append((Prospects(costs, pr.model, pr.conditional[:ks.k]), ks.cycles))
    return out if len(out) >= 2 else []


def schedule(windows: Sequence[Window], models: Sequence[ForwardModel | None],
             threshold: float | None = None) -> tuple[list[Band], list[BandChoice]]:
    """The k for each band of batch sizes, from windows of one server at the batch sizes it
    served (each window's acceptance and costs, verify along its own fitted forward in
    ``models``: a line through one batch's points bends less than one through all): the bands
    (:func:`bands_from`) and the choice at each batch size observed; an engine that changed k
    by batch size gives one observation per k it drafted (:func:`by_draft_length`). Windows within
    :data:`BATCH_SAME_FACTOR` of each other's batch are one observation (the one of most
    cycles)."""
    found: list[BandChoice] = []
    for w, model in zip(windows, models, strict=True):
        pr = prospects(w.breakdown, model)
        if pr is None:
            continue
        for each, cycles in by_draft_length(w.breakdown, pr) or [(pr, w.breakdown.cycles)]:
            c = choose_at(each)
            if c is not None:
                found.append(BandChoice(c.batch, c.k, c.rates, cycles))
    found.sort(key=lambda c: c.batch)
    kept: list[BandChoice] = []
    for c in found:
        if kept and c.batch <= kept[-1].batch * th.BATCH_SAME_FACTOR:
            if c.cycles > kept[-1].cycles:
                kept[-1] = c
            continue
        kept.append(c)
    return bands_from(kept, threshold), kept


def schedule_finding(bands: Sequence[Band], choices: Sequence[BandChoice]) -> Finding | None:
    """``SPEC-ADVICE-SCHEDULE``: the bands as one line, with the choice at each batch size
    observed in the evidence; ``None`` without a band."""
    if not bands:
        return None
    text = ", ".join(
        f"{b.lo}-{'' if b.hi is None else b.hi}: k={b.k}{'' if b.measured else ' (not measured)'}"
        for b in bands)
    evidence: Evidence = {
        "bands": text, "batches_observed": float(len(choices)),
        # specobs records no context length: whether the best k moves with it cannot be told.
        "context_length": "not recorded",
        **{f"best_k_at_batch{c.batch:.1f}": float(c.k) for c in choices},
    }
    for c in choices:
        evidence.update({f"predicted_tokens_per_second_batch{c.batch:.1f}_k{kk}": r
                         for kk, r in sorted(c.rates.items())})
    return found("SPEC-ADVICE-SCHEDULE",
                 "info" if any(b.k != bands[0].k for b in bands) else "ok", evidence,
                 observed=", ".join(f"{c.batch:.1f}" for c in choices))
