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


def _duration_seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(
        float(value) * units[unit] for value, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    )


@dataclass(frozen=True)
class MixinConfig:
    """Selectors, windows, thresholds and names for the generated mixin.

    Durations are Prometheus durations (``"5m"``, ``"90s"``). Ratios are plain fractions.
    """

    #: Label matchers (without braces) that select specobs series in recording and alert rules.
    #: Must contain an equality matcher on ``job`` so the target-missing alert can use ``absent``.
    selector: str = 'job="specobs"'
    #: Constant label that names the served model (set on the exporter by the user, e.g.
    #: ``SPECOBS_LABELS=model_name=llama-3-8b``); ``model_name`` is what vLLM and SGLang use.
    model_label: str = "model_name"
    #: Constant label that names the serving engine (sglang, vllm, transformers, ...). Not
    #: ``engine``: vLLM's own ``engine`` label is the engine *index* ("0", "1", ...).
    engine_label: str = "serving_engine"
    #: Labels that partition a fleet above the server (a multi-cluster ruler, Thanos, Mimir):
    #: carried by every rule, alert and dashboard variable. Absent labels cost nothing.
    group_labels: tuple[str, ...] = ("cluster", "namespace")
    #: Labels that name one server besides ``instance`` (the Prometheus Operator adds ``pod``):
    #: kept by the ``instance:`` rules and shown in the fleet table.
    server_labels: tuple[str, ...] = ("pod",)
    #: Matchers (without braces) for the engines' own request gauges that the stall alert reads
    #: (vLLM ``vllm:num_requests_running``/``waiting``, SGLang ``sglang:num_running_reqs``/
    #: ``num_queue_reqs``); an empty string reads them from every job.
    engine_selector: str = ""
    #: Rate window of every recording rule; it is part of the rule names (``...:rate5m``).
    rate_window: str = "5m"
    #: How far back "the same server's recent past" reaches for the regression alerts.
    history_window: str = "1h"
    #: The recent past ends this long ago, so a regression does not dilute its own reference.
    history_offset: str = "10m"
    #: The history alerts read one recorded average per ``history_step`` (a rule group of its
    #: own evaluated every ``history_step``), not every evaluation of the last hour: 12 samples
    #: per series per hour at 5m instead of 240 at 15 s. Their reference window moves in steps
    #: of this size. At most ``history_window``.
    history_step: str = "5m"
    #: Phase names of the draft and verify phases (engines may name their own).
    draft_phase: str = "draft"
    verify_phase: str = "verify"

    #: SpecobsDecodeThroughputDrop: per-sequence speed below this fraction of its recent past.
    throughput_drop_ratio: float = 0.7
    throughput_drop_for: str = "10m"
    #: Cohort alerts (a server against the median of its cohort: same model and engine in the same
    #: group): below this fraction of the cohort median for acceptance and per-sequence speed,
    #: above ``phase_regression_ratio`` times it for a phase's time.
    cohort_ratio: float = 0.7
    #: ... only for a server that drafts at least this many tokens/s (a quiet pod is no evidence).
    cohort_min_drafted_per_second: float = 1.0
    cohort_for: str = "5m"
    #: SpecobsCohortAcceptanceDrop / SpecobsCohortThroughputDrop: the cohort as a whole below this
    #: fraction of its own recent past (a rollout that degrades every pod of a model).
    acceptance_drop_ratio: float = 0.7
    acceptance_drop_for: str = "5m"
    #: SpecobsSpeculationSlowerThanBaseline: realized speedup below this.
    min_speedup: float = 1.0
    slower_than_baseline_for: str = "15m"
    #: SpecobsPhaseLatencyRegression: phase mean above this multiple of its recent past ...
    phase_regression_ratio: float = 1.5
    #: ... unless the mean batch grew by more than this factor (load, not a regression).
    batch_growth_tolerance: float = 1.2
    phase_regression_for: str = "15m"
    #: SpecobsDecodingStalled: requests waiting or running and no cycle for ``stall_after``, held
    #: for ``stall_for`` (together with a 15 s scrape: pages within 2 minutes of the stall).
    stall_after: str = "45s"
    stall_for: str = "30s"
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
    #: The per-server dashboard links to Grafana dashboards with any of these tags (the engines'
    #: own: vLLM's and SGLang's examples, or yours tagged so); empty: no such link.
    engine_dashboard_tags: tuple[str, ...] = ("vllm", "sglang")
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
            durations = ("_window", "_offset", "_step", "_for", "_after")
            if f.name.endswith(durations) and not _DURATION.match(value):
                raise ValueError(
                    f"MixinConfig.{f.name} must be a Prometheus duration such as '5m'; "
                    f"got {value!r}."
                )
            if f.name.endswith("_label") and not _LABEL.match(value):
                raise ValueError(f"MixinConfig.{f.name} must be a label name; got {value!r}.")
            if f.name.endswith("_labels"):
                bad = [v for v in value if not isinstance(v, str) or not _LABEL.match(v)]
                if isinstance(value, str) or bad:
                    raise ValueError(
                        f"MixinConfig.{f.name} must be a tuple of label names; got {value!r}."
                    )
        if _duration_seconds(self.history_step) > _duration_seconds(self.history_window):
            raise ValueError(
                "MixinConfig.history_step must not exceed history_window (the history alerts "
                f"average the {self.history_step} averages inside the window); got history_step="
                f"{self.history_step!r}, history_window={self.history_window!r}."
            )
        reserved = {"job", "instance", self.model_label, self.engine_label}
        clash = reserved & set(self.group_labels + self.server_labels)
        if clash:
            raise ValueError(
                f"MixinConfig.group_labels and server_labels must not repeat {sorted(clash)}: "
                "job, instance, the model and the engine label are always kept."
            )
        if not re.search(r'(^|[,{\s])job="[^"]+"', self.selector):
            raise ValueError(
                "MixinConfig.selector must contain an equality matcher on job, such as "
                f"'job=\"specobs\"' (absent() needs it to name the missing target); "
                f"got {self.selector!r}."
            )
        for name in (
            "throughput_drop_ratio", "acceptance_drop_ratio", "dropped_records_ratio",
            "cohort_ratio",
        ):  # fmt: skip
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"MixinConfig.{name} must be between 0 and 1.")

    @property
    def cohort_labels(self) -> tuple[str, ...]:
        """Labels of a cohort: servers of one model and engine in one group (cluster, ...)."""
        return (*self.group_labels, "job", self.model_label, self.engine_label)

    @property
    def instance_labels(self) -> tuple[str, ...]:
        """Labels the ``instance:`` recording rules keep: one series per server."""
        return (*self.group_labels, "job", "instance", *self.server_labels, self.model_label,
                self.engine_label)  # fmt: skip

    @property
    def by(self) -> str:
        """``cluster, namespace, job, instance, pod, model_name, serving_engine`` by default:
        the grouping of every instance-level rule."""
        return ", ".join(self.instance_labels)

    @property
    def cohort_by(self) -> str:
        """The grouping of every cohort-level rule."""
        return ", ".join(self.cohort_labels)

    @property
    def host_by(self) -> str:
        """The grouping that joins a host's engine gauges with its specobs series."""
        return ", ".join((*self.group_labels, "host"))

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
        "engine_dashboard_tags",
        "trace_datasource_uid",
        "exemplar_trace_label",
        "runbook_base_url",
        "outlier_count",
    }
)
