"""The PromQL the dashboards' panels share: selectors bound to the dashboard variables, the
cycle breakdown's derived expressions, and small helpers for legends and right-hand axes.

Legends are Grafana templates (``{{instance}}``), written as plain strings.
"""

from __future__ import annotations

from typing import Any

import specobs.catalog as c
from specobs.mixin._config import MixinConfig
from specobs.mixin._panels import RATE
from specobs.mixin._promql import ratio, selector
from specobs.mixin._rule_names import BASELINE_CONFIGURED

__all__ = [
    "CONDITIONAL_POSITIONS",
    "ENGINE_LATENCY",
    "GPU",
    "HOST",
    "NO_ENGINE_METRICS",
    "CycleQueries",
    "engine_matchers",
    "matchers",
    "percentile",
    "right_axis",
    "share_axis",
]

GPU = 'clock="gpu"'
HOST = 'clock="host"'

#: The engines' own request latency histograms (title, what it is, series names without
#: ``_bucket``), read where Prometheus scrapes the engine: vLLM's and SGLang's names, and
#: vLLM's name for inter-token latency before it was renamed.
ENGINE_LATENCY: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Inter-token latency", "Time between two tokens of a request (TPOT/ITL)",
     ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
      "sglang:inter_token_latency_seconds")),
    ("Time to first token", "Time from a request's arrival to its first token",
     ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")),
    ("End-to-end request latency", "Time from a request's arrival to its last token",
     ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")),
)
#: What an engine-latency panel shows when the engine's metrics are not scraped.
NO_ENGINE_METRICS = "Engine metrics not scraped"

#: Draft positions the conditional-acceptance panel plots (0 .. this - 1).
CONDITIONAL_POSITIONS = 8


def percentile(q: float) -> str:
    """``p50`` for 0.5."""
    return f"p{int(q * 100)}"


def right_axis(pattern: str, *, label: str | None = None, unit: str | None = None,
               maximum: float | None = None) -> dict[str, Any]:
    """An override that puts the series matching ``pattern`` on the right-hand axis, with its
    own unit, maximum and axis label where given."""
    props: list[dict[str, Any]] = []
    if unit is not None:
        props.append({"id": "unit", "value": unit})
    if maximum is not None:
        props.append({"id": "max", "value": maximum})
    props.append({"id": "custom.axisPlacement", "value": "right"})
    if label is not None:
        props.append({"id": "custom.axisLabel", "value": label})
    return {"matcher": {"id": "byRegexp", "options": pattern}, "properties": props}


def share_axis(pattern: str) -> dict[str, Any]:
    """The right-hand axis of a share (0 to 1) drawn beside other figures."""
    return right_axis(pattern, label="share", unit="percentunit", maximum=1)


def matchers(config: MixinConfig, *, instance: bool = True, engine: bool = False) -> str:
    """The dashboard variables as label matchers: group labels, job, model (and instance, and
    with ``engine`` the serving engine)."""
    parts = [f'{label}=~"${label}"' for label in config.group_labels]
    parts.append('job=~"$job"')
    if instance:
        parts.append('instance=~"$instance"')
    parts.append(f'{config.model_label}=~"$model"')
    if engine:
        parts.append(f'{config.engine_label}=~"${config.engine_label}"')
    return ", ".join(parts)


def engine_matchers(config: MixinConfig) -> str:
    """The engine's series come from its own scrape job and port: matched by the group labels
    and the model only (vLLM and SGLang both label ``model_name``), not by job or instance."""
    parts = [f'{label}=~"${label}"' for label in config.group_labels]
    parts.append(f'{config.model_label}=~"$model"')
    return ", ".join(parts)


class CycleQueries:
    """PromQL over the raw series of the servers the cycle breakdown selects."""

    def __init__(self, config: MixinConfig) -> None:
        self.config = config
        self.matchers = matchers(config)

    def s(self, name: str, extra: str = "") -> str:
        """A selector of ``name`` with the dashboard's matchers (and ``extra``)."""
        return selector(name, f"{self.matchers}, {extra}" if extra else self.matchers)

    def rate(self, name: str, extra: str = "") -> str:
        return f"rate({self.s(name, extra)}[{RATE}])"

    def srate(self, by: str, name: str, extra: str = "") -> str:
        """The rate summed ``by`` those labels (over everything when ``by`` is empty)."""
        rate = self.rate(name, extra)
        return f"sum by ({by}) ({rate})" if by else f"sum({rate})"

    def per(self, by: str, num: str, den: str, extra: str = "") -> str:
        """The rate of ``num`` over that of ``den``, both summed ``by``."""
        return ratio(self.srate(by, num, extra), self.srate(by, den, extra))

    def mean(self, by: str, histogram: str, extra: str = "") -> str:
        """A histogram's mean: the rate of its sum over that of its count."""
        return self.per(by, histogram + "_sum", histogram + "_count", extra)

    def quantile(self, q: float, by: str, histogram: str, extra: str = "") -> str:
        """A quantile from the histogram's buckets; ``>= 0`` drops the NaN of an empty window."""
        return f"histogram_quantile({q}, {self.srate(by, histogram + '_bucket', extra)}) >= 0"

    def share(self, label: str, num: str, den: str, extra: str = "") -> str:
        """The rate of ``num`` by ``label`` over the total rate of ``den``."""
        return (f"{self.srate(label, num, extra)}\n/ ignoring ({label}) group_left ()\n"
                f"({self.srate('', den, extra)} > 0)")

    def max(self, name: str) -> str:
        """A gauge's largest value per server."""
        return f"max by (instance) ({self.s(name)})"

    def emitted_per_sequence(self) -> str:
        return (f"(\n  {self.srate('instance', c.EMITTED_TOKENS.name)}\n  /\n"
                f"  ({self.srate('instance', c.BATCH_SIZE.name + '_sum')} > 0)\n)")

    def sequence_speed(self) -> str:
        """Tokens per second one sequence gains: tokens per sequence-cycle over cycle time."""
        cycle = c.CYCLE_DURATION.name
        return (f"{self.emitted_per_sequence()}\n/\n"
                f"(\n  {self.srate('instance', cycle + '_sum', HOST)}\n  /\n"
                f"  ({self.srate('instance', cycle + '_count', HOST)} > 0)\n)")

    def realized(self) -> str:
        """Per-sequence speed over the baseline, with the baseline's ``source``."""
        gauge = self.s(c.BASELINE_SEQUENCE_TOKENS.name)
        return (
            f"{self.sequence_speed()}\n/ on (instance) group_left (source)\n(\n"
            f"  max by (instance, source) (\n    label_replace("
            f'{gauge}, "source", "{BASELINE_CONFIGURED}", '
            '"source", "")\n  )\n  > 0\n)'
        )

    def accepted_per_sequence(self) -> str:
        return self.mean("instance", c.ACCEPT_LENGTH.name)

    def conditional_acceptance(self) -> str:
        """Accepted at position i over accepted at i - 1 (position 0: over drafted at 0), one
        ``or``-ed term per position so a position nobody drafts is simply absent."""
        acc, drafted = c.ACCEPTED_BY_POSITION.name, c.DRAFTED_BY_POSITION.name

        def at(i: int) -> str:
            return f'position="{i}"'

        terms = [ratio(self.srate("position", acc, at(0)),
                       self.srate("position", drafted, at(0)))]
        for i in range(1, CONDITIONAL_POSITIONS):
            terms.append(
                f"label_replace(\n  {self.srate('', acc, at(i))}\n  /\n"
                f"  ({self.srate('', acc, at(i - 1))} > 0),\n"
                f'  "position", "{i}", "", ""\n)'
            )
        return "\nor\n".join(terms)
