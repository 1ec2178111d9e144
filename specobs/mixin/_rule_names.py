"""The names the rules share: every alert's and recording rule's name, and the rule records.

:class:`AlertNames` and :class:`RuleNames` are the one table of names the rules, the dashboards,
the promtool tests and ``specobs fleet-sim --score`` read; :class:`RecordingRule` and
:class:`AlertRule` are what the rule tables hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import specobs.catalog as c
from specobs.mixin import _engines
from specobs.mixin._config import MixinConfig

__all__ = [
    "ALERT_PREFIX",
    "BASELINE_CONFIGURED",
    "ENGINE_REQUEST_GAUGES",
    "ENGINE_SOURCE",
    "AlertNames",
    "AlertRule",
    "RecordingRule",
    "RuleNames",
]

ALERT_PREFIX = "Specobs"
#: ``source`` of a baseline gauge that carries none (set by configuration, not measured).
BASELINE_CONFIGURED = c.BASELINE_SOURCE_CONFIGURED


class AlertNames:
    """Every alert's name, the one table: :func:`alert_rules`, the promtool rule tests and
    ``specobs fleet-sim --score`` read it."""

    ACCEPTANCE_BELOW_COHORT = f"{ALERT_PREFIX}AcceptanceBelowCohort"
    ACCEPTANCE_RATE_DROP = f"{ALERT_PREFIX}AcceptanceRateDrop"
    DECODE_THROUGHPUT_BELOW_COHORT = f"{ALERT_PREFIX}DecodeThroughputBelowCohort"
    COHORT_THROUGHPUT_DROP = f"{ALERT_PREFIX}CohortThroughputDrop"
    DECODE_THROUGHPUT_DROP = f"{ALERT_PREFIX}DecodeThroughputDrop"
    SPECULATION_SLOWER_THAN_BASELINE = f"{ALERT_PREFIX}SpeculationSlowerThanBaseline"
    PHASE_LATENCY_ABOVE_COHORT = f"{ALERT_PREFIX}PhaseLatencyAboveCohort"
    PHASE_LATENCY_REGRESSION = f"{ALERT_PREFIX}PhaseLatencyRegression"
    DECODING_STALLED = f"{ALERT_PREFIX}DecodingStalled"
    EXPORTER_DOWN = f"{ALERT_PREFIX}ExporterDown"
    TARGET_MISSING = f"{ALERT_PREFIX}TargetMissing"
    EXPORTER_DROPPING_RECORDS = f"{ALERT_PREFIX}ExporterDroppingRecords"
    LOW_ACCEPTANCE_REQUESTS_JUMP = f"{ALERT_PREFIX}LowAcceptanceRequestsJump"

    @classmethod
    def all(cls) -> tuple[str, ...]:
        """Every name, in the order of :func:`alert_rules`."""
        return tuple(v for k, v in vars(cls).items() if k.isupper())


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str


@dataclass(frozen=True)
class AlertRule:
    """One alert. ``description`` is a Go template; ``value_format`` documents ``$value``."""

    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def anchor(self) -> str:
        """The docs/runbook.md anchor: the lower-cased alert name (a Markdown heading)."""
        return self.alert.lower()


#: The engines' own request gauges the stall alert reads, besides specobs's (vLLM
#: ``vllm/v1/metrics/loggers.py``, SGLang ``sglang/srt/metrics/collector.py``).
ENGINE_REQUEST_GAUGES: tuple[str, ...] = tuple(
    name for engine in _engines.ENGINES for name in engine.request_gauges
)
#: The ``source`` label of a fleet series computed from an engine's own series.
ENGINE_SOURCE = "engine"


class RuleNames:
    """The recording rule names for one config (the window is part of every rate rule's name).

    Levels: ``instance:`` one series per server; ``cohort:`` one per cohort (the servers of one
    model and engine in one group, whatever their instance); ``host:`` one per host (joins the
    engine's own gauges with specobs's series of the same pod or machine).
    """

    def __init__(self, config: MixinConfig) -> None:
        w = config.rate_window
        self.cycles = f"instance:{c.CYCLES.base_name}:rate{w}"
        self.emitted = f"instance:{c.EMITTED_TOKENS.base_name}:rate{w}"
        self.drafted = f"instance:{c.DRAFT_TOKENS.base_name}:rate{w}"
        self.accepted = f"instance:{c.ACCEPTED_TOKENS.base_name}:rate{w}"
        self.sequences = f"instance:{c.BATCH_SIZE.name}_sum:rate{w}"
        self.acceptance = f"instance:specobs_acceptance:ratio_rate{w}"
        # Two names so nobody mistakes one for vLLM's "mean acceptance length" (bonus included).
        self.accept_length_excl_bonus = f"instance:specobs_accept_length_excl_bonus:mean_rate{w}"
        self.accept_length_incl_bonus = f"instance:specobs_accept_length_incl_bonus:mean_rate{w}"
        self.batch_size_mean = f"instance:{c.BATCH_SIZE.name}:mean_rate{w}"
        self.draft_length_mean = f"instance:{c.DRAFT_LENGTH.name}:mean_rate{w}"
        self.emitted_per_sequence = f"instance:specobs_emitted_tokens_per_sequence:ratio_rate{w}"
        self.drafted_per_sequence = f"instance:specobs_draft_tokens_per_sequence:ratio_rate{w}"
        self.cycle_mean = f"instance:{c.CYCLE_DURATION.name}:mean_rate{w}"
        self.cycle_p99 = f"instance:{c.CYCLE_DURATION.name}:p99_rate{w}"
        # The time between cycles: its mean, and its share of gaps plus host cycle time.
        self.gap_mean = f"instance:{c.CYCLE_GAP.name}:mean_rate{w}"
        self.gap_share = f"instance:specobs_cycle_gap:share_rate{w}"
        self.phase_mean = f"instance:{c.PHASE_DURATION.name}:mean_rate{w}"
        self.phase_share = f"instance:{c.PHASE_DURATION.name}:share_rate{w}"
        self.sequence_speed = f"instance:specobs_sequence_tokens_per_second:rate{w}"
        self.baseline = f"instance:{c.BASELINE_SEQUENCE_TOKENS.name}:max"
        self.speedup_realized = f"instance:specobs_speedup:realized_rate{w}"
        self.speedup_predicted = f"instance:specobs_speedup:predicted_rate{w}"
        self.speedup_calibration = f"instance:specobs_speedup:calibration_rate{w}"
        self.dropped = f"instance:{c.DROPPED_RECORDS.base_name}:rate{w}"
        self.sampled_ratio = f"instance:{c.SAMPLED_CYCLES.base_name}:ratio_rate{w}"
        self.up = "instance:specobs_up:max"
        self.last_cycle_age = f"instance:{c.LAST_CYCLE_TIMESTAMP.name}:age"
        self.alerts_firing = "instance:specobs_alerts:count_firing"
        # The engines' own series normalised (one rule per quantity, every engine in it), and
        # acceptance by draft position from the plugin or the engine.
        ops = {"accept_length_incl_bonus": f"mean_rate{w}", "acceptance_by_position":
               f"ratio_rate{w}"}
        self.engine = {
            q.key: f"instance:specobs_engine_{q.key}:{ops.get(q.key, f'rate{w}')}"
            for q in _engines.QUANTITIES
        }
        self.acceptance_by_position = f"instance:specobs_acceptance_by_position:ratio_rate{w}"
        self.cohort_servers = "cohort:specobs_servers:count"
        self.cohort_emitted = f"cohort:{c.EMITTED_TOKENS.base_name}:rate{w}"
        self.cohort_acceptance = f"cohort:specobs_acceptance:ratio_rate{w}"
        self.cohort_acceptance_median = f"cohort:specobs_acceptance:median_rate{w}"
        self.cohort_speed_median = f"cohort:specobs_sequence_tokens_per_second:median_rate{w}"
        self.cohort_batch_median = f"cohort:{c.BATCH_SIZE.name}:median_rate{w}"
        self.cohort_phase_median = f"cohort:{c.PHASE_DURATION.name}:median_rate{w}"
        # Cycle-time bucket rates per server for the host clock only (the p99 reads them), per
        # cohort for the fleet heatmaps; accept-length bucket rates per cohort only.
        self.cycle_bucket = f"instance:{c.CYCLE_DURATION.name}_bucket:rate{w}"
        self.cohort_cycle_bucket = f"cohort:{c.CYCLE_DURATION.name}_bucket:rate{w}"
        self.cohort_accept_length_bucket = f"cohort:{c.ACCEPT_LENGTH.name}_bucket:rate{w}"
        self.host_up = "host:specobs_up:max"
        self.host_requests = "host:specobs_engine_requests:max"
        self.host_last_cycle = f"host:{c.LAST_CYCLE_TIMESTAMP.name}:max"
        # Finished requests, over their own (longer) window: requests finish far less often
        # than cycles. The share of those with acceptance <= request_acceptance_low.
        rw = config.request_window
        self.request_low_share = f"instance:{c.REQUEST_ACCEPTANCE.name}_low:ratio_rate{rw}"
        self.requests_finished = f"instance:{c.REQUESTS_FINISHED.base_name}:increase{rw}"
