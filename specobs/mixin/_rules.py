"""Prometheus recording and alert rules, generated from the catalog and a :class:`MixinConfig`.

Recording rules are named ``level:metric:operations``. Every ``instance:`` rule aggregates to one
series per server (``job, instance`` plus the model and engine constant labels), so the fleet
dashboard and the alerts read a handful of precomputed series instead of raw histograms.

Alerts are CamelCase with the prefix ``Specobs``; each has a ``severity`` label, a static
``summary``, a templated ``description`` and a ``runbook_url`` into docs/runbook.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import specobs.catalog as c
from specobs.mixin import _engines
from specobs.mixin._config import MixinConfig, duration_seconds, generated_notice

__all__ = [
    "BASELINE_CONFIGURED",
    "ENGINE_REQUEST_GAUGES",
    "ENGINE_SOURCE",
    "AlertNames",
    "AlertRule",
    "RecordingRule",
    "RuleNames",
    "alert_chain_links",
    "alert_inputs",
    "alert_reads",
    "alert_rules",
    "baseline_expr",
    "detection_seconds",
    "history_name",
    "history_rules",
    "recording_rules",
    "render",
    "rule_cost",
    "rule_groups",
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


def _rate(metric: str, config: MixinConfig, by: str, matchers: str = "") -> str:
    selector = f"{config.selector}, {matchers}" if matchers else config.selector
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{config.rate_window}]))"


def _ratio(num: str, den: str) -> str:
    """``num / den`` where the denominator is positive: an idle server has no series, not NaN."""
    return f"{num}\n/\n({den} > 0)"


def _mean(histogram: str, config: MixinConfig, by: str, matchers: str = "") -> str:
    """A histogram's mean over the rate window: the rate of its sum over that of its count."""
    return _ratio(_rate(f"{histogram}_sum", config, by, matchers),
                  _rate(f"{histogram}_count", config, by, matchers))


def _plugin_or_engine(plugin: str, engine_rule: str) -> str:
    """A fleet series from specobs's plugin, or else from the engine's own series. The engine
    rule drops every host where the plugin is scraped, so "or" adds servers and never counts
    one twice."""
    return f"{plugin}\nor\n{engine_rule}"


def request_low_share_expr(config: MixinConfig, by: str) -> str:
    """The share of finished requests with acceptance <= ``request_acceptance_low`` over
    ``request_window``, by ``by``: the bucket's rate over the count's."""
    sel, window = config.selector, config.request_window
    low = f'le="{float(config.request_acceptance_low)!r}"'
    name = c.REQUEST_ACCEPTANCE.name
    return (
        f"sum by ({by}) (rate({name}_bucket{{{sel}, {low}}}[{window}]))\n/\n"
        f"(sum by ({by}) (rate({name}_count{{{sel}}}[{window}])) > 0)"
    )


def _host(expr: str) -> str:
    """``expr`` with a ``host`` label: ``instance`` without its port. The engine's own endpoint
    (vLLM's API port) and specobs's (9477) of one pod or machine share it."""
    return f'label_replace({expr}, "host", "$1", "instance", "(.+):[0-9]+")'


def engine_rule_expr(config: MixinConfig, quantity: str) -> str:
    """One normalising rule: every engine's transform of ``quantity`` labelled with its engine
    and ``source="engine"``, less the hosts where specobs's plugin is scraped (its series win)."""
    union = _engines.union(quantity, by=config.by, selector=config.engine_selector,
                           window=config.rate_window, engine_label=config.engine_label,
                           source=ENGINE_SOURCE)
    if union is None:
        raise ValueError(f"no engine gives the fleet quantity {quantity!r}")
    hosted = _host(f"(\n{union}\n)")
    return (
        f"label_replace(\n{hosted}\n"
        f"# specobs's plugin wins where it is scraped on the same host.\n"
        f"unless on ({config.host_by}) {_host(f'up{{{config.selector}}}')}\n"
        f', "host", "", "host", ".*")'
    )


def recording_rules(config: MixinConfig) -> list[RecordingRule]:
    """Every recording rule, in evaluation order (later rules read earlier ones).

    Every ratio divides by ``(denominator > 0)``: an idle server or a clock with no sample (the
    GPU clock on a CPU, or between sampled cycles) has no series instead of a stored NaN, so a
    dashboard's "or" fallback and its "No traffic" text work.
    """
    n = RuleNames(config)
    by = config.by
    cby = config.cohort_by
    hby = config.host_by
    sel = config.selector

    cycle_buckets = f"{c.CYCLE_DURATION.name}_bucket"
    host = 'clock="host"'
    own_requests = f'__name__=~"{c.REQUESTS_RUNNING.name}|{c.REQUESTS_WAITING.name}"'
    engine_sel = ", ".join(
        m for m in (f'__name__=~"{"|".join(ENGINE_REQUEST_GAUGES)}"', config.engine_selector) if m
    )
    e = n.engine
    # The fleet counters' rates: from the plugin's counter, else from the engine's quantity.
    # Sequence-cycles: an engine's drafts (verify steps of one sequence) are the same count.
    counted = (
        (n.emitted, c.EMITTED_TOKENS.name, "emitted_tokens"),
        (n.drafted, c.DRAFT_TOKENS.name, "draft_tokens"),
        (n.accepted, c.ACCEPTED_TOKENS.name, "accepted_tokens"),
        (n.sequences, f"{c.BATCH_SIZE.name}_sum", "drafts"),
    )

    return [
        RecordingRule(n.up, f"max by ({by}) (up{{{sel}}})"),
        *(RecordingRule(e[q.key], engine_rule_expr(config, q.key)) for q in _engines.QUANTITIES),
        RecordingRule(n.cycles, _rate(c.CYCLES.name, config, by)),
        *(RecordingRule(record, _plugin_or_engine(_rate(plugin, config, by), e[quantity]))
          for record, plugin, quantity in counted),
        RecordingRule(
            n.acceptance_by_position,
            _plugin_or_engine(
                _ratio(
                    _rate(c.ACCEPTED_BY_POSITION.name, config, f"{by}, position"),
                    _rate(c.DRAFTED_BY_POSITION.name, config, f"{by}, position"),
                ),
                e["acceptance_by_position"],
            ),
        ),
        RecordingRule(n.acceptance, _ratio(n.accepted, n.drafted)),
        RecordingRule(n.emitted_per_sequence, _ratio(n.emitted, n.sequences)),
        RecordingRule(n.drafted_per_sequence, _ratio(n.drafted, n.sequences)),
        RecordingRule(n.batch_size_mean, _ratio(n.sequences, n.cycles)),
        # The k in effect (engines change it at run time): the fleet table's "Mean k".
        RecordingRule(n.draft_length_mean, _mean(c.DRAFT_LENGTH.name, config, by)),
        RecordingRule(
            n.accept_length_excl_bonus,
            _plugin_or_engine(_mean(c.ACCEPT_LENGTH.name, config, by),
                              f"{e['accept_length_incl_bonus']} - 1"),
        ),
        # vLLM's dashboards show 1 + accepted / drafts: the target's bonus token included.
        RecordingRule(n.accept_length_incl_bonus, f"1 + {n.accept_length_excl_bonus}"),
        # The host clock only: the per-sequence speed (and through it the throughput and
        # baseline alerts) reads nothing else, and no dashboard reads this rule; the GPU clock
        # was 2 of the 21 raw series per server the alert group reads over its rate window.
        # (``specobs top`` and the report compute both clocks' means from the raw counters.)
        RecordingRule(n.cycle_mean, _mean(c.CYCLE_DURATION.name, config, f"{by}, clock", host)),
        # The host clock only (every cycle; what the fleet table, outliers and heatmap show):
        # 2 clocks x 20 bucket rates per server were the costliest rule at 1,000 servers. The
        # GPU clock's quantiles are on the cycle breakdown, from the raw histogram.
        RecordingRule(n.cycle_bucket, _rate(cycle_buckets, config, f"{by}, clock, le", host)),
        # ">= 0" drops the NaN histogram_quantile returns when no cycle fell in the window.
        RecordingRule(n.cycle_p99, f"histogram_quantile(0.99, {n.cycle_bucket}) >= 0"),
        # The engine's time outside cycles (scheduler, detokenisation, Python between steps):
        # the mean gap from a cycle's end to its thread's next begin, idle gaps left out, and
        # the gaps' share of the time the engine was busy (gaps plus host cycle time).
        RecordingRule(n.gap_mean, _mean(c.CYCLE_GAP.name, config, by)),
        RecordingRule(
            n.gap_share,
            _ratio(
                _rate(f"{c.CYCLE_GAP.name}_sum", config, by),
                f"(\n  {_rate(f'{c.CYCLE_GAP.name}_sum', config, by)}\n  +\n"
                f"  {_rate(f'{c.CYCLE_DURATION.name}_sum', config, by, host)}\n)",
            ),
        ),
        # The GPU clock exists only on sampled cycles, so each clock's mean is its own
        # rate(sum) / rate(count); never divide GPU time by the count of all cycles.
        RecordingRule(n.phase_mean, _mean(c.PHASE_DURATION.name, config, f"{by}, phase, clock")),
        RecordingRule(
            n.phase_share,
            f"{n.phase_mean}\n/ ignoring (phase) group_left ()\n"
            f"(sum without (phase) ({n.phase_mean}) > 0)",
        ),
        # Per-sequence speed: tokens one sequence gains per cycle over wall-clock cycle time.
        # Unlike tokens/s it does not fall when fewer requests arrive.
        RecordingRule(
            n.sequence_speed,
            f'{n.emitted_per_sequence}\n/ on ({by})\n({n.cycle_mean}{{clock="host"}} > 0)',
        ),
        # The baseline keeps where it came from: an engine that measures its own labels it
        # (source="demo_measured"); a configured one has no label and is called "configured".
        RecordingRule(n.baseline, baseline_expr(config)),
        RecordingRule(
            n.speedup_realized,
            f"{n.sequence_speed}\n/ on ({by}) group_left (source)\n({n.baseline} > 0)",
        ),
        # The cost model at the measured point, on each clock: the tokens acceptance gives one
        # sequence per cycle (1 + accepted) times a plain step's cost (1 / the baseline: the
        # step the engine measured, or the configured one) over the cycle's cost (draft +
        # verify + bookkeeping). docs/metrics.md states what it leaves out.
        RecordingRule(
            n.speedup_predicted,
            f"(\n  (1 + {n.accepted} / ({n.sequences} > 0))\n  / on ({by})\n"
            f"  max by ({by}) ({n.baseline} > 0)\n)\n"
            f"/ on ({by}) group_right ()\n"
            f"(sum without (phase) ({n.phase_mean}) > 0)",
        ),
        # Realized over wall time (the time between cycles counted) over predicted on the host
        # clock: 1 while the model holds. Below 1 the difference is time between cycles, cycle
        # time outside the phases, or tokens acceptance promised that were not emitted.
        RecordingRule(
            n.speedup_calibration,
            f"{n.speedup_realized}\n* on ({by}) group_left ()\n"
            f"((1 - {n.gap_share}) or (0 * {n.cycles} + 1))\n"
            f"/ on ({by}) group_left ()\n"
            f'({n.speedup_predicted}{{clock="host"}} > 0)',
        ),
        RecordingRule(n.dropped, _rate(c.DROPPED_RECORDS.name, config, f"{by}, reason")),
        RecordingRule(
            n.sampled_ratio,
            _ratio(_rate(c.SAMPLED_CYCLES.name, config, by), n.cycles),
        ),
        RecordingRule(
            n.last_cycle_age, f"time() - max by ({by}) ({c.LAST_CYCLE_TIMESTAMP.name}{{{sel}}})"
        ),
        RecordingRule(
            n.alerts_firing,
            f'count by ({by}) (ALERTS{{alertstate="firing", alertname=~"{ALERT_PREFIX}.*", {sel}}})'
            f"\nor on ({', '.join((*config.group_labels, 'job', 'instance'))})\n0 * {n.up}",
        ),
        # Cohorts: the servers of one model and engine, wherever and however long they run.
        RecordingRule(n.cohort_servers, f"count by ({cby}) ({n.cycles} > 0)"),
        RecordingRule(n.cohort_emitted, f"sum by ({cby}) ({n.emitted})"),
        RecordingRule(
            n.cohort_acceptance,
            _ratio(f"sum by ({cby}) ({n.accepted})", f"sum by ({cby}) ({n.drafted})"),
        ),
        RecordingRule(n.cohort_acceptance_median, f"quantile by ({cby}) (0.5, {n.acceptance})"),
        RecordingRule(n.cohort_speed_median, f"quantile by ({cby}) (0.5, {n.sequence_speed})"),
        RecordingRule(n.cohort_batch_median, f"quantile by ({cby}) (0.5, {n.batch_size_mean})"),
        RecordingRule(
            n.cohort_phase_median, f"quantile by ({cby}, phase, clock) (0.5, {n.phase_mean})"
        ),
        # The fleet heatmaps: bucket rates summed per cohort (16 cohorts x 19 buckets, where
        # the per-server series of 1,000 servers are 19,000), the cycle time on the host clock.
        RecordingRule(n.cohort_cycle_bucket, f"sum by ({cby}, clock, le) ({n.cycle_bucket})"),
        RecordingRule(
            n.cohort_accept_length_bucket,
            _rate(f"{c.ACCEPT_LENGTH.name}_bucket", config, f"{cby}, le"),
        ),
        # Hosts: the engine's own request gauges joined with specobs's series of the same host.
        RecordingRule(n.host_up, f"max by ({hby}) ({_host(f'up{{{sel}}}')})"),
        RecordingRule(
            n.host_requests,
            f"max by ({hby}) (\n  {_host('{' + engine_sel + '}')}\n  or\n"
            f"  {_host('{' + own_requests + ', ' + sel + '}')}\n)",
        ),
        RecordingRule(
            n.host_last_cycle,
            f"max by ({hby}) ({_host(f'{c.LAST_CYCLE_TIMESTAMP.name}{{{sel}}}')})",
        ),
        RecordingRule(n.request_low_share, request_low_share_expr(config, by)),
        RecordingRule(
            n.requests_finished,
            f"sum by ({by}) (increase({c.REQUESTS_FINISHED.name}{{{sel}}}"
            f"[{config.request_window}]))",
        ),
    ]


def baseline_expr(config: MixinConfig, by: str | None = None) -> str:
    """The non-speculative baseline per server with its ``source`` label (``configured`` where
    the exporter gave none); the dashboards use it with ``by="instance"``."""
    return (
        f"max by ({config.by if by is None else by}, source) (\n"
        f'  label_replace({c.BASELINE_SEQUENCE_TOKENS.name}{{{config.selector}}}, "source", '
        f'"{BASELINE_CONFIGURED}", "source", "")\n)'
    )


def history_name(record: str, config: MixinConfig) -> str:
    """The recorded ``history_step`` average of a recording rule: ``level:metric:avg5m_ops``
    (operations newest first, as in ``ratio_rate5m``)."""
    level, metric, ops = record.split(":")
    return f"{level}:{metric}:avg{config.history_step}_{ops}"


def _past(record: str, config: MixinConfig) -> str:
    """The recent past of a recording rule: the average of its recorded ``history_step``
    averages over ``history_window``, ending ``history_offset`` ago (12 samples per series for
    the default hour, where the rule itself would give 240 at a 15 s evaluation interval)."""
    return (
        f"avg_over_time({history_name(record, config)}[{config.history_window}] "
        f"offset {config.history_offset})"
    )


def alert_rules(config: MixinConfig) -> list[AlertRule]:
    """Every alert. Where a ratio is only interesting above zero the numerator is filtered first
    (``dropped > 0``): the same result, but the division matches a handful of series, not one
    per server and reason."""
    n = RuleNames(config)
    by = config.by
    cby = config.cohort_by
    hby = config.host_by
    sel = config.selector
    model = config.model_label
    engine = config.engine_label
    where = "{{ $labels.instance }} (job {{ $labels.job }})"
    cohort = (
        f"model {{{{ $labels.{model} }}}}, engine {{{{ $labels.{engine} }}}} "
        "(job {{ $labels.job }})"
    )
    history = (
        f"its average over the {config.history_window} before the last {config.history_offset}"
    )
    ratio = config.cohort_ratio
    busy = f"and on ({by})\n({n.drafted} > {config.cohort_min_drafted_per_second:g})"
    return [
        AlertRule(
            AlertNames.ACCEPTANCE_BELOW_COHORT,
            f"(\n  {n.acceptance}\n  < on ({cby}) group_left ()\n"
            f"  {ratio:g} * {n.cohort_acceptance_median}\n)\n{busy}",
            config.cohort_for,
            "warning",
            "A server's draft acceptance is far below the other servers of its model and engine.",
            f"Acceptance on {where} is {{{{ $value | humanizePercentage }}}} of drafted tokens, "
            f"below {ratio:.0%} of the median server of {cohort}: a new pod with a broken or "
            "mismatched draft, or one bad server.",
        ),
        AlertRule(
            AlertNames.ACCEPTANCE_RATE_DROP,
            f"{n.cohort_acceptance}\n< {config.acceptance_drop_ratio:g} * "
            f"{_past(n.cohort_acceptance, config)}",
            config.acceptance_drop_for,
            "warning",
            "A model's draft acceptance dropped across its servers against its recent past.",
            f"Acceptance of {cohort} over all its servers is "
            f"{{{{ $value | humanizePercentage }}}} of drafted tokens, below "
            f"{config.acceptance_drop_ratio:.0%} of {history}: a rollout or a traffic change "
            "that affects every server of the model.",
        ),
        AlertRule(
            AlertNames.DECODE_THROUGHPUT_BELOW_COHORT,
            f"(\n  {n.sequence_speed}\n  < on ({cby}) group_left ()\n"
            f"  {ratio:g} * {n.cohort_speed_median}\n)\n"
            f"unless on ({by})\n(\n  {n.batch_size_mean}\n  > on ({cby}) group_left ()\n"
            f"  {config.batch_growth_tolerance:g} * {n.cohort_batch_median}\n)\n{busy}",
            config.cohort_for,
            "warning",
            "A server decodes each sequence far slower than the other servers of its model.",
            f'Each sequence on {where} gains {{{{ $value | printf "%.1f" }}}} tokens/s, below '
            f"{ratio:.0%} of the median server of {cohort}, at a batch size no larger than "
            f"{config.batch_growth_tolerance:g}x theirs.",
        ),
        AlertRule(
            AlertNames.COHORT_THROUGHPUT_DROP,
            f"(\n  {n.cohort_speed_median}\n  < {config.throughput_drop_ratio:g} * "
            f"{_past(n.cohort_speed_median, config)}\n)\n"
            f"unless on ({cby})\n(\n  {n.cohort_batch_median}\n  > "
            f"{config.batch_growth_tolerance:g} * {_past(n.cohort_batch_median, config)}\n)",
            config.throughput_drop_for,
            "warning",
            "Per-sequence decode speed of a model dropped across its servers against its past.",
            f"The median server of {cohort} now gives each sequence "
            f'{{{{ $value | printf "%.1f" }}}} tokens/s, below '
            f"{config.throughput_drop_ratio:.0%} of {history}, with no matching growth in batch "
            "size: a rollout that slowed every server of the model.",
        ),
        AlertRule(
            AlertNames.DECODE_THROUGHPUT_DROP,
            f"(\n  {n.sequence_speed}\n  < {config.throughput_drop_ratio:g} * "
            f"{_past(n.sequence_speed, config)}\n)\n"
            f"unless on ({by})\n"
            f"(\n  {n.emitted}\n  > {_past(n.emitted, config)}\n)",
            config.throughput_drop_for,
            "warning",
            "Per-sequence decode speed dropped against the same server's recent past.",
            f'Each sequence on {where} now gains {{{{ $value | printf "%.1f" }}}} tokens/s, '
            f"below {config.throughput_drop_ratio:.0%} of {history}, while the server's total "
            "throughput did not rise (so this is not more load sharing the GPU).",
        ),
        AlertRule(
            AlertNames.SPECULATION_SLOWER_THAN_BASELINE,
            f"{n.speedup_realized} < {config.min_speedup:g}",
            config.slower_than_baseline_for,
            "warning",
            "Speculative decoding is slower than the non-speculative baseline.",
            f"Realized per-sequence speedup on {where} is "
            f'{{{{ $value | printf "%.2f" }}}}x the non-speculative baseline '
            f"({{{{ $labels.source }}}}; threshold {config.min_speedup:g}x).",
        ),
        AlertRule(
            AlertNames.PHASE_LATENCY_ABOVE_COHORT,
            f"(\n  {n.phase_mean}\n  > on ({cby}, phase, clock) group_left ()\n"
            f"  {config.phase_regression_ratio:g} * {n.cohort_phase_median}\n)\n"
            f"unless on ({by})\n(\n  {n.batch_size_mean}\n  > on ({cby}) group_left ()\n"
            f"  {config.batch_growth_tolerance:g} * {n.cohort_batch_median}\n)",
            config.cohort_for,
            "warning",
            "A phase takes far longer on one server than on the other servers of its model.",
            "The {{ $labels.phase }} phase on " + where + " takes "
            "{{ $value | humanizeDuration }} per cycle ({{ $labels.clock }} clock), more than "
            f"{config.phase_regression_ratio:g}x the median server of {cohort}, at a batch size "
            f"no larger than {config.batch_growth_tolerance:g}x theirs.",
        ),
        AlertRule(
            AlertNames.PHASE_LATENCY_REGRESSION,
            f"(\n  {n.phase_mean}\n  > {config.phase_regression_ratio:g} * "
            f"{_past(n.phase_mean, config)}\n)\n"
            f"unless on ({by})\n"
            f"(\n  {n.batch_size_mean}\n  > {config.batch_growth_tolerance:g} * "
            f"{_past(n.batch_size_mean, config)}\n)",
            config.phase_regression_for,
            "warning",
            "A speculative decoding phase got slower against the same server's recent past.",
            "The {{ $labels.phase }} phase on " + where + " now takes "
            "{{ $value | humanizeDuration }} per cycle ({{ $labels.clock }} clock), more than "
            f"{config.phase_regression_ratio:g}x {history}, with no matching growth in batch size.",
        ),
        AlertRule(
            AlertNames.DECODING_STALLED,
            f"{n.host_requests} > 0\n"
            f"and on ({hby})\n({n.host_up} == 1)\n"
            f"unless on ({hby})\n"
            f"(time() - {n.host_last_cycle} <= {duration_seconds(config.stall_after):g})",
            config.stall_for,
            "critical",
            "Requests are waiting or running but no speculative decoding cycle completes.",
            "Host {{ $labels.host }} has {{ $value }} requests running or waiting (the engine's "
            f"own gauges) and its specobs exporter saw no cycle end in the last "
            f"{config.stall_after}.",
        ),
        AlertRule(
            AlertNames.EXPORTER_DOWN,
            f"up{{{sel}}} == 0",
            config.exporter_down_for,
            "critical",
            "Prometheus cannot scrape a specobs exporter.",
            f"The specobs endpoint {where} has failed every scrape for {config.exporter_down_for}.",
        ),
        AlertRule(
            AlertNames.TARGET_MISSING,
            f"absent(up{{{sel}}})",
            config.target_missing_for,
            "critical",
            "Prometheus has no specobs scrape target at all.",
            "No target of job {{ $labels.job }} has been discovered for "
            f"{config.target_missing_for}: service discovery or the scrape config lost them.",
        ),
        AlertRule(
            AlertNames.EXPORTER_DROPPING_RECORDS,
            # A cycle the engine raised in is the engine's failure, not specobs losing data.
            f'({n.dropped}{{reason!="{c.DROP_REASON_EXCEPTION}"}} > 0)\n'
            f"/ on ({by}) group_left ()\n"
            f"({_rate(c.CYCLES.name, config, by)} > 0)\n"
            f"> {config.dropped_records_ratio:g}",
            config.dropped_records_for,
            "warning",
            "specobs is dropping cycle records, so its metrics undercount.",
            f"{where} drops {{{{ $value | humanizePercentage }}}} of cycles' records "
            "(reason {{ $labels.reason }}).",
        ),
        AlertRule(
            AlertNames.LOW_ACCEPTANCE_REQUESTS_JUMP,
            # The reference ends request_window ago, so it never holds the jump itself.
            f"({n.request_low_share} > {config.request_low_share_min:g})\n"
            f"> {config.request_low_share_ratio:g} * avg_over_time("
            f"{history_name(n.request_low_share, config)}[{config.history_window}] "
            f"offset {config.request_window})\n"
            f"and on ({by})\n"
            f"({n.requests_finished} >= {config.request_min_finished:d})",
            config.request_low_share_for,
            "warning",
            "The share of a server's requests with very low draft acceptance jumped.",
            f"{{{{ $value | humanizePercentage }}}} of the requests that finished on {where} in "
            f"the last {config.request_window} accepted at most "
            f"{config.request_acceptance_low:.0%} of their drafted tokens, over "
            f"{config.request_low_share_ratio:g}x that share in the {config.history_window} "
            "before: some requests (a slot, a tenant, a kind of prompt) collapsed, whatever the "
            "server's overall acceptance says.",
        ),
    ]


def _str_presenter(dumper: Any, data: str) -> Any:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


def dump_yaml(data: Any) -> str:
    """YAML with multi-line strings as literal blocks, keys in the order given."""
    # pyyaml (the ``gen`` extra) is imported here: fleet-sim reads the alert names of this
    # module without it.
    import yaml

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        pass

    Dumper.add_representer(str, _str_presenter)
    return str(yaml.dump(data, Dumper=Dumper, sort_keys=False, width=1000, allow_unicode=True))


_RANGE = re.compile(r"\b(?:rate|increase)\([^()\[]*\[([0-9a-z]+)\]\)")
_RULE_NAME = re.compile(r"\b(?:instance|cohort|host):[A-Za-z0-9_]+:[A-Za-z0-9_]+")


def _reads(expr: str) -> set[str]:
    """The recording rules an expression reads (every ``level:metric:operations`` name)."""
    return set(_RULE_NAME.findall(expr))


def history_rules(config: MixinConfig) -> list[RecordingRule]:
    """The recorded ``history_step`` averages the history alerts read (``_past``), in the order
    of :func:`recording_rules`; their own group is evaluated every ``history_step``."""
    read = {m for a in alert_rules(config) for m in _reads(a.expr)}
    return [
        RecordingRule(history_name(r.record, config),
                      f"avg_over_time({r.record}[{config.history_step}])")
        for r in recording_rules(config)
        if history_name(r.record, config) in read
    ]  # fmt: skip


def _closure(names: set[str], rules: dict[str, str]) -> frozenset[str]:
    wanted = {n for n in names if n in rules}
    while True:
        more = {m for name in wanted for m in _reads(rules[name]) if m in rules} - wanted
        if not more:
            return frozenset(wanted)
        wanted |= more


def alert_reads(config: MixinConfig) -> dict[str, frozenset[str]]:
    """Alert -> the recording rules it reads at its own evaluation, directly or through another
    recording rule. Not included, by design: a history alert's ``history_step`` averages
    (:func:`history_rules`), which it reads only ``history_offset`` in the past, so they may come
    from a group of their own, evaluated every ``history_step``."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    return {a.alert: _closure(_reads(a.expr), rules) for a in alert_rules(config)}


def alert_inputs(config: MixinConfig) -> frozenset[str]:
    """The recording rules some alert reads at its own evaluation (see :func:`alert_reads`)."""
    return frozenset().union(*alert_reads(config).values())


def alert_chain_links(config: MixinConfig) -> dict[str, int]:
    """Alert -> the recording rules on its longest chain from the raw series (0: it reads only
    raw series). A ruler that sees its own results only after writing them to the store
    (vmalert on VictoriaMetrics) sees each link one evaluation late."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    depth: dict[str, int] = {}
    for record, expr in rules.items():  # evaluation order: inputs come first
        depth[record] = 1 + max((depth[m] for m in _reads(expr) if m in rules), default=0)
    return {
        a.alert: max((depth[m] for m in _reads(a.expr) if m in rules), default=0)
        for a in alert_rules(config)
    }


def detection_seconds(
    config: MixinConfig,
    scrape_interval_seconds: float,
    evaluation_interval_seconds: float,
    *,
    link_seconds: float = 0.0,
) -> dict[str, float]:
    """Alert -> the latest it fires after a fault large enough to cross its threshold once the
    fault fills its window: one scrape until the fault is in a sample, the alert's window (the
    rate window when it reads a rate; ``stall_after`` for the stall alert; none for ``up``),
    one evaluation, then ``for``. ``link_seconds``: what each link of the chain to the raw
    series adds (:func:`alert_chain_links` plus one, the raw series' own way into the store);
    0 for Prometheus, whose rules read the rules of their own evaluation; for vmalert, its
    evaluation interval plus VictoriaMetrics' ``-search.latencyOffset``."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    reads = alert_reads(config)
    links = alert_chain_links(config)
    out = {}
    for a in alert_rules(config):
        exprs = [a.expr, *(rules[m] for m in reads[a.alert])]
        # The longest range a rate() or increase() reads (the rate window; the request window).
        window = max((duration_seconds(w) for e in exprs for w in _RANGE.findall(e)),
                     default=0.0)
        stall = re.search(r"time\(\) - \S+ <= ([0-9.]+)", a.expr)
        if stall:
            window = max(window, float(stall.group(1)))
        out[a.alert] = (
            scrape_interval_seconds + window + evaluation_interval_seconds
            + duration_seconds(a.for_) + (links[a.alert] + 1) * link_seconds
        )  # fmt: skip
    return out


#: Label values per server, for :func:`rule_cost` (the default phases; ``le`` comes from the
#: metric's buckets, an accept-length histogram has k + 2 of them, about 8).
_LABEL_VALUES = {"phase": 3, "clock": 2, "reason": len(c.DROP_REASONS), "position": 6}
_RAW_SELECTOR = re.compile(r"(?<![\w:])([a-z_][a-z0-9_]*)\{([^}]*)\}(\[[^\]]+\])?")


def _series_per_server(name: str, matchers: str) -> int:
    """How many series of one server a selector matches, from the catalog's labels."""
    metric = c.by_prometheus_name().get(name)
    if metric is None:  # up, the engines' own gauges
        return 1
    fixed = set(re.findall(r'([a-z_]+)="', matchers))
    n = 1
    for label in metric.labels:
        if label not in fixed:
            n *= _LABEL_VALUES.get(label, 1)
    if name.endswith("_bucket"):
        n *= len(metric.buckets) + 1 if metric.buckets else 8
    return n


def rule_cost(expr: str) -> int:
    """A rough cost of one evaluation, per server: series read through a range (``rate``) count
    20 (samples in 5 minutes at a 15 s scrape), series read at one instant and recording rules
    read count 1. It orders and packs the dashboards' rules; what a rule really costs is
    measured by benchmarks/fleet.py."""
    cost = 0
    for name, matchers, window in _RAW_SELECTOR.findall(expr):
        if name in ("by", "without", "on", "ignoring", "group_left", "group_right"):
            continue
        cost += _series_per_server(name, matchers) * (20 if window else 1)
    return cost + len(_reads(expr))


def _alert_components(config: MixinConfig) -> list[tuple[list[AlertRule], frozenset[str]]]:
    """Alerts joined into components: two alerts that read a common recording rule share one."""
    reads = alert_reads(config)
    components: list[tuple[list[AlertRule], frozenset[str]]] = []
    for alert in alert_rules(config):
        members, needs = [alert], reads[alert.alert]
        for other in [comp for comp in components if comp[1] & needs]:
            components.remove(other)
            members, needs = other[0] + members, other[1] | needs
        components.append((members, needs))
    order = {a.alert: i for i, a in enumerate(alert_rules(config))}
    return sorted(components, key=lambda comp: min(order[a.alert] for a in comp[0]))


def _kebab(alert: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", alert.removeprefix(ALERT_PREFIX)).lower()


def rule_groups(config: MixinConfig) -> dict[str, Any]:
    """The rule groups, which Prometheus (and vmalert) evaluate concurrently, each in rule order.

    *Alert groups*: the alerts split into components that share no recording rule, each group
    holding its alerts and, first, every recording rule they read. Rules of a group run in order
    at the same timestamp, so every alert reads the recording rules of its own evaluation
    (across groups it might read values one interval old, and detection times would wobble).
    The first is ``specobs``; the others are named after their first alert.
    ``specobs-history``, every ``history_step``: the averages the history alerts read
    ``history_offset`` in the past, deliberately from another group.
    ``specobs-dashboards`` (and ``-2``, ...): the recording rules only dashboards read, which may
    read the alert groups' series one interval old, packed by :func:`rule_cost` into as many
    groups as it takes for none to cost more than the costliest alert group.
    Split, the work of one evaluation runs on every core instead of one.
    """
    recording = recording_rules(config)
    groups: list[dict[str, Any]] = []
    alert_costs = []
    for i, (alerts, needs) in enumerate(_alert_components(config)):
        rules = [r for r in recording if r.record in needs]
        alert_costs.append(sum(rule_cost(r.expr) for r in rules)
                           + sum(rule_cost(a.expr) for a in alerts))  # fmt: skip
        groups.append({
            "name": "specobs" if i == 0 else f"specobs-{_kebab(alerts[0].alert)}",
            "rules": [{"record": r.record, "expr": r.expr} for r in rules]
            + [
                {
                    "alert": a.alert,
                    "expr": a.expr,
                    "for": a.for_,
                    "labels": {"severity": a.severity},
                    "annotations": {
                        "summary": a.summary,
                        "description": a.description,
                        "runbook_url": f"{config.runbook_base_url}#{a.anchor}",
                    },
                }
                for a in alerts
            ],
        })  # fmt: skip
    history = history_rules(config)
    if history:
        groups.append({
            "name": "specobs-history",
            "interval": config.history_step,
            "rules": [{"record": r.record, "expr": r.expr} for r in history],
        })  # fmt: skip
    inputs = alert_inputs(config)
    rest = [r for r in recording if r.record not in inputs]
    # Components of the dashboards' rules (a rule with the rules it reads), packed costliest
    # first into the group that costs least so far.
    exprs = {r.record: r.expr for r in rest}
    parts: list[set[str]] = []
    for r in rest:
        part = set(_closure({r.record}, exprs))
        for other in [p for p in parts if p & part]:
            parts.remove(other)
            part |= other
        parts.append(part)
    cost = {r.record: rule_cost(r.expr) for r in rest}
    budget = max(alert_costs, default=1)
    total = sum(cost.values())
    bins: list[set[str]] = [set() for _ in range(max(1, -(-total // budget)))]
    for part in sorted(parts, key=lambda p: (-sum(cost[n] for n in p), sorted(p))):
        min(bins, key=lambda b: sum(cost[n] for n in b)).update(part)
    for i, names in enumerate(b for b in bins if b):
        groups.append({
            "name": "specobs-dashboards" + (f"-{i + 1}" if i else ""),
            "rules": [{"record": r.record, "expr": r.expr} for r in rest if r.record in names],
        })  # fmt: skip
    return {"groups": groups}


def render(config: MixinConfig) -> str:
    """The rule file ``deploy/prometheus/rules/specobs-rules.yml``."""
    return f"# {generated_notice()}\n" + dump_yaml(rule_groups(config))
