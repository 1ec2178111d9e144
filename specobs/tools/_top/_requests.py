"""Per-request acceptance for ``specobs top``: the interval's finished requests in short, and the
worst requests the endpoint keeps as exemplars.

From the counter deltas of ``specobs_request_acceptance`` (each finished request's accepted /
drafted draft tokens): how many requests finished, their median and 10th percentile
(interpolated inside buckets like ``histogram_quantile``) and the share at or below the alert's
threshold (``MixinConfig.request_acceptance_low``, the same bucket the alert reads). The worst
requests are the exemplars on the lowest buckets (OpenMetrics), each the latest traced request
in its bucket, so they may predate the interval. ``None`` -- nothing shown -- when the endpoint
has no such series (an engine that does not report finished requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specobs import catalog
from specobs.mixin import MixinConfig
from specobs.tools import _breakdown as bd
from specobs.tools import _scrape as scr

__all__ = ["WORST_SHOWN", "RequestAcceptance", "live_text", "plain_text", "request_acceptance"]

#: How many of the worst requests' traces are shown.
WORST_SHOWN = 3
_NAME = catalog.REQUEST_ACCEPTANCE.name


@dataclass(frozen=True)
class RequestAcceptance:
    """The interval's finished requests (those that drafted) and the worst traced ones."""

    requests: float
    p10: float | None
    p50: float | None
    #: Share of the requests at or below ``low`` (``None`` without requests).
    low_share: float | None
    low: float
    #: ``(acceptance, trace id)`` of the worst traced requests, lowest first.
    worst: tuple[tuple[float, str], ...]


def request_acceptance(
    counters: scr.Series, exemplars: Mapping[tuple[str, scr.LabelKey], scr.Exemplar]
) -> RequestAcceptance | None:
    """The summary, or ``None`` when neither the deltas nor the exemplars have the series."""
    worst = sorted(
        (ex.value, ex.labels[catalog.EXEMPLAR_TRACE_ID_LABEL])
        for (name, _), ex in exemplars.items()
        if name == f"{_NAME}_bucket" and catalog.EXEMPLAR_TRACE_ID_LABEL in ex.labels
    )[:WORST_SHOWN]
    if not counters.has(f"{_NAME}_count") and not worst:
        return None
    cumulative = bd.cumulative_buckets(counters, _NAME)
    n = counters.total(f"{_NAME}_count") or 0.0
    low = MixinConfig().request_acceptance_low
    return RequestAcceptance(
        requests=n,
        p10=bd.histogram_quantile(0.1, cumulative),
        p50=bd.histogram_quantile(0.5, cumulative),
        low_share=bd.ratio(cumulative.get(low), n),
        low=low,
        worst=tuple(worst),
    )


def plain_text(r: RequestAcceptance) -> str:
    """The plain line's part: ``requests=300 req_p50=62.0% req_low=4.0% worst=0%:4bf9...``."""
    parts = [f"requests={r.requests:.0f}", f"req_p10={scr.format_percent(r.p10)}",
             f"req_p50={scr.format_percent(r.p50)}",
             f"req_le{r.low:g}={scr.format_percent(r.low_share)}"]
    if r.worst:
        parts.append("worst=" + ",".join(f"{scr.format_percent(v, 0)}:{t}" for v, t in r.worst))
    return " ".join(parts)


def live_text(r: RequestAcceptance) -> str:
    """The live view's line."""
    text = (f"requests {r.requests:.0f}: acceptance p10 {scr.format_percent(r.p10)}, "
            f"p50 {scr.format_percent(r.p50)}, at most {r.low:.0%}: "
            f"{scr.format_percent(r.low_share)}")
    if r.worst:
        text += "  worst traced: " + ", ".join(
            f"{scr.format_percent(v, 0)} {t}" for v, t in r.worst)
    return text
