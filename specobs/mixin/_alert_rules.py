"""The alerts as tables: one small builder per concern, each a list of :class:`AlertRule`
entries (alert, expression, for, severity, summary, description), in the order of
:class:`AlertNames`.

Descriptions are Go templates that Prometheus expands when an alert fires. Their pieces are the
plain strings below (:data:`PERCENT`, :func:`label`, ...), joined into the text; none is escaped
inside an f-string.
"""

from __future__ import annotations

from dataclasses import dataclass

import specobs.catalog as c
from specobs.mixin._config import MixinConfig, duration_seconds
from specobs.mixin._promql import history_name, past, rate, selector
from specobs.mixin._rule_names import AlertNames, AlertRule, RuleNames

__all__ = ["alert_rules"]

#: ``$value`` as Prometheus prints it in a description.
VALUE = "{{ $value }}"
PERCENT = "{{ $value | humanizePercentage }}"
DURATION = "{{ $value | humanizeDuration }}"


def printf(fmt: str) -> str:
    """``$value`` formatted by Go's ``printf`` (``%.1f``)."""
    return '{{ $value | printf "' + fmt + '" }}'


def label(name: str) -> str:
    """The alert's label ``name`` in a description."""
    return "{{ $labels." + name + " }}"


@dataclass(frozen=True)
class _Words:
    """The phrases many descriptions share, for one config."""

    where: str
    cohort: str
    history: str

    @classmethod
    def of(cls, config: MixinConfig) -> _Words:
        job = f"(job {label('job')})"
        return cls(
            where=f"{label('instance')} {job}",
            cohort=f"model {label(config.model_label)}, engine {label(config.engine_label)} {job}",
            history=f"its average over the {config.history_window} before the last "
                    f"{config.history_offset}",
        )


def _compare(rule: str, op: str, bound: str) -> str:
    """``rule op bound`` laid out over four lines."""
    return f"(\n  {rule}\n  {op} {bound}\n)"


def _unless_above(on: str, rule: str, bound: str) -> str:
    """Silence the alert where ``rule`` is above ``bound``: load, not a fault."""
    return f"unless on ({on})\n{_compare(rule, '>', bound)}"


def alert_rules(config: MixinConfig) -> list[AlertRule]:
    """Every alert. Where a ratio is only interesting above zero the numerator is filtered first
    (``dropped > 0``): the same result, but the division matches a handful of series, not one
    per server and reason."""
    n, words = RuleNames(config), _Words.of(config)
    return [
        *_acceptance_alerts(config, n, words),
        *_throughput_alerts(config, n, words),
        *_phase_alerts(config, n, words),
        *_liveness_alerts(config, n, words),
        *_data_alerts(config, n, words),
    ]


def _acceptance_alerts(config: MixinConfig, n: RuleNames, w: _Words) -> list[AlertRule]:
    """A server's acceptance against its cohort, and a cohort's against its past."""
    r, drop = config.cohort_ratio, config.acceptance_drop_ratio
    busy = f"and on ({config.by})\n({n.drafted} > {config.cohort_min_drafted_per_second:g})"
    median = f"on ({config.cohort_by}) group_left ()\n  {r:g} * {n.cohort_acceptance_median}"
    return [
        AlertRule(
            AlertNames.ACCEPTANCE_BELOW_COHORT,
            f"{_compare(n.acceptance, '<', median)}\n{busy}",
            config.cohort_for, "warning",
            "A server's draft acceptance is far below the other servers of its model and engine.",
            f"Acceptance on {w.where} is {PERCENT} of drafted tokens, below {r:.0%} of the "
            f"median server of {w.cohort}: a new pod with a broken or mismatched draft, or one "
            "bad server.",
        ),
        AlertRule(
            AlertNames.ACCEPTANCE_RATE_DROP,
            f"{n.cohort_acceptance}\n< {drop:g} * {past(n.cohort_acceptance, config)}",
            config.acceptance_drop_for, "warning",
            "A model's draft acceptance dropped across its servers against its recent past.",
            f"Acceptance of {w.cohort} over all its servers is {PERCENT} of drafted tokens, "
            f"below {drop:.0%} of {w.history}: a rollout or a traffic change that affects every "
            "server of the model.",
        ),
    ]


def _throughput_alerts(config: MixinConfig, n: RuleNames, w: _Words) -> list[AlertRule]:
    """Per-sequence speed against the cohort and against the past; speedup below baseline."""
    by, cby, r = config.by, config.cohort_by, config.cohort_ratio
    drop, tol = config.throughput_drop_ratio, config.batch_growth_tolerance
    busy = f"and on ({by})\n({n.drafted} > {config.cohort_min_drafted_per_second:g})"
    cohort_batch = f"on ({cby}) group_left ()\n  {tol:g} * {n.cohort_batch_median}"
    below_cohort = _compare(n.sequence_speed, "<",
                            f"on ({cby}) group_left ()\n  {r:g} * {n.cohort_speed_median}")
    cohort_drop = _compare(n.cohort_speed_median, "<",
                           f"{drop:g} * {past(n.cohort_speed_median, config)}")
    server_drop = _compare(n.sequence_speed, "<", f"{drop:g} * {past(n.sequence_speed, config)}")
    batch_grew = f"{tol:g} * {past(n.cohort_batch_median, config)}"
    return [
        AlertRule(
            AlertNames.DECODE_THROUGHPUT_BELOW_COHORT,
            f"{below_cohort}\n{_unless_above(by, n.batch_size_mean, cohort_batch)}\n{busy}",
            config.cohort_for, "warning",
            "A server decodes each sequence far slower than the other servers of its model.",
            f"Each sequence on {w.where} gains {printf('%.1f')} tokens/s, below {r:.0%} of the "
            f"median server of {w.cohort}, at a batch size no larger than {tol:g}x theirs.",
        ),
        AlertRule(
            AlertNames.COHORT_THROUGHPUT_DROP,
            f"{cohort_drop}\n{_unless_above(cby, n.cohort_batch_median, batch_grew)}",
            config.throughput_drop_for, "warning",
            "Per-sequence decode speed of a model dropped across its servers against its past.",
            f"The median server of {w.cohort} now gives each sequence {printf('%.1f')} "
            f"tokens/s, below {drop:.0%} of {w.history}, with no matching growth in batch "
            "size: a rollout that slowed every server of the model.",
        ),
        AlertRule(
            AlertNames.DECODE_THROUGHPUT_DROP,
            f"{server_drop}\n{_unless_above(by, n.emitted, past(n.emitted, config))}",
            config.throughput_drop_for, "warning",
            "Per-sequence decode speed dropped against the same server's recent past.",
            f"Each sequence on {w.where} now gains {printf('%.1f')} tokens/s, below "
            f"{drop:.0%} of {w.history}, while the server's total throughput did not rise (so "
            "this is not more load sharing the GPU).",
        ),
        AlertRule(
            AlertNames.SPECULATION_SLOWER_THAN_BASELINE,
            f"{n.speedup_realized} < {config.min_speedup:g}",
            config.slower_than_baseline_for, "warning",
            "Speculative decoding is slower than the non-speculative baseline.",
            f"Realized per-sequence speedup on {w.where} is {printf('%.2f')}x the "
            f"non-speculative baseline ({label('source')}; threshold {config.min_speedup:g}x).",
        ),
    ]


def _phase_alerts(config: MixinConfig, n: RuleNames, w: _Words) -> list[AlertRule]:
    """A phase's mean time against its cohort and against the server's past."""
    by, cby = config.by, config.cohort_by
    r, tol = config.phase_regression_ratio, config.batch_growth_tolerance
    above_cohort = _compare(n.phase_mean, ">", f"on ({cby}, phase, clock) group_left ()\n"
                                               f"  {r:g} * {n.cohort_phase_median}")
    cohort_batch = f"on ({cby}) group_left ()\n  {tol:g} * {n.cohort_batch_median}"
    regressed = _compare(n.phase_mean, ">", f"{r:g} * {past(n.phase_mean, config)}")
    batch_grew = f"{tol:g} * {past(n.batch_size_mean, config)}"
    phase = f"The {label('phase')} phase on {w.where}"
    clock = f"{DURATION} per cycle ({label('clock')} clock)"
    return [
        AlertRule(
            AlertNames.PHASE_LATENCY_ABOVE_COHORT,
            f"{above_cohort}\n{_unless_above(by, n.batch_size_mean, cohort_batch)}",
            config.cohort_for, "warning",
            "A phase takes far longer on one server than on the other servers of its model.",
            f"{phase} takes {clock}, more than {r:g}x the median server of {w.cohort}, at a "
            f"batch size no larger than {tol:g}x theirs.",
        ),
        AlertRule(
            AlertNames.PHASE_LATENCY_REGRESSION,
            f"{regressed}\n{_unless_above(by, n.batch_size_mean, batch_grew)}",
            config.phase_regression_for, "warning",
            "A speculative decoding phase got slower against the same server's recent past.",
            f"{phase} now takes {clock}, more than {r:g}x {w.history}, with no matching growth "
            "in batch size.",
        ),
    ]


def _liveness_alerts(config: MixinConfig, n: RuleNames, w: _Words) -> list[AlertRule]:
    """A stalled engine, an exporter Prometheus cannot scrape, no target at all."""
    hby, up = config.host_by, selector("up", config.selector)
    stall = duration_seconds(config.stall_after)
    return [
        AlertRule(
            AlertNames.DECODING_STALLED,
            f"{n.host_requests} > 0\nand on ({hby})\n({n.host_up} == 1)\nunless on ({hby})\n"
            f"(time() - {n.host_last_cycle} <= {stall:g})",
            config.stall_for, "critical",
            "Requests are waiting or running but no speculative decoding cycle completes.",
            f"Host {label('host')} has {VALUE} requests running or waiting (the engine's own "
            f"gauges) and its specobs exporter saw no cycle end in the last {config.stall_after}.",
        ),
        AlertRule(
            AlertNames.EXPORTER_DOWN,
            f"{up} == 0",
            config.exporter_down_for, "critical",
            "Prometheus cannot scrape a specobs exporter.",
            f"The specobs endpoint {w.where} has failed every scrape for "
            f"{config.exporter_down_for}.",
        ),
        AlertRule(
            AlertNames.TARGET_MISSING,
            f"absent({up})",
            config.target_missing_for, "critical",
            "Prometheus has no specobs scrape target at all.",
            f"No target of job {label('job')} has been discovered for "
            f"{config.target_missing_for}: service discovery or the scrape config lost them.",
        ),
    ]


def _data_alerts(config: MixinConfig, n: RuleNames, w: _Words) -> list[AlertRule]:
    """Records specobs drops, and a jump in the requests that accept almost nothing."""
    by = config.by
    # A cycle the engine raised in is the engine's failure, not specobs losing data.
    dropped = selector(n.dropped, f'reason!="{c.DROP_REASON_EXCEPTION}"')
    # The reference ends request_window ago, so it never holds the jump itself.
    reference = (f"avg_over_time({history_name(n.request_low_share, config)}"
                 f"[{config.history_window}] offset {config.request_window})")
    return [
        AlertRule(
            AlertNames.EXPORTER_DROPPING_RECORDS,
            f"({dropped} > 0)\n/ on ({by}) group_left ()\n"
            f"({rate(c.CYCLES.name, config, by)} > 0)\n> {config.dropped_records_ratio:g}",
            config.dropped_records_for, "warning",
            "specobs is dropping cycle records, so its metrics undercount.",
            f"{w.where} drops {PERCENT} of cycles' records (reason {label('reason')}).",
        ),
        AlertRule(
            AlertNames.LOW_ACCEPTANCE_REQUESTS_JUMP,
            f"({n.request_low_share} > {config.request_low_share_min:g})\n"
            f"> {config.request_low_share_ratio:g} * {reference}\nand on ({by})\n"
            f"({n.requests_finished} >= {config.request_min_finished:d})",
            config.request_low_share_for, "warning",
            "The share of a server's requests with very low draft acceptance jumped.",
            f"{PERCENT} of the requests that finished on {w.where} in the last "
            f"{config.request_window} accepted at most {config.request_acceptance_low:.0%} of "
            f"their drafted tokens, over {config.request_low_share_ratio:g}x that share in the "
            f"{config.history_window} before: some requests (a slot, a tenant, a kind of "
            "prompt) collapsed, whatever the server's overall acceptance says.",
        ),
    ]
