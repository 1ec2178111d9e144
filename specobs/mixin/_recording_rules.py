"""The recording rules as tables: one small builder per concern, each a list of
:class:`RecordingRule` entries (record, expression), in evaluation order.

Every ratio divides by ``(denominator > 0)``: an idle server or a clock with no sample (the GPU
clock on a CPU, or between sampled cycles) has no series instead of a stored NaN, so a
dashboard's "or" fallback and its "No traffic" text work.
"""

from __future__ import annotations

import specobs.catalog as c
from specobs.mixin import _engines
from specobs.mixin._config import MixinConfig
from specobs.mixin._promql import (
    baseline_expr,
    engine_rule_expr,
    histogram_mean,
    on_host,
    plugin_or_engine,
    rate,
    ratio,
    request_low_share_expr,
    selector,
)
from specobs.mixin._rule_names import (
    ALERT_PREFIX,
    ENGINE_REQUEST_GAUGES,
    RecordingRule,
    RuleNames,
)

__all__ = ["recording_rules"]

R = RecordingRule
HOST = 'clock="host"'


def recording_rules(config: MixinConfig) -> list[RecordingRule]:
    """Every recording rule, in evaluation order (later rules read earlier ones)."""
    n = RuleNames(config)
    return [
        *_fleet_counters(config, n),
        *_per_sequence(config, n),
        *_cycle_time(config, n),
        *_speedup(config, n),
        *_exporter(config, n),
        *_cohorts(config, n),
        *_hosts_and_requests(config, n),
    ]


def _fleet_counters(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """Up, the engines' own series normalised, and the fleet counters' rates: from the
    plugin's counter, else from the engine's quantity."""
    by, e = config.by, n.engine
    # Sequence-cycles: an engine's drafts (verify steps of one sequence) are the same count.
    counted = (
        (n.emitted, c.EMITTED_TOKENS.name, "emitted_tokens"),
        (n.drafted, c.DRAFT_TOKENS.name, "draft_tokens"),
        (n.accepted, c.ACCEPTED_TOKENS.name, "accepted_tokens"),
        (n.sequences, f"{c.BATCH_SIZE.name}_sum", "drafts"),
    )
    by_position = ratio(rate(c.ACCEPTED_BY_POSITION.name, config, f"{by}, position"),
                        rate(c.DRAFTED_BY_POSITION.name, config, f"{by}, position"))
    return [
        R(n.up, f"max by ({by}) ({selector('up', config.selector)})"),
        *(R(e[q.key], engine_rule_expr(config, q.key)) for q in _engines.QUANTITIES),
        R(n.cycles, rate(c.CYCLES.name, config, by)),
        *(R(record, plugin_or_engine(rate(plugin, config, by), e[quantity]))
          for record, plugin, quantity in counted),
        R(n.acceptance_by_position, plugin_or_engine(by_position, e["acceptance_by_position"])),
    ]


def _per_sequence(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """Acceptance, tokens per sequence-cycle, the batch, the k in effect, accept length."""
    by = config.by
    excl_bonus = plugin_or_engine(histogram_mean(c.ACCEPT_LENGTH.name, config, by),
                                  f"{n.engine['accept_length_incl_bonus']} - 1")
    return [
        R(n.acceptance, ratio(n.accepted, n.drafted)),
        R(n.emitted_per_sequence, ratio(n.emitted, n.sequences)),
        R(n.drafted_per_sequence, ratio(n.drafted, n.sequences)),
        R(n.batch_size_mean, ratio(n.sequences, n.cycles)),
        # The k in effect (engines change it at run time): the fleet table's "Mean k".
        R(n.draft_length_mean, histogram_mean(c.DRAFT_LENGTH.name, config, by)),
        R(n.accept_length_excl_bonus, excl_bonus),
        # vLLM's dashboards show 1 + accepted / drafts: the target's bonus token included.
        R(n.accept_length_incl_bonus, f"1 + {n.accept_length_excl_bonus}"),
    ]


def _cycle_time(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """The cycle's time, the gaps between cycles, and the phases."""
    by = config.by
    gap_sum = rate(f"{c.CYCLE_GAP.name}_sum", config, by)
    busy = f"(\n  {gap_sum}\n  +\n  {rate(f'{c.CYCLE_DURATION.name}_sum', config, by, HOST)}\n)"
    return [
        # The host clock only: the per-sequence speed, and through it the throughput and
        # baseline alerts, reads nothing else. The tools compute both clocks' means from the
        # raw counters.
        R(n.cycle_mean, histogram_mean(c.CYCLE_DURATION.name, config, f"{by}, clock", HOST)),
        # The host clock only (every cycle): what the fleet table, outliers and heatmap show.
        # Both clocks' buckets per server would be the costliest rule of a large fleet; the
        # GPU clock's quantiles are on the cycle breakdown, from the raw histogram.
        R(n.cycle_bucket,
          rate(f"{c.CYCLE_DURATION.name}_bucket", config, f"{by}, clock, le", HOST)),
        # ">= 0" drops the NaN histogram_quantile returns when no cycle fell in the window.
        R(n.cycle_p99, f"histogram_quantile(0.99, {n.cycle_bucket}) >= 0"),
        # The engine's time outside cycles (scheduler, detokenisation, Python between steps):
        # the mean gap from a cycle's end to its thread's next begin, idle gaps left out, and
        # the gaps' share of the time the engine was busy (gaps plus host cycle time).
        R(n.gap_mean, histogram_mean(c.CYCLE_GAP.name, config, by)),
        R(n.gap_share, ratio(gap_sum, busy)),
        # The GPU clock exists only on sampled cycles, so each clock's mean is its own
        # rate(sum) / rate(count); never divide GPU time by the count of all cycles.
        R(n.phase_mean, histogram_mean(c.PHASE_DURATION.name, config, f"{by}, phase, clock")),
        R(n.phase_share, f"{n.phase_mean}\n/ ignoring (phase) group_left ()\n"
                         f"(sum without (phase) ({n.phase_mean}) > 0)"),
    ]


def _speedup(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """Per-sequence speed, the baseline, and the realized and predicted speedups."""
    by = config.by
    host_cycle = selector(n.cycle_mean, HOST)
    # The cost model at the measured point, on each clock: the tokens acceptance gives one
    # sequence per cycle (1 + accepted) times a plain step's cost (1 / the baseline) over the
    # cycle's cost (draft + verify + bookkeeping). docs/metrics.md states what it leaves out.
    predicted = (
        f"(\n  (1 + {n.accepted} / ({n.sequences} > 0))\n  / on ({by})\n"
        f"  max by ({by}) ({n.baseline} > 0)\n)\n"
        f"/ on ({by}) group_right ()\n"
        f"(sum without (phase) ({n.phase_mean}) > 0)"
    )
    # Realized over wall time (the time between cycles counted) over predicted on the host
    # clock: 1 while the model holds. Below 1 the difference is time between cycles, cycle
    # time outside the phases, or tokens acceptance promised that were not emitted.
    calibration = (
        f"{n.speedup_realized}\n* on ({by}) group_left ()\n"
        f"((1 - {n.gap_share}) or (0 * {n.cycles} + 1))\n"
        f"/ on ({by}) group_left ()\n"
        f"({selector(n.speedup_predicted, HOST)} > 0)"
    )
    return [
        # Per-sequence speed: tokens one sequence gains per cycle over wall-clock cycle time.
        # Unlike tokens/s it does not fall when fewer requests arrive.
        R(n.sequence_speed, f"{n.emitted_per_sequence}\n/ on ({by})\n({host_cycle} > 0)"),
        # The baseline keeps where it came from: an engine that measures its own labels it
        # (source="demo_measured"); a configured one has no label and is called "configured".
        R(n.baseline, baseline_expr(config)),
        R(n.speedup_realized,
          f"{n.sequence_speed}\n/ on ({by}) group_left (source)\n({n.baseline} > 0)"),
        R(n.speedup_predicted, predicted),
        R(n.speedup_calibration, calibration),
    ]


def _exporter(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """specobs's own health: drops, the GPU-sampled share, the last cycle, firing alerts."""
    by, sel = config.by, config.selector
    firing = selector("ALERTS", f'alertstate="firing", alertname=~"{ALERT_PREFIX}.*", {sel}')
    join = ", ".join((*config.group_labels, "job", "instance"))
    last_cycle = selector(c.LAST_CYCLE_TIMESTAMP.name, sel)
    return [
        R(n.dropped, rate(c.DROPPED_RECORDS.name, config, f"{by}, reason")),
        R(n.sampled_ratio, ratio(rate(c.SAMPLED_CYCLES.name, config, by), n.cycles)),
        R(n.last_cycle_age, f"time() - max by ({by}) ({last_cycle})"),
        R(n.alerts_firing, f"count by ({by}) ({firing})\nor on ({join})\n0 * {n.up}"),
    ]


def _cohorts(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """Cohorts: the servers of one model and engine, wherever and however long they run."""
    cby = config.cohort_by
    return [
        R(n.cohort_servers, f"count by ({cby}) ({n.cycles} > 0)"),
        R(n.cohort_emitted, f"sum by ({cby}) ({n.emitted})"),
        R(n.cohort_acceptance,
          ratio(f"sum by ({cby}) ({n.accepted})", f"sum by ({cby}) ({n.drafted})")),
        R(n.cohort_acceptance_median, f"quantile by ({cby}) (0.5, {n.acceptance})"),
        R(n.cohort_speed_median, f"quantile by ({cby}) (0.5, {n.sequence_speed})"),
        R(n.cohort_batch_median, f"quantile by ({cby}) (0.5, {n.batch_size_mean})"),
        R(n.cohort_phase_median, f"quantile by ({cby}, phase, clock) (0.5, {n.phase_mean})"),
        # The fleet heatmaps: bucket rates summed per cohort, far fewer series than per
        # server; the cycle time on the host clock.
        R(n.cohort_cycle_bucket, f"sum by ({cby}, clock, le) ({n.cycle_bucket})"),
        R(n.cohort_accept_length_bucket,
          rate(f"{c.ACCEPT_LENGTH.name}_bucket", config, f"{cby}, le")),
    ]


def _hosts_and_requests(config: MixinConfig, n: RuleNames) -> list[RecordingRule]:
    """Hosts: the engine's own request gauges joined with specobs's series of the same host;
    then finished requests over their own window."""
    hby, sel = config.host_by, config.selector
    gauges = f'__name__=~"{"|".join(ENGINE_REQUEST_GAUGES)}"'
    engine_sel = ", ".join(m for m in (gauges, config.engine_selector) if m)
    own = f'__name__=~"{c.REQUESTS_RUNNING.name}|{c.REQUESTS_WAITING.name}", {sel}'
    requests = (f"max by ({hby}) (\n  {on_host(selector('', engine_sel))}\n  or\n"
                f"  {on_host(selector('', own))}\n)")
    finished = selector(c.REQUESTS_FINISHED.name, sel)
    return [
        R(n.host_up, f"max by ({hby}) ({on_host(selector('up', sel))})"),
        R(n.host_requests, requests),
        R(n.host_last_cycle,
          f"max by ({hby}) ({on_host(selector(c.LAST_CYCLE_TIMESTAMP.name, sel))})"),
        R(n.request_low_share, request_low_share_expr(config, config.by)),
        R(n.requests_finished,
          f"sum by ({config.by}) (increase({finished}[{config.request_window}]))"),
    ]
