"""A synthetic speculative engine with known truth, for testing the advisor and the diagnosis.

Its target forward over n tokens costs ``forward(n)`` (a cost model chosen per test: linear,
flat then compute-bound, curved), a draft of k at batch B costs ``draft(k, B)``, every cycle
pays ``bookkeeping``; a plain decode step of batch B costs ``forward(B) + bookkeeping``. Its
acceptance is a process of its own, not the advisor's formula: the first draft position is
accepted with chance ``after_full`` when the sequence's previous cycle was accepted whole and
``after_rejection`` otherwise, position i >= 1 with ``later[i - 1]``; each sequence-cycle is
drawn from a seeded generator.

:meth:`Synthetic.window` writes what specobs's exporter would count over a window of cycles (the
same series names, labels and histogram layout a scrape holds) as a
:class:`~specobs.tools._scrape.Delta`; :meth:`Synthetic.tokens_per_second` is the exact truth the
advice is judged against (the stationary expectation of the acceptance process over the cost).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specobs import catalog
from specobs.tools._scrape import Delta, Series

PHASES = ("draft", "verify", "bookkeeping")
BUCKETS = catalog.PHASE_DURATION.buckets or ()


def linear(fixed: float, per_token: float) -> Callable[[float], float]:
    return lambda n: fixed + per_token * n


def roofline(floor: float, per_token: float, launch: float) -> Callable[[float], float]:
    """Memory-bound (``floor``) until the tokens' compute exceeds it, then compute-bound."""
    return lambda n: launch + max(floor, per_token * n)


def curved(fixed: float, per_token: float, square: float) -> Callable[[float], float]:
    return lambda n: fixed + per_token * n + square * n * n


@dataclass
class Synthetic:
    forward: Callable[[float], float]
    #: Draft of k at batch B: ``draft_fixed + k * (draft_step + draft_per_sequence * B)``.
    draft_fixed: float = 0.2e-3
    draft_step: float = 0.25e-3
    draft_per_sequence: float = 0.0
    bookkeeping: float = 0.2e-3
    after_full: float = 0.82
    after_rejection: float = 0.7
    later: Sequence[float] = (0.85, 0.8, 0.78, 0.75, 0.72, 0.7, 0.68, 0.66, 0.64, 0.62)
    #: Host seconds between cycles (the engine's loop outside the instrumented step).
    gap: float = 0.0
    #: Scales the draft phase (a draft that became slower).
    draft_factor: float = 1.0
    seed: int = 7
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    # -- the truth --------------------------------------------------------------------------------

    def draft(self, k: int, batch: float) -> float:
        if k == 0:
            return 0.0
        return self.draft_factor * (
            self.draft_fixed + k * (self.draft_step + self.draft_per_sequence * batch))

    def phases(self, k: int, batch: float) -> dict[str, float]:
        return {"draft": self.draft(k, batch), "verify": self.forward(batch * (k + 1)),
                "bookkeeping": self.bookkeeping}

    def plain_seconds(self, batch: float) -> float:
        return self.forward(batch) + self.bookkeeping

    def expected_tokens(self, k: int) -> float:
        """Tokens a sequence gains per cycle drafting k, in the stationary state."""
        if k == 0:
            return 1.0
        chain = [1.0]
        for a in self.later[: k - 1]:
            chain.append(chain[-1] * a)
        reach_all = chain[-1]
        h, r = self.after_full, self.after_rejection
        full = r * reach_all / (1 - (h - r) * reach_all)
        first = full * h + (1 - full) * r
        return 1.0 + first * math.fsum(chain)

    def tokens_per_second(self, k: int, batch: float) -> float:
        """Tokens/s per sequence drafting k at ``batch`` (k = 0: plain steps)."""
        if k == 0:
            return 1.0 / self.plain_seconds(batch)
        return self.expected_tokens(k) / sum(self.phases(k, batch).values())

    def best_k(self, batch: float, ks: Sequence[int] = range(1, 9)) -> int:
        return max(ks, key=lambda k: self.tokens_per_second(k, batch))

    def speedup(self, k: int, batch: float) -> float:
        return self.tokens_per_second(k, batch) / self.tokens_per_second(0, batch)

    # -- what specobs would count -----------------------------------------------------------------

    def window(self, k: int, batch: int, cycles: int, *, baseline: str | None = "demo_measured",
               gpu: bool = True, elapsed: float | None = None) -> Delta:
        """The counters of ``cycles`` cycles of ``batch`` sequences drafting ``k``.
        ``baseline``: the source label of a baseline the engine measured on this batch (None:
        no baseline gauge)."""
        c, g = Series(), Series()
        g.add(catalog.INFO.name, {"phases": ",".join(PHASES),
                                  "gpu_clock": "cuda" if gpu else "none"}, 1.0)
        drafted = [0] * k
        accepted = [0] * k
        emitted = 0
        lengths = 0
        full = [False] * batch
        for _ in range(cycles):
            for s in range(batch):
                n = 0
                for i in range(k):
                    drafted[i] += 1  # every drafted token, accepted or not
                for i in range(k):
                    if i == 0:
                        p = self.after_full if full[s] else self.after_rejection
                    else:
                        p = self.later[i - 1]
                    if self._rng.random() >= p:
                        break
                    accepted[i] += 1
                    n += 1
                full[s] = n == k
                lengths += n
                emitted += n + 1
        phases = self.phases(k, batch)
        seq = cycles * batch
        for clock in ("host", "gpu") if gpu else ("host",):
            scale = 1.0 if clock == "host" else 0.97
            for p, m in phases.items():
                _histogram(c, catalog.PHASE_DURATION.name, {"phase": p, "clock": clock},
                           m * scale, cycles)
            _histogram(c, catalog.CYCLE_DURATION.name, {"clock": clock},
                       sum(phases.values()) * scale, cycles)
        c.add(catalog.CYCLES.name, {}, cycles)
        if gpu:
            c.add(catalog.SAMPLED_CYCLES.name, {}, cycles)
        for i in range(k):
            c.add(catalog.DRAFTED_BY_POSITION.name, {"position": str(i)}, drafted[i])
            c.add(catalog.ACCEPTED_BY_POSITION.name, {"position": str(i)}, accepted[i])
        c.add(catalog.DRAFT_TOKENS.name, {}, sum(drafted))
        c.add(catalog.ACCEPTED_TOKENS.name, {}, sum(accepted))
        c.add(catalog.EMITTED_TOKENS.name, {}, emitted)
        c.add(catalog.ACCEPT_LENGTH.name + "_sum", {}, lengths)
        c.add(catalog.ACCEPT_LENGTH.name + "_count", {}, seq)
        c.add(catalog.BATCH_SIZE.name + "_sum", {}, seq)
        c.add(catalog.BATCH_SIZE.name + "_count", {}, cycles)
        label = {"draft_length": str(k)}
        c.add(catalog.CYCLES_BY_DRAFT_LENGTH.name, label, cycles)
        c.add(catalog.SEQUENCES_BY_DRAFT_LENGTH.name, label, seq)
        c.add(catalog.EMITTED_BY_DRAFT_LENGTH.name, label, emitted)
        c.add(catalog.ACCEPTED_BY_DRAFT_LENGTH.name, label, sum(accepted))
        c.add(catalog.DRAFTED_BY_DRAFT_LENGTH.name, label, sum(drafted))
        for p, m in phases.items():
            c.add(catalog.PHASE_TIME_BY_DRAFT_LENGTH.name, {"phase": p, **label}, m * cycles)
        c.add(catalog.DRAFT_LENGTH.name + "_sum", {}, k * cycles)
        c.add(catalog.DRAFT_LENGTH.name + "_count", {}, cycles)
        if self.gap > 0 and cycles > 1:
            _histogram(c, catalog.CYCLE_GAP.name, {}, self.gap, cycles - 1)
        if baseline is not None:
            g.add(catalog.BASELINE_SEQUENCE_TOKENS.name, {"source": baseline},
                  1.0 / self.plain_seconds(batch))
        g.add(catalog.REQUESTS_RUNNING.name, {}, float(batch))
        g.add(catalog.REQUESTS_WAITING.name, {}, 0.0)
        busy = cycles * (sum(phases.values()) + self.gap)
        return Delta(c, g, elapsed if elapsed is not None else busy)


def _histogram(c: Series, name: str, labels: dict[str, str], mean: float, n: int) -> None:
    """``n`` observations of about ``mean``: half in the bucket that holds 0.97 of it, half in
    the one that holds 1.03 of it (a spread of a few percent, as a steady engine shows)."""
    lo_i = bisect.bisect_left(BUCKETS, mean * 0.97)
    hi_i = bisect.bisect_left(BUCKETS, mean * 1.03)
    half = n // 2
    for i, le in enumerate(BUCKETS):
        count = (half if i >= lo_i else 0) + (n - half if i >= hi_i else 0)
        c.add(name + "_bucket", {**labels, "le": repr(float(le))}, count)
    c.add(name + "_bucket", {**labels, "le": "+Inf"}, n)
    c.add(name + "_sum", labels, mean * n)
    c.add(name + "_count", labels, n)
