"""``promtool test rules`` cases for the generated rules: for every alert one that fires and at
least one that must not (a load drop must not look like a throughput drop).

The cases are synthetic servers described as a timeline of steady :class:`ServerState` segments,
one sample a minute; counters are integrated from the rates, so every input is self-consistent.
They assume the default thresholds and windows of :class:`MixinConfig` (``RULE_FIELDS``), which is
why :func:`render` returns ``None`` for a config that changes any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from specobs import catalog as c
from specobs.mixin._config import RULE_FIELDS, MixinConfig
from specobs.mixin._rules import AlertRule, RuleNames, alert_rules, dump_yaml

__all__ = ["ServerState", "render"]

RULES_FILE = "specobs-rules.yml"
LABELS = {"job": "specobs", "instance": "gpu-0:9477", "model": "llama-3-8b"}


@dataclass(frozen=True)
class ServerState:
    """One steady stretch of a synthetic server; rates are per second."""

    cycles_per_second: float = 100.0
    batch_size: float = 8.0
    emitted_per_sequence: float = 3.0  # tokens per sequence per cycle
    draft_per_sequence: float = 4.0
    acceptance: float = 0.5
    cycle_seconds: float = 0.01  # host clock
    phase_gpu_seconds: dict[str, float] = field(
        default_factory=lambda: {"draft": 0.002, "verify": 0.006, "bookkeeping": 0.001}
    )
    baseline: float | None = 100.0
    waiting: float = 0.0
    running: float = 8.0
    up: float = 1.0
    dropped_per_second: float = 0.0


def _fmt(value: float) -> str:
    text = f"{value:.10g}"
    return text


def _notation(values: list[float]) -> str:
    """Compress per-minute samples into promtool's ``a+bxn`` runs."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        start = values[i]
        if i + 1 == len(values):
            parts.append(_fmt(start))
            break
        step = values[i + 1] - values[i]
        n = 1
        while i + n + 1 < len(values) and abs(values[i + n + 1] - values[i + n] - step) < 1e-9:
            n += 1
        sign = "+" if step >= 0 else "-"
        parts.append(f"{_fmt(start)}{sign}{_fmt(abs(step))}x{n}")
        i += n + 1
    return " ".join(parts)


def _timeline(segments: list[tuple[ServerState, int]]) -> list[ServerState]:
    minutes: list[ServerState] = []
    for state, duration_minutes in segments:
        minutes.extend([state] * duration_minutes)
    return minutes


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def server_series(
    segments: list[tuple[ServerState, int]], labels: dict[str, str] = LABELS
) -> list[dict[str, str]]:
    """Every input series of one server over the timeline (sample at minute 0 is all zeros)."""
    minutes = _timeline(segments)
    series: dict[str, list[float]] = {}

    def counter(key: str, per_second: list[float]) -> None:
        total, values = 0.0, [0.0]
        for rate in per_second:
            total += rate * 60.0
            values.append(total)
        series[key] = values

    def gauge(key: str, values: list[float | None]) -> None:
        if all(v is not None for v in values):
            series[key] = [float(v) for v in [values[0], *values] if v is not None]

    cycles = [s.cycles_per_second for s in minutes]
    sequences = [s.cycles_per_second * s.batch_size for s in minutes]
    drafted = [q * s.draft_per_sequence for q, s in zip(sequences, minutes, strict=True)]
    counter(_selector(c.CYCLES.name, labels), cycles)
    counter(_selector(f"{c.BATCH_SIZE.name}_sum", labels), sequences)
    counter(_selector(f"{c.BATCH_SIZE.name}_count", labels), cycles)
    counter(
        _selector(c.EMITTED_TOKENS.name, labels),
        [q * s.emitted_per_sequence for q, s in zip(sequences, minutes, strict=True)],
    )
    counter(_selector(c.DRAFT_TOKENS.name, labels), drafted)
    counter(
        _selector(c.ACCEPTED_TOKENS.name, labels),
        [d * s.acceptance for d, s in zip(drafted, minutes, strict=True)],
    )
    host = {**labels, "clock": "host"}
    counter(
        _selector(f"{c.CYCLE_DURATION.name}_sum", host),
        [s.cycles_per_second * s.cycle_seconds for s in minutes],
    )
    counter(_selector(f"{c.CYCLE_DURATION.name}_count", host), cycles)
    for phase in minutes[0].phase_gpu_seconds:
        gpu = {**labels, "phase": phase, "clock": "gpu"}
        counter(
            _selector(f"{c.PHASE_DURATION.name}_sum", gpu),
            [s.cycles_per_second * s.phase_gpu_seconds[phase] for s in minutes],
        )
        counter(_selector(f"{c.PHASE_DURATION.name}_count", gpu), cycles)
    counter(
        _selector(c.DROPPED_RECORDS.name, {**labels, "reason": "queue_full"}),
        [s.dropped_per_second for s in minutes],
    )
    gauge(_selector(c.BASELINE_SEQUENCE_TOKENS.name, labels), [s.baseline for s in minutes])
    gauge(_selector(c.REQUESTS_WAITING.name, labels), [s.waiting for s in minutes])
    gauge(_selector(c.REQUESTS_RUNNING.name, labels), [s.running for s in minutes])
    target = {"job": labels["job"], "instance": labels["instance"]}
    gauge(_selector("up", target), [s.up for s in minutes])
    return [{"series": k, "values": _notation(v)} for k, v in series.items()]


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.(\w+)|value)[^}]*\}\}")


def _expand(template: str, labels: dict[str, str], value: str) -> str:
    def sub(match: re.Match[str]) -> str:
        return labels.get(match.group(2), "") if match.group(2) else value

    return _TEMPLATE.sub(sub, template)


@dataclass(frozen=True)
class _Case:
    """One promtool test: a timeline, and per eval time the alerts expected (value as printed)."""

    name: str
    alert: str
    input_series: list[dict[str, str]]
    checks: list[tuple[str, list[tuple[dict[str, str], str]]]]


def _expected(
    alert: AlertRule, config: MixinConfig, alerts: list[tuple[dict[str, str], str]]
) -> list[dict[str, Any]]:
    out = []
    for labels, value in alerts:
        all_labels = {**labels, "severity": alert.severity}
        out.append(
            {
                "exp_labels": all_labels,
                "exp_annotations": {
                    "summary": alert.summary,
                    "description": _expand(alert.description, all_labels, value),
                    "runbook_url": f"{config.runbook_base_url}#{alert.anchor}",
                },
            }
        )
    return out


def _cases() -> list[_Case]:
    healthy = ServerState()
    hour = 60
    # Everything slower per cycle: cycle time doubles, so does nothing else.
    slow = replace(healthy, cycles_per_second=50.0, cycle_seconds=0.02)
    # Fewer requests: smaller batches and slightly faster cycles; tokens/s falls by 69%.
    load_drop = replace(healthy, batch_size=2.0, cycles_per_second=125.0, cycle_seconds=0.008)
    # More requests: bigger batches and slower cycles; each sequence is slower, the server faster.
    load_rise = replace(healthy, batch_size=32.0, cycles_per_second=40.0, cycle_seconds=0.025)
    wrong_layers = replace(healthy, acceptance=0.19)
    drift = replace(healthy, acceptance=0.42)
    verify_slow = replace(
        healthy, phase_gpu_seconds={"draft": 0.002, "verify": 0.012, "bookkeeping": 0.001}
    )
    verify_slow_bigger_batch = replace(verify_slow, batch_size=16.0)
    below_baseline = replace(healthy, cycle_seconds=0.03, emitted_per_sequence=2.4)
    stalled = replace(healthy, cycles_per_second=0.0, waiting=5.0)
    idle = replace(healthy, cycles_per_second=0.0, waiting=0.0, running=0.0)
    down = replace(healthy, up=0.0)
    dropping = replace(healthy, dropped_per_second=5.0)
    trickle = replace(healthy, dropped_per_second=0.1)
    unbaselined = replace(below_baseline, baseline=None)

    def series(*segments: tuple[ServerState, int]) -> list[dict[str, str]]:
        return server_series(list(segments))

    server = dict(LABELS)
    return [
        _Case(
            "cycle time doubles at constant load: throughput drop fires",
            "SpecobsDecodeThroughputDrop",
            series((healthy, hour), (slow, hour)),
            [("55m", []), ("90m", [(server, "150.0")])],
        ),
        _Case(
            "load drop (fewer requests, far fewer tokens/s): no throughput drop",
            "SpecobsDecodeThroughputDrop",
            series((healthy, hour), (load_drop, hour)),
            [("75m", []), ("90m", []), ("115m", [])],
        ),
        _Case(
            "load rise (each sequence slower, server faster): no throughput drop",
            "SpecobsDecodeThroughputDrop",
            series((healthy, hour), (load_rise, hour)),
            [("75m", []), ("90m", []), ("115m", [])],
        ),
        _Case(
            "draft wired to the wrong hidden layers: acceptance drop fires",
            "SpecobsAcceptanceRateDrop",
            series((healthy, hour), (wrong_layers, hour)),
            [("55m", []), ("90m", [(server, "19%")])],
        ),
        _Case(
            "load drop and mild acceptance drift: no acceptance drop",
            "SpecobsAcceptanceRateDrop",
            series((healthy, hour), (load_drop, 20), (drift, 40)),
            [("75m", []), ("90m", []), ("115m", [])],
        ),
        _Case(
            "realized per-sequence speed below the baseline: slower than baseline fires",
            "SpecobsSpeculationSlowerThanBaseline",
            series((below_baseline, 30)),
            [("10m", []), ("25m", [(server, "0.80")])],
        ),
        _Case(
            "3x faster than the baseline, or no baseline configured: does not fire",
            "SpecobsSpeculationSlowerThanBaseline",
            series((healthy, 15), (unbaselined, 15)),
            [("14m", []), ("29m", [])],
        ),
        _Case(
            "verify doubles at constant batch size: phase regression fires",
            "SpecobsPhaseLatencyRegression",
            series((healthy, hour), (verify_slow, hour)),
            [
                ("55m", []),
                ("90m", [({**server, "phase": "verify", "clock": "gpu"}, "12ms")]),
            ],
        ),
        _Case(
            "verify doubles because the batch doubled (load): no phase regression",
            "SpecobsPhaseLatencyRegression",
            series((healthy, hour), (verify_slow_bigger_batch, hour)),
            [("80m", []), ("90m", []), ("115m", [])],
        ),
        _Case(
            "requests waiting, no cycles: stalled fires",
            "SpecobsDecodingStalled",
            series((healthy, hour), (stalled, 30)),
            [("55m", []), ("62m", []), ("75m", [(server, "5")])],
        ),
        _Case(
            "idle server (nothing waiting, no cycles) or busy server: not stalled",
            "SpecobsDecodingStalled",
            series((healthy, 30), (idle, 30)),
            [("25m", []), ("55m", [])],
        ),
        _Case(
            "scrapes fail: exporter down fires",
            "SpecobsExporterDown",
            series((healthy, 10), (down, 20)),
            [("12m", []), ("20m", [({"job": "specobs", "instance": "gpu-0:9477"}, "0")])],
        ),
        _Case(
            "scrapes succeed: exporter down does not fire",
            "SpecobsExporterDown",
            series((healthy, 30)),
            [("20m", [])],
        ),
        _Case(
            "no specobs target at all: target missing fires",
            "SpecobsTargetMissing",
            [{"series": 'up{job="node", instance="host:9100"}', "values": "1+0x30"}],
            [("10m", []), ("20m", [({"job": "specobs"}, "1")])],
        ),
        _Case(
            "a specobs target exists: target missing does not fire",
            "SpecobsTargetMissing",
            series((down, 30)),
            [("20m", [])],
        ),
        _Case(
            "5% of cycle records dropped: dropping records fires",
            "SpecobsExporterDroppingRecords",
            series((dropping, 30)),
            [("10m", []), ("25m", [({**server, "reason": "queue_full"}, "5%")])],
        ),
        _Case(
            "0.1% of cycle records dropped: dropping records does not fire",
            "SpecobsExporterDroppingRecords",
            series((trickle, 30)),
            [("25m", [])],
        ),
    ]


def _expr_tests(config: MixinConfig) -> dict[str, Any]:
    """Recording-rule checks on a steady server (promql_expr_test)."""
    n = RuleNames(config)
    state = ServerState()
    steady = server_series([(state, 20)])
    out = dict(LABELS)
    return {
        "name": "recording rules on a steady server",
        "interval": "1m",
        "input_series": steady,
        "promql_expr_test": [
            {
                "expr": f"round({n.sequence_speed}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": _selector("", out), "value": 300}],
            },
            {
                "expr": f"round({n.speedup_realized}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": _selector("", out), "value": 3}],
            },
            {
                "expr": f"round({n.acceptance}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": _selector("", out), "value": 0.5}],
            },
            {
                # (1 - 0.5^5) / (1 - 0.5) = 1.9375 tokens per cycle, at (2 + 6) / 6 target
                # steps per cycle: 1.453125.
                "expr": f"round({n.speedup_predicted}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": _selector("", {**out, "clock": "gpu"}), "value": 1.453}],
            },
            {
                "expr": f'round({n.phase_share}{{phase="verify"}}, 0.001)',
                "eval_time": "15m",
                "exp_samples": [
                    {
                        "labels": _selector("", {**out, "phase": "verify", "clock": "gpu"}),
                        "value": 0.667,
                    }
                ],
            },
            {
                "expr": f"round({n.batch_size_mean}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": _selector("", out), "value": 8}],
            },
        ],
    }


def is_default(config: MixinConfig) -> bool:
    default = MixinConfig()
    return all(getattr(config, name) == getattr(default, name) for name in RULE_FIELDS)


def render(config: MixinConfig) -> str | None:
    """The promtool test file, or ``None`` when ``config`` changes a rule threshold or window."""
    if not is_default(config):
        return None
    alerts = {a.alert: a for a in alert_rules(config)}
    tests: list[dict[str, Any]] = [_expr_tests(config)]
    for case in _cases():
        alert = alerts[case.alert]
        tests.append(
            {
                "name": case.name,
                "interval": "1m",
                "input_series": case.input_series,
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": case.alert,
                        "exp_alerts": _expected(alert, config, expected),
                    }
                    for eval_time, expected in case.checks
                ],
            }
        )
    header = (
        "# Generated by `specobs generate` from specobs/mixin; do not edit by hand.\n"
        "# Run with: promtool test rules deploy/prometheus/rules/specobs-rules.test.yml\n"
    )
    return header + dump_yaml(
        {"rule_files": [RULES_FILE], "evaluation_interval": "1m", "tests": tests}
    )
