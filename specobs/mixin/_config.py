"""The one configuration object of the monitoring mixin.

Every threshold, window, selector and naming choice the generated dashboards, recording rules,
alerts and runbook depend on lives in :class:`MixinConfig`. Users regenerate everything with their
own values::

    from specobs.mixin import MixinConfig, write_all
    write_all(".", MixinConfig(selector='job="llm-servers"', rate_window="2m"))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

__all__ = ["RULE_FIELDS", "MixinConfig"]

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class MixinConfig:
    """Selectors, windows, thresholds and names for the generated mixin.

    Durations are Prometheus durations (``"5m"``, ``"90s"``). Ratios are plain fractions.
    """

    #: Label matchers (without braces) that select specobs series in recording and alert rules.
    #: Must contain an equality matcher on ``job`` so the target-missing alert can use ``absent``.
    selector: str = 'job="specobs"'
    #: Constant label that names the served model (set on the exporter by the user).
    model_label: str = "model"
    #: Constant label that names the serving engine (sglang, vllm, transformers, ...).
    engine_label: str = "engine"
    #: Rate window of every recording rule; it is part of the rule names (``...:rate5m``).
    rate_window: str = "5m"
    #: How far back "the same server's recent past" reaches for the regression alerts.
    history_window: str = "1h"
    #: The recent past ends this long ago, so a regression does not dilute its own reference.
    history_offset: str = "10m"
    #: Phase names of the draft and verify phases (engines may name their own).
    draft_phase: str = "draft"
    verify_phase: str = "verify"

    #: SpecobsDecodeThroughputDrop: per-sequence speed below this fraction of its recent past.
    throughput_drop_ratio: float = 0.7
    throughput_drop_for: str = "10m"
    #: SpecobsAcceptanceRateDrop: acceptance below this fraction of its recent past.
    acceptance_drop_ratio: float = 0.7
    acceptance_drop_for: str = "10m"
    #: SpecobsSpeculationSlowerThanBaseline: realized speedup below this.
    min_speedup: float = 1.0
    slower_than_baseline_for: str = "15m"
    #: SpecobsPhaseLatencyRegression: phase mean above this multiple of its recent past ...
    phase_regression_ratio: float = 1.5
    #: ... unless the mean batch grew by more than this factor (load, not a regression).
    batch_growth_tolerance: float = 1.2
    phase_regression_for: str = "15m"
    #: SpecobsDecodingStalled: requests waiting or running and no cycle for this long.
    stall_for: str = "5m"
    #: SpecobsExporterDown / SpecobsTargetMissing.
    exporter_down_for: str = "5m"
    target_missing_for: str = "15m"
    #: SpecobsExporterDroppingRecords: dropped records per cycle above this fraction.
    dropped_records_ratio: float = 0.01
    dropped_records_for: str = "15m"

    #: Dashboard titles start with this; uids with ``uid_prefix``.
    dashboard_prefix: str = "Speculative decoding — "
    uid_prefix: str = "specobs-"
    dashboard_tags: tuple[str, ...] = ("specobs",)
    #: Alerts' ``runbook_url`` is this plus ``#<anchor>``.
    runbook_base_url: str = "https://github.com/specobs/specobs/blob/main/docs/runbook.md"
    #: Grafana uid of a trace datasource (Tempo, Jaeger); exemplars on latency panels link to it.
    trace_datasource_uid: str | None = None
    #: Exemplar label that carries the trace id.
    exemplar_trace_label: str = "trace_id"
    #: How many servers the fleet dashboard's top/bottom-k outlier panels show.
    outlier_count: int = 10

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_window", "_offset", "_for")) and not _DURATION.match(value):
                raise ValueError(
                    f"MixinConfig.{f.name} must be a Prometheus duration such as '5m'; "
                    f"got {value!r}."
                )
            if f.name.endswith("_label") and not _LABEL.match(value):
                raise ValueError(f"MixinConfig.{f.name} must be a label name; got {value!r}.")
        if not re.search(r'(^|[,{\s])job="[^"]+"', self.selector):
            raise ValueError(
                "MixinConfig.selector must contain an equality matcher on job, such as "
                f"'job=\"specobs\"' (absent() needs it to name the missing target); "
                f"got {self.selector!r}."
            )
        for name in ("throughput_drop_ratio", "acceptance_drop_ratio", "dropped_records_ratio"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"MixinConfig.{name} must be between 0 and 1.")

    @property
    def instance_labels(self) -> tuple[str, ...]:
        """Labels the ``instance:`` recording rules keep: one series per server."""
        return ("job", "instance", self.model_label, self.engine_label)

    @property
    def by(self) -> str:
        """``job, instance, model, engine``: the grouping of every instance-level rule."""
        return ", ".join(self.instance_labels)

    @property
    def window_suffix(self) -> str:
        """The rate window as it appears in rule names: ``5m``."""
        return self.rate_window


#: Fields the rule file depends on; the generated promtool tests assume their defaults.
RULE_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in fields(MixinConfig)
    if f.name
    not in {
        "dashboard_prefix",
        "uid_prefix",
        "dashboard_tags",
        "trace_datasource_uid",
        "exemplar_trace_label",
        "runbook_base_url",
        "outlier_count",
    }
)
