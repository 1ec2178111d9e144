"""Prometheus recording and alert rules, generated from the catalog and a :class:`MixinConfig`.

Recording rules are named ``level:metric:operations``. Every ``instance:`` rule aggregates to one
series per server (``job, instance`` plus the model and engine constant labels), so the fleet
dashboard and the alerts read a handful of precomputed series instead of raw histograms.

Alerts are CamelCase with the prefix ``Specobs``; each has a ``severity`` label, a static
``summary``, a templated ``description`` and a ``runbook_url`` into docs/runbook.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from specobs import catalog as c
from specobs.mixin._config import MixinConfig

__all__ = ["AlertRule", "RecordingRule", "RuleNames", "alert_rules", "recording_rules", "render"]

ALERT_PREFIX = "Specobs"


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


class RuleNames:
    """The recording rule names for one config (the window is part of every rate rule's name)."""

    def __init__(self, config: MixinConfig) -> None:
        w = config.rate_window
        self.cycles = f"instance:{c.CYCLES.base_name}:rate{w}"
        self.emitted = f"instance:{c.EMITTED_TOKENS.base_name}:rate{w}"
        self.drafted = f"instance:{c.DRAFT_TOKENS.base_name}:rate{w}"
        self.accepted = f"instance:{c.ACCEPTED_TOKENS.base_name}:rate{w}"
        self.sequences = f"instance:{c.BATCH_SIZE.name}_sum:rate{w}"
        self.acceptance = f"instance:specobs_acceptance:ratio_rate{w}"
        self.accept_length_mean = f"instance:{c.ACCEPT_LENGTH.name}:mean_rate{w}"
        self.accept_length_bucket = f"instance:{c.ACCEPT_LENGTH.name}_bucket:rate{w}"
        self.batch_size_mean = f"instance:{c.BATCH_SIZE.name}:mean_rate{w}"
        self.emitted_per_sequence = f"instance:specobs_emitted_tokens_per_sequence:ratio_rate{w}"
        self.drafted_per_sequence = f"instance:specobs_draft_tokens_per_sequence:ratio_rate{w}"
        self.cycle_mean = f"instance:{c.CYCLE_DURATION.name}:mean_rate{w}"
        self.cycle_bucket = f"instance:{c.CYCLE_DURATION.name}_bucket:rate{w}"
        self.cycle_p99 = f"instance:{c.CYCLE_DURATION.name}:p99_rate{w}"
        self.phase_mean = f"instance:{c.PHASE_DURATION.name}:mean_rate{w}"
        self.phase_share = f"instance:{c.PHASE_DURATION.name}:share_rate{w}"
        self.sequence_speed = f"instance:specobs_sequence_tokens_per_second:rate{w}"
        self.speedup_realized = f"instance:specobs_speedup:realized_rate{w}"
        self.speedup_predicted = f"instance:specobs_speedup:predicted_rate{w}"
        self.dropped = f"instance:{c.DROPPED_RECORDS.base_name}:rate{w}"
        self.sampled_ratio = f"instance:{c.SAMPLED_CYCLES.base_name}:ratio_rate{w}"
        self.up = "instance:specobs_up:max"
        self.last_cycle_age = f"instance:{c.LAST_CYCLE_TIMESTAMP.name}:age"
        self.alerts_firing = "instance:specobs_alerts:count_firing"


def _rate(metric: str, config: MixinConfig, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{config.selector}}}[{config.rate_window}]))"


def recording_rules(config: MixinConfig) -> list[RecordingRule]:
    """Every recording rule, in evaluation order (later rules read earlier ones)."""
    n = RuleNames(config)
    by = config.by
    sel = config.selector

    def ratio(num: str, den: str) -> str:
        return f"{num}\n/\n{den}"

    phases = f'phase=~"{config.draft_phase}|{config.verify_phase}"'
    return [
        RecordingRule(n.up, f"max by ({by}) (up{{{sel}}})"),
        RecordingRule(n.cycles, _rate(c.CYCLES.name, config, by)),
        RecordingRule(n.emitted, _rate(c.EMITTED_TOKENS.name, config, by)),
        RecordingRule(n.drafted, _rate(c.DRAFT_TOKENS.name, config, by)),
        RecordingRule(n.accepted, _rate(c.ACCEPTED_TOKENS.name, config, by)),
        RecordingRule(n.sequences, _rate(f"{c.BATCH_SIZE.name}_sum", config, by)),
        RecordingRule(n.acceptance, f"{n.accepted}\n/\n{n.drafted}"),
        RecordingRule(n.emitted_per_sequence, f"{n.emitted}\n/\n{n.sequences}"),
        RecordingRule(n.drafted_per_sequence, f"{n.drafted}\n/\n{n.sequences}"),
        RecordingRule(n.batch_size_mean, f"{n.sequences}\n/\n{n.cycles}"),
        RecordingRule(
            n.accept_length_mean,
            ratio(
                _rate(f"{c.ACCEPT_LENGTH.name}_sum", config, by),
                _rate(f"{c.ACCEPT_LENGTH.name}_count", config, by),
            ),
        ),
        RecordingRule(
            n.accept_length_bucket, _rate(f"{c.ACCEPT_LENGTH.name}_bucket", config, f"{by}, le")
        ),
        RecordingRule(
            n.cycle_mean,
            ratio(
                _rate(f"{c.CYCLE_DURATION.name}_sum", config, f"{by}, clock"),
                _rate(f"{c.CYCLE_DURATION.name}_count", config, f"{by}, clock"),
            ),
        ),
        RecordingRule(
            n.cycle_bucket, _rate(f"{c.CYCLE_DURATION.name}_bucket", config, f"{by}, clock, le")
        ),
        RecordingRule(n.cycle_p99, f"histogram_quantile(0.99, {n.cycle_bucket})"),
        # The GPU clock exists only on sampled cycles, so each clock's mean is its own
        # rate(sum) / rate(count); never divide GPU time by the count of all cycles.
        RecordingRule(
            n.phase_mean,
            ratio(
                _rate(f"{c.PHASE_DURATION.name}_sum", config, f"{by}, phase, clock"),
                _rate(f"{c.PHASE_DURATION.name}_count", config, f"{by}, phase, clock"),
            ),
        ),
        RecordingRule(
            n.phase_share,
            f"{n.phase_mean}\n/ ignoring (phase) group_left\nsum without (phase) ({n.phase_mean})",
        ),
        # Per-sequence speed: tokens one sequence gains per cycle over wall-clock cycle time.
        # Unlike tokens/s it does not fall when fewer requests arrive.
        RecordingRule(
            n.sequence_speed,
            f'{n.emitted_per_sequence}\n/ on ({by})\n{n.cycle_mean}{{clock="host"}}',
        ),
        RecordingRule(
            n.speedup_realized,
            f"{n.sequence_speed}\n/ on ({by})\n"
            f"max by ({by}) ({c.BASELINE_SEQUENCE_TOKENS.name}{{{sel}}})",
        ),
        # Leviathan et al.: expected tokens per cycle (1 - a^(k+1)) / (1 - a) for acceptance a and
        # draft length k, divided by the cycle's cost in target steps, (draft + verify) / verify.
        RecordingRule(
            n.speedup_predicted,
            f"(\n  (1 - {n.acceptance} ^ ({n.drafted_per_sequence} + 1))\n"
            f"  /\n  (1 - {n.acceptance})\n)\n"
            f"* on ({by}) group_right ()\n(\n"
            f'  sum without (phase) ({n.phase_mean}{{phase="{config.verify_phase}"}})\n'
            f"  /\n  sum without (phase) ({n.phase_mean}{{{phases}}})\n)",
        ),
        RecordingRule(n.dropped, _rate(c.DROPPED_RECORDS.name, config, f"{by}, reason")),
        RecordingRule(
            n.sampled_ratio,
            ratio(_rate(c.SAMPLED_CYCLES.name, config, by), n.cycles),
        ),
        RecordingRule(
            n.last_cycle_age, f"time() - max by ({by}) ({c.LAST_CYCLE_TIMESTAMP.name}{{{sel}}})"
        ),
        RecordingRule(
            n.alerts_firing,
            f'count by ({by}) (ALERTS{{alertstate="firing", alertname=~"{ALERT_PREFIX}.*", {sel}}})'
            f"\nor on (job, instance)\n0 * {n.up}",
        ),
    ]


def _past(expr: str, config: MixinConfig) -> str:
    return f"avg_over_time({expr}[{config.history_window}] offset {config.history_offset})"


def alert_rules(config: MixinConfig) -> list[AlertRule]:
    n = RuleNames(config)
    by = config.by
    sel = config.selector
    w = config.rate_window
    where = "{{ $labels.instance }} (job {{ $labels.job }})"
    history = (
        f"its average over the {config.history_window} before the last {config.history_offset}"
    )
    return [
        AlertRule(
            f"{ALERT_PREFIX}DecodeThroughputDrop",
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
            f"{ALERT_PREFIX}AcceptanceRateDrop",
            f"{n.acceptance}\n< {config.acceptance_drop_ratio:g} * {_past(n.acceptance, config)}",
            config.acceptance_drop_for,
            "warning",
            "The draft model's acceptance rate dropped against the same server's recent past.",
            f"Acceptance on {where} is {{{{ $value | humanizePercentage }}}} of drafted tokens, "
            f"below {config.acceptance_drop_ratio:.0%} of {history}.",
        ),
        AlertRule(
            f"{ALERT_PREFIX}SpeculationSlowerThanBaseline",
            f"{n.speedup_realized} < {config.min_speedup:g}",
            config.slower_than_baseline_for,
            "warning",
            "Speculative decoding is slower than the configured non-speculative baseline.",
            f"Realized per-sequence speedup on {where} is "
            f'{{{{ $value | printf "%.2f" }}}}x the configured non-speculative baseline '
            f"(threshold {config.min_speedup:g}x).",
        ),
        AlertRule(
            f"{ALERT_PREFIX}PhaseLatencyRegression",
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
            f"{ALERT_PREFIX}DecodingStalled",
            f"(\n  sum by ({by}) ({c.REQUESTS_WAITING.name}{{{sel}}}) > 0\n  or\n"
            f"  sum by ({by}) ({c.REQUESTS_RUNNING.name}{{{sel}}}) > 0\n)\n"
            f"unless on ({by})\n"
            f"(\n  sum by ({by}) (rate({c.CYCLES.name}{{{sel}}}[{w}])) > 0\n)",
            config.stall_for,
            "critical",
            "Requests are waiting or running but no speculative decoding cycle completes.",
            f"{where} reports {{{{ $value }}}} requests waiting or running and completed no "
            f"cycle in the last {w}.",
        ),
        AlertRule(
            f"{ALERT_PREFIX}ExporterDown",
            f"up{{{sel}}} == 0",
            config.exporter_down_for,
            "critical",
            "Prometheus cannot scrape a specobs exporter.",
            f"The specobs endpoint {where} has failed every scrape for {config.exporter_down_for}.",
        ),
        AlertRule(
            f"{ALERT_PREFIX}TargetMissing",
            f"absent(up{{{sel}}})",
            config.target_missing_for,
            "critical",
            "Prometheus has no specobs scrape target at all.",
            "No target of job {{ $labels.job }} has been discovered for "
            f"{config.target_missing_for}: service discovery or the scrape config lost them.",
        ),
        AlertRule(
            f"{ALERT_PREFIX}ExporterDroppingRecords",
            f"{n.dropped}\n/ on ({by}) group_left\n{n.cycles}\n> {config.dropped_records_ratio:g}",
            config.dropped_records_for,
            "warning",
            "specobs is dropping cycle records, so its metrics undercount.",
            f"{where} drops {{{{ $value | humanizePercentage }}}} of cycles' records "
            "(reason {{ $labels.reason }}).",
        ),
    ]


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def dump_yaml(data: Any) -> str:
    """YAML with multi-line strings as literal blocks, keys in the order given."""
    return str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True))


def rule_groups(config: MixinConfig) -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": "specobs.rules",
                "rules": [{"record": r.record, "expr": r.expr} for r in recording_rules(config)],
            },
            {
                "name": "specobs.alerts",
                "rules": [
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
                    for a in alert_rules(config)
                ],
            },
        ]
    }


def render(config: MixinConfig) -> str:
    """The rule file ``deploy/prometheus/rules/specobs-rules.yml``."""
    header = "# Generated by `specobs generate` from specobs/mixin; do not edit by hand.\n"
    return header + dump_yaml(rule_groups(config))
