"""The distributions a simulated server's histograms are shaped by, and the histogram that
accumulates them (floored to whole observations as a real one exposes them)."""

from __future__ import annotations

import math
from typing import Any

from specobs import catalog

__all__ = ["Hist", "lognormal_fractions", "request_fractions"]


def lognormal_fractions(bounds: tuple[float, ...], mean: float, sigma: float) -> list[float]:
    """Fraction of a log-normal with this mean falling in each bucket (+Inf last)."""
    if mean <= 0:
        return [1.0] + [0.0] * len(bounds)
    mu = math.log(mean) - sigma * sigma / 2
    cdf = [0.5 * (1 + math.erf((math.log(b) - mu) / (sigma * math.sqrt(2)))) if b > 0 else 0.0
           for b in bounds]
    out, prev = [], 0.0
    for c in cdf:
        out.append(max(c - prev, 0.0))
        prev = c
    out.append(max(1.0 - prev, 0.0))
    return out


def request_fractions(rate: float) -> list[float]:
    """Per-request acceptance buckets: most requests near the server's rate, a few far below
    (the healthy spread of prompts), none above 1."""
    bounds = catalog.REQUEST_ACCEPTANCE_BUCKETS
    centre = min(range(len(bounds)), key=lambda i: abs(bounds[i] - rate))
    out = [0.0] * (len(bounds) + 1)
    out[centre] += 0.7
    out[max(centre - 1, 0)] += 0.15
    out[min(centre + 1, len(bounds) - 1)] += 0.1
    out[max(centre - 3, 0)] += 0.05
    return out


class Hist:
    """A histogram's cumulative state in floats; exposed as floored integer counts (monotone).

    The sum grows with the exposed count, not with the fractional one: each bucket floors on its
    own, so the exposed count lags the fractional count by up to one per occupied bucket, and a sum
    of the fractional count would make ``rate(_sum) / rate(_count)`` read up to a third above the
    mean over a few sampled GPU cycles (a fresh pod's first scrapes) — a real histogram's sum is
    always the sum of the observations it counted.
    """

    __slots__ = ("bounds", "counts", "exposed", "fractions", "mean", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.exposed = 0  # the sum of the floored bucket counts
        self.sum = 0.0
        self.fractions = [0.0] * (len(bounds) + 1)
        self.mean = 0.0

    def shape(self, fractions: list[float], mean: float) -> None:
        self.fractions = fractions
        self.mean = mean

    def add(self, n: float) -> None:
        if n <= 0:
            return
        counts = self.counts
        for i, f in enumerate(self.fractions):
            if f:
                counts[i] += n * f
        exposed = sum(int(c) for c in counts)
        self.sum += (exposed - self.exposed) * self.mean
        self.exposed = exposed

    def data(self) -> Any:
        from specobs import HistogramData

        counts = tuple(int(c) for c in self.counts)
        return HistogramData(self.bounds, counts, self.sum, sum(counts))
