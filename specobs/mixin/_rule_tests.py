"""``promtool test rules`` cases for the generated rules: for every alert one that fires and at
least one that must not (a load drop must not look like a throughput drop).

promtool 2.42 evaluates every group at the file's ``evaluation_interval``, whatever the group's
own ``interval``: here the ``specobs-history`` averages get a sample every 30 s, where Prometheus
records one every 5 minutes. The cases hold either way; tests/test_mixin.py runs them again with
the history group thinned to one evaluation in ten at several phases.

The alert cases are in :mod:`specobs.mixin._rule_cases`, the synthetic servers they are made of
in :mod:`specobs.mixin._rule_series`; this module adds the recording-rule checks and writes the
file. They assume the default thresholds and windows of :class:`MixinConfig` (``RULE_FIELDS``),
which is why :func:`render` returns ``None`` for a config that changes any of them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from specobs.mixin._config import RULE_FIELDS, MixinConfig, generated_notice
from specobs.mixin._rule_cases import cases, cohort
from specobs.mixin._rule_names import AlertRule, RuleNames
from specobs.mixin._rule_series import (
    GROUP,
    LABELS,
    ServerState,
    engine_series,
    notation,
    selector,
    server_series,
)
from specobs.mixin._rules import alert_rules, dump_yaml

__all__ = ["ServerState", "detection_times", "engine_series", "render", "server_series"]

RULES_FILE = "specobs-rules.yml"
#: One evaluation every 30 s: kube-prometheus-stack's default; detection times assume it.
EVALUATION_INTERVAL = "30s"


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.(\w+)|value)[^}]*\}\}")


def _expand(template: str, labels: dict[str, str], value: str) -> str:
    def sub(match: re.Match[str]) -> str:
        return labels.get(match.group(2), "") if match.group(2) else value

    return _TEMPLATE.sub(sub, template)


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


def _minutes(duration: str) -> float:
    value = 0.0
    for number, unit in re.findall(r"(\d+)([smh])", duration):
        value += float(number) * {"s": 1 / 60, "m": 1.0, "h": 60.0}[unit]
    return value


def detection_times() -> dict[str, list[tuple[str, float, float]]]:
    """Alert -> (case, last silent check, first firing check) in minutes after the fault, as the
    promtool tests prove them (the runbook prints them)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for case in cases():
        if case.fault_at is None:
            continue
        fault = _minutes(case.fault_at)
        by_alert: dict[str, tuple[float, float]] = {}
        for eval_time, alert, expected in case.checks:
            t = _minutes(eval_time) - fault
            silent, fired = by_alert.get(alert, (0.0, float("inf")))
            if expected:
                fired = min(fired, t)
            elif t < fired:
                silent = max(silent, t)
            by_alert[alert] = (silent, fired)
        for alert, (silent, fired) in by_alert.items():
            if fired != float("inf"):
                out.setdefault(alert, []).append((case.name, silent, fired))
    return out


def _expr_tests(config: MixinConfig) -> dict[str, Any]:
    """Recording-rule checks on a steady server (promql_expr_test)."""
    n = RuleNames(config)
    # 60 cycles/s of 10 ms with 5 ms between them: 0.9 s of each second busy.
    state = ServerState(
        cycles_per_second=60.0,
        gap_seconds=0.005,
        phase_host_seconds={"draft": 0.002, "verify": 0.007, "bookkeeping": 0.001},
    )
    steady = server_series([(state, 20)])
    out = dict(LABELS)
    # (the rule, with a matcher where it has several series; its labels; its value at 15m)
    checks: list[tuple[str, dict[str, str], float]] = [
        (n.sequence_speed, out, 300),
        (n.speedup_realized, {**out, "source": "configured"}, 3),
        (n.acceptance, out, 0.5),
        # 3 tokens per sequence-cycle from acceptance; a plain step costs 1 / 100 s; a cycle
        # 9 ms on the GPU clock and 10 ms on the host's.
        (f'{n.speedup_predicted}{{clock="gpu"}}', {**out, "clock": "gpu"}, 3.333),
        (f'{n.speedup_predicted}{{clock="host"}}', {**out, "clock": "host"}, 3.0),
        # Realized 3x over cycle time is 2x over wall time (a third of it between cycles).
        (n.speedup_calibration, {**out, "source": "configured"}, 0.667),
        (n.cohort_acceptance, cohort(out), 0.5),
        (f'{n.phase_share}{{phase="verify", clock="gpu"}}',
         {**out, "phase": "verify", "clock": "gpu"}, 0.667),
        (n.batch_size_mean, out, 8),
        (n.gap_mean, out, 0.005),
        # 5 ms of every 15 ms busy are outside cycles.
        (n.gap_share, out, 0.333),
    ]
    return {
        "name": "recording rules on a steady server",
        "interval": "1m",
        "input_series": steady,
        "promql_expr_test": [
            {
                "expr": f"round({rule}, 0.001)",
                "eval_time": "15m",
                "exp_samples": [{"labels": selector("", labels), "value": value}],
            }
            for rule, labels, value in checks
        ],
    }


#: Engine servers without the plugin for :func:`_engine_tests`: the engine, its target labels,
#: its series as (name, extra labels, per-second rate for a counter or value for a gauge), and
#: the fleet figures the rules must give (acceptance, tokens/s, accept length incl. the bonus,
#: acceptance at position 0, tokens per sequence-cycle: tokens/s over drafts/s).
_ENGINE_SERVERS: tuple[tuple[str, dict[str, str], list[tuple[str, dict[str, str], float]],
                             tuple[float, float, float, float | None, float]], ...] = (
    ("vllm", {"job": "vllm", "instance": "10.0.1.1:8000", "model_name": "llama-3-8b",
              "engine": "0"},
     [("vllm:spec_decode_num_drafts_total", {}, 10), ("vllm:spec_decode_num_draft_tokens_total",
      {}, 40), ("vllm:spec_decode_num_accepted_tokens_total", {}, 20),
      ("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"}, 8),
      ("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "1"}, 6),
      ("vllm:generation_tokens_total", {}, 30)],
     (0.5, 30, 3.0, 0.8, 3.0)),
    ("sglang", {"job": "sglang", "instance": "10.0.1.2:30000", "model_name": "llama-3-8b",
                "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"},
     [("sglang:spec_verify_calls_total", {}, 10), ("sglang:spec_num_draft_tokens", {}, -5),
      ("sglang:spec_accept_rate", {}, -0.25), ("sglang:spec_accept_length", {}, -2.0),
      ("sglang:generation_tokens_total", {"is_streaming": "false"}, 20)],
     (0.25, 20, 2.0, None, 2.0)),
    ("trtllm", {"job": "trtllm", "instance": "10.0.1.3:8000", "model_name": "llama-3-8b",
                "engine_type": "trtllm"},
     [("trtllm_spec_decode_num_draft_tokens_total", {}, 30),
      ("trtllm_spec_decode_num_accepted_tokens_total", {}, 12),
      ("trtllm_spec_decode_drafted_tokens_total", {"token_position": "0"}, 10),
      ("trtllm_spec_decode_accepted_tokens_total", {"token_position": "0"}, 7),
      ("trtllm_spec_decode_acceptance_length", {}, -2.2),
      ("trtllm_generation_tokens_total", {}, 25)],
     (0.4, 25, 2.2, 0.7, 2.5)),
    ("llamacpp", {"job": "llamacpp", "instance": "10.0.1.4:8080"},
     [("llamacpp:spec_decode_num_drafts_total", {}, 5),
      ("llamacpp:spec_decode_num_draft_tokens_total", {}, 15),
      ("llamacpp:spec_decode_num_accepted_tokens_total", {}, 9),
      ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"}, 4),
      ("llamacpp:tokens_predicted_total", {}, 14)],
     (0.6, 14, 2.8, 0.8, 2.8)),
    ("lmdeploy", {"job": "lmdeploy", "instance": "10.0.1.5:23333", "model_name": "llama-3-8b",
                  "engine": "0"},
     [("lmdeploy:spec_decode_num_drafts_total", {}, 4),
      ("lmdeploy:spec_decode_num_draft_tokens_total", {}, 12),
      ("lmdeploy:spec_decode_num_accepted_tokens_total", {}, 3),
      ("lmdeploy:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"}, 2),
      ("lmdeploy:generation_tokens_total", {}, 7)],
     (0.25, 7, 1.75, 0.5, 1.75)),
)


def _engine_tests(config: MixinConfig) -> dict[str, Any]:
    """The engines' own series normalised: each engine-only server's acceptance, tokens/s,
    accept length and position-0 acceptance in the fleet rules, labelled with its engine and
    ``source="engine"``; and a vLLM endpoint on the plugin's host left out (no double count).
    A negative figure in the table is a gauge's value, a positive one a counter's rate."""
    n = RuleNames(config)
    steps = 20

    def series(name: str, labels: dict[str, str], figure: float) -> dict[str, str]:
        values = [abs(figure)] * (steps + 1) if figure < 0 else [
            figure * 60 * i for i in range(steps + 1)]
        return {"series": selector(name, labels), "values": notation(list(values))}

    inputs = server_series([(ServerState(), steps)])
    checks: list[tuple[str, dict[str, str], float]] = []
    for engine, target, metrics, (acceptance, emitted, length, pos0, per_sequence) in \
            _ENGINE_SERVERS:
        labels = {**GROUP, **target}
        inputs += [series(name, {**labels, **extra}, f) for name, extra, f in metrics]
        out = {k: v for k, v in labels.items() if k in config.instance_labels}
        out |= {config.engine_label: engine, "source": "engine"}
        checks += [(n.acceptance, out, acceptance), (n.emitted, out, emitted),
                   (n.accept_length_incl_bonus, out, length),
                   (n.emitted_per_sequence, out, per_sequence)]
        if pos0 is not None:
            checks.append((n.acceptance_by_position, {**out, "position": "0"}, pos0))
    # vLLM's own endpoint on the plugin's host (10.0.0.1) with other figures: dropped.
    plugin_host = {**GROUP, "job": "vllm", "instance": "10.0.0.1:8000",
                   "model_name": "llama-3-8b", "engine": "0"}
    inputs += [series("vllm:spec_decode_num_draft_tokens_total", plugin_host, 1000),
               series("vllm:spec_decode_num_accepted_tokens_total", plugin_host, 10)]
    def where(rule: str, labels: dict[str, str]) -> str:
        return selector(rule, {k: labels[k] for k in ("instance", "position") if k in labels})

    tests = [
        {
            "expr": f"round({where(rule, labels)}, 0.001)",
            "eval_time": "15m",
            "exp_samples": [{"labels": selector("", labels), "value": value}],
        }
        for rule, labels, value in checks
    ]
    tests += [
        {"expr": f'{n.engine["draft_tokens"]}{{instance="10.0.0.1:8000"}}', "eval_time": "15m",
         "exp_samples": []},
        {"expr": f"round({n.acceptance}{{instance=\"10.0.0.1:9477\"}}, 0.001)",
         "eval_time": "15m",
         "exp_samples": [{"labels": selector("", LABELS), "value": 0.5}]},
    ]
    return {
        "name": "the engines' own series in the fleet rules, the plugin winning on its host",
        "interval": "1m",
        "input_series": inputs,
        "promql_expr_test": tests,
    }


def _idle_tests(config: MixinConfig) -> dict[str, Any]:
    """An idle server stores no NaN: every ratio rule is absent, not NaN."""
    n = RuleNames(config)
    busy = ServerState(cycles_per_second=60.0, gap_seconds=0.005)
    idle = replace(busy, cycles_per_second=0.0, waiting=0.0, running=0.0)
    ratios = (
        n.acceptance,
        n.emitted_per_sequence,
        n.batch_size_mean,
        n.cycle_mean,
        n.cycle_p99,
        n.phase_mean,
        n.phase_share,
        n.sequence_speed,
        n.speedup_realized,
        n.speedup_predicted,
        n.speedup_calibration,
        n.sampled_ratio,
        n.cohort_acceptance,
        n.gap_mean,
        n.gap_share,
    )
    return {
        "name": "an idle server: no NaN in any ratio rule (absent instead)",
        "interval": "1m",
        "input_series": server_series([(busy, 10), (idle, 20)]),
        "promql_expr_test": [
            {"expr": rule, "eval_time": "25m", "exp_samples": []} for rule in ratios
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
    tests: list[dict[str, Any]] = [_expr_tests(config), _engine_tests(config), _idle_tests(config)]
    for case in cases():
        tests.append(
            {
                "name": case.name,
                "interval": case.interval,
                "input_series": case.input_series,
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": alert,
                        "exp_alerts": _expected(alerts[alert], config, expected),
                    }
                    for eval_time, alert, expected in case.checks
                ],
            }
        )
    header = (
        f"# {generated_notice()}\n"
        "# Run with: promtool test rules deploy/prometheus/rules/specobs-rules.test.yml\n"
    )
    return header + dump_yaml(
        {"rule_files": [RULES_FILE], "evaluation_interval": EVALUATION_INTERVAL, "tests": tests}
    )
