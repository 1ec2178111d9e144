"""GPU-timing sampling schedules: pure functions of the cycle number and measured costs.

Every cycle is counted and host-timed. Only sampled cycles record CUDA events. The schedule is a
pure function so it can be tested without a clock:

* fixed: ``should_sample(index, interval)`` with ``interval = sample_every``;
* adaptive: the resolver feeds ``adaptive_interval`` the cost of a sampled cycle (its event
  records on the worker plus the resolver's reads of those events, both measured) and the mean
  cycle time, and the recorder samples one cycle in ``interval`` so that the cost stays under
  the overhead budget (default 0.2% of cycle time).
"""

from __future__ import annotations

import math

__all__ = ["MAX_INTERVAL", "adaptive_interval", "geometric_gap", "should_sample", "smoothed"]

#: Never sample fewer than one cycle in this many, so slow drifts in GPU time are still seen.
MAX_INTERVAL = 1024


def should_sample(index: int, interval: int) -> bool:
    """Whether cycle ``index`` (0-based) is GPU-timed when one in ``interval`` is."""
    return interval <= 1 or index % interval == 0


def adaptive_interval(
    sample_cost_ns: float,
    cycle_ns: float,
    budget: float,
    *,
    max_interval: int = MAX_INTERVAL,
) -> int:
    """Smallest interval N such that ``sample_cost_ns / N <= budget * cycle_ns``.

    ``sample_cost_ns`` is the extra host time a sampled cycle costs (recording its events, and
    reading them on the resolver, which shares the GIL with the worker);
    ``cycle_ns`` is the mean host time of a cycle. Unknown or zero inputs give 1 (sample every
    cycle) for cost 0, and ``max_interval`` for an unknown cycle time.
    """
    if sample_cost_ns <= 0 or not math.isfinite(sample_cost_ns):
        return 1
    if cycle_ns <= 0 or not math.isfinite(cycle_ns) or budget <= 0:
        return max_interval
    n = math.ceil(sample_cost_ns / (budget * cycle_ns) - 1e-9)
    return max(1, min(max_interval, n))


def smoothed(previous: float, sample: float, weight: float = 0.2) -> float:
    """Exponentially weighted moving average; ``previous <= 0`` means no history yet."""
    if previous <= 0:
        return sample
    return previous + weight * (sample - previous)


def geometric_gap(u: float, rate: float) -> int:
    """Cycles skipped before the next one picked, when each is picked with probability
    ``rate``: a geometric draw from one uniform ``u`` in [0, 1), so head-sampling a stream costs
    one draw per picked cycle instead of one per cycle, with the same distribution."""
    if rate >= 1.0:
        return 0
    if rate <= 0.0:
        raise ValueError(f"rate must be > 0, got {rate}")
    return int(math.log(1.0 - u) / math.log(1.0 - rate))
