"""``promtool test rules`` cases for the generated rules: for every alert one that fires and at
least one that must not (a load drop must not look like a throughput drop).

promtool 2.42 evaluates every group at the file's ``evaluation_interval``, whatever the group's
own ``interval``: here the ``specobs-history`` averages get a sample every 30 s, where Prometheus
records one every 5 minutes. The cases hold either way; tests/test_mixin.py runs them again with
the history group thinned to one evaluation in ten at several phases.

The cases are synthetic servers described as a timeline of steady :class:`ServerState` segments,
one sample a minute; counters are integrated from the rates, so every input is self-consistent.
They assume the default thresholds and windows of :class:`MixinConfig` (``RULE_FIELDS``), which is
why :func:`render` returns ``None`` for a config that changes any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import specobs.catalog as c
from specobs.mixin._config import RULE_FIELDS, MixinConfig, generated_notice
from specobs.mixin._rule_names import AlertNames, AlertRule, RuleNames
from specobs.mixin._rules import alert_rules, dump_yaml

__all__ = ["ServerState", "detection_times", "engine_series", "render", "server_series"]

RULES_FILE = "specobs-rules.yml"
#: One evaluation every 30 s: kube-prometheus-stack's default; detection times assume it.
EVALUATION_INTERVAL = "30s"
GROUP = {"cluster": "eu-1", "namespace": "llm"}
LLAMA = {"model_name": "llama-3-8b", "serving_engine": "vllm"}
MISTRAL = {"model_name": "mistral-7b", "serving_engine": "sglang"}


def pod(index: int, model: dict[str, str] = LLAMA, name: str = "llama") -> dict[str, str]:
    """Labels of one specobs target as the Prometheus Operator scrapes it: 10.0.0.N:9477."""
    return {
        **GROUP,
        "job": "specobs",
        "instance": f"10.0.0.{index}:9477",
        "pod": f"{name}-{index}",
        **model,
    }


LABELS = pod(1)


@dataclass(frozen=True)
class ServerState:
    """One steady stretch of a synthetic server; rates are per second."""

    cycles_per_second: float = 100.0
    batch_size: float = 8.0
    #: Tokens per sequence per cycle; None: 1 + draft length x acceptance (the bonus token).
    emitted_per_sequence: float | None = None
    draft_per_sequence: float = 4.0
    acceptance: float = 0.5
    cycle_seconds: float = 0.01  # host clock
    phase_gpu_seconds: dict[str, float] = field(
        default_factory=lambda: {"draft": 0.002, "verify": 0.006, "bookkeeping": 0.001}
    )
    #: Host-clock phase means; None: the GPU clock's phases only.
    phase_host_seconds: dict[str, float] | None = None
    baseline: float | None = 100.0
    #: The baseline gauge's ``source`` label; None: none (a configured baseline).
    baseline_source: str | None = None
    #: specobs's own request gauges (the demo sets them); None: not exported (vLLM, SGLang).
    waiting: float | None = 0.0
    running: float | None = 8.0
    up: float = 1.0
    dropped_per_second: float = 0.0
    #: The ``reason`` of those drops.
    drop_reason: str = "queue_full"
    #: Requests finishing per second (``request_finished``); None: not reported (the request
    #: series are absent, as on an engine that does not call it).
    requests_per_second: float | None = None
    #: The share of them whose acceptance is at most ``MixinConfig.request_acceptance_low``.
    low_acceptance_share: float = 0.05
    #: Host seconds between two cycles (``specobs_cycle_gap_seconds``, one gap per cycle); None:
    #: not exported. Cycles and gaps fill at most the second: cycles/s x (cycle + gap) <= 1.
    gap_seconds: float | None = None

    @property
    def emitted(self) -> float:
        if self.emitted_per_sequence is not None:
            return self.emitted_per_sequence
        return 1.0 + self.draft_per_sequence * self.acceptance


def _fmt(value: float) -> str:
    text = f"{value:.10g}"
    return text


def _notation(values: list[float | None]) -> str:
    """Compress samples into promtool's ``a+bxn`` runs (``_xn`` for missing samples)."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        start = values[i]
        if start is None:
            n = 1
            while i + n < len(values) and values[i + n] is None:
                n += 1
            parts.append("_" if n == 1 else f"_x{n}")
            i += n
            continue
        if i + 1 == len(values) or values[i + 1] is None:
            parts.append(_fmt(start))
            i += 1
            continue
        nxt = values[i + 1]
        assert nxt is not None
        step = nxt - start
        n = 1
        while i + n + 1 < len(values):
            a, b = values[i + n], values[i + n + 1]
            if a is None or b is None or abs(b - a - step) >= 1e-9:
                break
            n += 1
        sign = "+" if step >= 0 else "-"
        parts.append(f"{_fmt(start)}{sign}{_fmt(abs(step))}x{n}")
        i += n + 1
    return " ".join(parts)


def _timeline(segments: list[tuple[ServerState, int]]) -> list[ServerState]:
    minutes: list[ServerState] = []
    for state, duration in segments:
        minutes.extend([state] * duration)
    return minutes


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def server_series(
    segments: list[tuple[ServerState, int]],
    labels: dict[str, str] = LABELS,
    *,
    start: int = 0,
    restart_at: int | None = None,
    step_seconds: float = 60.0,
) -> list[dict[str, str]]:
    """Every input series of one server: absent for ``start`` steps, then the segments (each
    lasting that many steps; its first sample is all zeros), then gone. ``restart_at``: the
    process restarts at that step of the segments, its counters starting again from zero."""
    steps = _timeline(segments)
    series: dict[str, list[float | None]] = {}
    pad: list[float | None] = [None] * start

    def counter(key: str, per_second: list[float]) -> None:
        total, values = 0.0, [0.0]
        for i, rate in enumerate(per_second):
            if restart_at is not None and i == restart_at:
                total = 0.0
            total += rate * step_seconds
            values.append(total)
        series[key] = [*pad, *values]

    def gauge(key: str, values: list[float | None]) -> None:
        if any(v is not None for v in values):
            series[key] = [*pad, values[0], *values]

    cycles = [s.cycles_per_second for s in steps]
    sequences = [s.cycles_per_second * s.batch_size for s in steps]
    drafted = [q * s.draft_per_sequence for q, s in zip(sequences, steps, strict=True)]
    counter(_selector(c.CYCLES.name, labels), cycles)
    counter(_selector(f"{c.BATCH_SIZE.name}_sum", labels), sequences)
    counter(_selector(f"{c.BATCH_SIZE.name}_count", labels), cycles)
    counter(
        _selector(c.EMITTED_TOKENS.name, labels),
        [q * s.emitted for q, s in zip(sequences, steps, strict=True)],
    )
    counter(_selector(c.DRAFT_TOKENS.name, labels), drafted)
    counter(
        _selector(c.ACCEPTED_TOKENS.name, labels),
        [d * s.acceptance for d, s in zip(drafted, steps, strict=True)],
    )
    host = {**labels, "clock": "host"}
    counter(
        _selector(f"{c.CYCLE_DURATION.name}_sum", host),
        [s.cycles_per_second * s.cycle_seconds for s in steps],
    )
    counter(_selector(f"{c.CYCLE_DURATION.name}_count", host), cycles)
    if any(s.gap_seconds is not None for s in steps):
        counter(_selector(f"{c.CYCLE_GAP.name}_sum", labels),
                [s.cycles_per_second * (s.gap_seconds or 0.0) for s in steps])
        counter(_selector(f"{c.CYCLE_GAP.name}_count", labels), cycles)
    for phase in steps[0].phase_gpu_seconds:
        gpu = {**labels, "phase": phase, "clock": "gpu"}
        counter(
            _selector(f"{c.PHASE_DURATION.name}_sum", gpu),
            [s.cycles_per_second * s.phase_gpu_seconds[phase] for s in steps],
        )
        counter(_selector(f"{c.PHASE_DURATION.name}_count", gpu), cycles)
    for phase in steps[0].phase_host_seconds or {}:
        on_host = {**labels, "phase": phase, "clock": "host"}
        counter(
            _selector(f"{c.PHASE_DURATION.name}_sum", on_host),
            [s.cycles_per_second * (s.phase_host_seconds or {})[phase] for s in steps],
        )
        counter(_selector(f"{c.PHASE_DURATION.name}_count", on_host), cycles)
    if any(s.requests_per_second is not None for s in steps):
        requests = [s.requests_per_second or 0.0 for s in steps]
        low = {**labels, "le": repr(float(MixinConfig().request_acceptance_low))}
        counter(_selector(f"{c.REQUEST_ACCEPTANCE.name}_bucket", low),
                [r * s.low_acceptance_share for r, s in zip(requests, steps, strict=True)])
        counter(_selector(f"{c.REQUEST_ACCEPTANCE.name}_count", labels), requests)
        counter(_selector(c.REQUESTS_FINISHED.name, labels), requests)
    for reason in dict.fromkeys(s.drop_reason for s in steps):
        counter(
            _selector(c.DROPPED_RECORDS.name, {**labels, "reason": reason}),
            [s.dropped_per_second if s.drop_reason == reason else 0.0 for s in steps],
        )
    # The last cycle's end: the sample's own time while cycles run, frozen when they stop.
    last: list[float | None] = []
    seen: float | None = None
    for i, s in enumerate(steps):
        if s.cycles_per_second > 0:
            seen = (start + i + 1) * step_seconds
        last.append(seen)
    series[_selector(c.LAST_CYCLE_TIMESTAMP.name, labels)] = [*pad, None, *last]
    if all(v is None for v in series[_selector(c.LAST_CYCLE_TIMESTAMP.name, labels)]):
        del series[_selector(c.LAST_CYCLE_TIMESTAMP.name, labels)]
    for source in dict.fromkeys(s.baseline_source for s in steps):
        gauge(
            _selector(c.BASELINE_SEQUENCE_TOKENS.name,
                      labels if source is None else {**labels, "source": source}),
            [s.baseline if s.baseline_source == source else None for s in steps],
        )  # fmt: skip
    gauge(_selector(c.REQUESTS_WAITING.name, labels), [s.waiting for s in steps])
    gauge(_selector(c.REQUESTS_RUNNING.name, labels), [s.running for s in steps])
    target = {k: v for k, v in labels.items() if k not in LLAMA}
    gauge(_selector("up", target), [s.up for s in steps])
    return [{"series": k, "values": _notation(v)} for k, v in series.items()]


def engine_series(
    style: str, host: str, running: list[float], waiting: list[float], model: str = "llama-3-8b"
) -> list[dict[str, str]]:
    """The engine's own request gauges, one sample per step, as vLLM or SGLang export them
    (their own endpoint: another port and job than specobs's)."""
    if style == "vllm":
        labels = {
            **GROUP,
            "job": "vllm",
            "instance": f"{host}:8000",
            "model_name": model,
            "engine": "0",
        }
        names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    else:
        labels = {
            **GROUP,
            "job": "sglang",
            "instance": f"{host}:30000",
            "model_name": model,
            "engine_type": "unified",
            "tp_rank": "0",
        }
        names = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
    return [
        {"series": _selector(name, labels), "values": _notation([values[0], *values])}
        for name, values in zip(names, (running, waiting), strict=True)
    ]


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.(\w+)|value)[^}]*\}\}")


def _expand(template: str, labels: dict[str, str], value: str) -> str:
    def sub(match: re.Match[str]) -> str:
        return labels.get(match.group(2), "") if match.group(2) else value

    return _TEMPLATE.sub(sub, template)


Check = tuple[str, str, list[tuple[dict[str, str], str]]]


@dataclass(frozen=True)
class _Case:
    """One promtool test: a timeline, and checks (eval time, alert, the alerts expected with
    their value as printed). ``fault_at`` is when the fault begins, for detection times."""

    name: str
    input_series: list[dict[str, str]]
    checks: list[Check]
    fault_at: str | None = None
    interval: str = "1m"


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


def _cohort(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in ("instance", "pod")}


def _server(labels: dict[str, str]) -> dict[str, str]:
    return dict(labels)


def _cases() -> list[_Case]:
    healthy = ServerState()
    hour = 60
    # Everything slower per cycle: cycle time doubles, so does nothing else.
    slow = replace(healthy, cycles_per_second=50.0, cycle_seconds=0.02)
    # Fewer requests: smaller batches and slightly faster cycles; tokens/s falls by 69%.
    load_drop = replace(healthy, batch_size=2.0, cycles_per_second=125.0, cycle_seconds=0.008)
    # More requests: bigger batches and slower cycles; each sequence is slower, the server faster.
    load_rise = replace(healthy, batch_size=32.0, cycles_per_second=40.0, cycle_seconds=0.025)
    broken = replace(healthy, acceptance=0.1)
    wrong_layers = replace(healthy, acceptance=0.19)
    drift = replace(healthy, acceptance=0.42)
    verify_slow = replace(
        healthy, phase_gpu_seconds={"draft": 0.002, "verify": 0.012, "bookkeeping": 0.001}
    )
    verify_slow_bigger_batch = replace(verify_slow, batch_size=16.0)
    below_baseline = replace(healthy, cycle_seconds=0.03, emitted_per_sequence=2.4)
    quiet = replace(healthy, cycles_per_second=0.02, batch_size=1.0, running=0.0)
    idle = replace(healthy, cycles_per_second=0.0, waiting=0.0, running=0.0)
    down = replace(healthy, up=0.0)
    dropping = replace(healthy, dropped_per_second=5.0)
    trickle = replace(healthy, dropped_per_second=0.1)
    raising = replace(healthy, dropped_per_second=5.0, drop_reason=c.DROP_REASON_EXCEPTION)
    unbaselined = replace(below_baseline, baseline=None)
    below_measured = replace(below_baseline, baseline_source="demo_measured")
    engine_only = replace(healthy, waiting=None, running=None)
    engine_stalled = replace(engine_only, cycles_per_second=0.0)
    engine_idle = engine_stalled

    def series(
        *segments: tuple[ServerState, int], labels: dict[str, str] = LABELS, start: int = 0
    ) -> list[dict[str, str]]:
        return server_series(list(segments), labels, start=start)

    def fleet(*servers: list[dict[str, str]]) -> list[dict[str, str]]:
        return [s for server in servers for s in server]

    p0, p1, p2, p3 = pod(1), pod(2), pod(3), pod(4)
    m0 = pod(9, MISTRAL, "mistral")

    def outlier(changed: ServerState) -> list[dict[str, str]]:
        """Four pods of one model, healthy for an hour; then the fourth is ``changed``."""
        return fleet(
            *(series((healthy, 2 * hour), labels=p) for p in (p0, p1, p2)),
            series((healthy, hour), (changed, hour), labels=p3),
        )

    def new_pods(changed: ServerState) -> list[dict[str, str]]:
        """A rollout: two healthy pods of one model for 90 minutes, replaced by two new pods
        that are ``changed`` for an hour."""
        return fleet(
            series((healthy, 90), labels=p0),
            series((healthy, 90), labels=p1),
            series((changed, hour), labels=p2, start=90),
            series((changed, hour), labels=p3, start=90),
        )

    server = dict(LABELS)
    cases: list[_Case] = []
    a = AlertNames.ACCEPTANCE_BELOW_COHORT
    cases += [
        _Case(
            "new pod with a broken draft joins two healthy pods: acceptance below cohort fires",
            fleet(
                series((healthy, 2 * hour), labels=p0),
                series((healthy, 2 * hour), labels=p1),
                series((broken, hour), labels=p2, start=hour),
            ),
            [
                ("65m30s", a, []),
                ("66m", a, [(p2, "10%")]),
                ("90m", AlertNames.ACCEPTANCE_RATE_DROP, []),
            ],
            fault_at="60m",
        ),
        _Case(
            "one outlier of four pods loses its draft: acceptance below cohort fires",
            outlier(wrong_layers),
            [("67m", a, []), ("67m30s", a, [(p3, "19%")])],
            fault_at="60m",
        ),
        _Case(
            "a healthy new pod, and a quiet pod with a poor draft: acceptance below cohort silent",
            fleet(
                series((healthy, 2 * hour), labels=p0),
                series((healthy, 2 * hour), labels=p1),
                series((healthy, hour), labels=p2, start=hour),
                series((replace(quiet, acceptance=0.1), 2 * hour), labels=p3),
            ),
            [("70m", a, []), ("110m", a, [])],
        ),
    ]
    a = AlertNames.ACCEPTANCE_RATE_DROP
    cases += [
        _Case(
            "a whole rollout degrades one model (new pods, broken draft): acceptance drop fires "
            "for that model only",
            fleet(new_pods(broken), series((healthy, 150), labels=m0)),
            [
                ("97m", a, []),
                ("97m30s", a, [(_cohort(p0), "10%")]),
                ("120m", AlertNames.ACCEPTANCE_BELOW_COHORT, []),
            ],
            fault_at="90m",
        ),
        _Case(
            "draft wired to the wrong hidden layers on a fixed server: acceptance drop fires",
            series((healthy, hour), (wrong_layers, hour)),
            [("67m", a, []), ("67m30s", a, [(_cohort(server), "19%")])],
            fault_at="60m",
        ),
        _Case(
            "a rollout with a healthy draft, a load drop and mild drift: no acceptance drop",
            fleet(
                series((healthy, 90), labels=p0),
                series((load_drop, 20), (drift, 40), labels=p2, start=90),
            ),
            [("95m", a, []), ("110m", a, []), ("145m", a, [])],
        ),
    ]
    a = AlertNames.DECODE_THROUGHPUT_BELOW_COHORT
    cases += [
        _Case(
            "one pod's cycle time doubles at the fleet's load: throughput below cohort fires",
            outlier(slow),
            [("68m", a, []), ("68m30s", a, [(p3, "150.0")])],
            fault_at="60m",
        ),
        _Case(
            "one pod gets four times the batch (load, not a fault): throughput below cohort silent",
            outlier(load_rise),
            [("70m", a, []), ("110m", a, [])],
        ),
    ]
    a = AlertNames.COHORT_THROUGHPUT_DROP
    cases += [
        _Case(
            "a rollout slows every pod of one model (new pods): cohort throughput drop fires",
            new_pods(slow),
            [("104m", a, []), ("104m30s", a, [(_cohort(p0), "150.0")])],
            fault_at="90m",
        ),
        _Case(
            "a rollout under four times the load: cohort throughput drop silent",
            fleet(series((healthy, 90), labels=p0), series((load_rise, hour), labels=p2, start=90)),
            [("100m", a, []), ("140m", a, [])],
        ),
    ]
    a = AlertNames.DECODE_THROUGHPUT_DROP
    cases += [
        _Case(
            "cycle time doubles at constant load: throughput drop fires",
            series((healthy, hour), (slow, hour)),
            # At 63m the rate sits exactly at 70% of the reference, so whether that evaluation
            # counts depends on the reference's last bit (its 5m averages sampled every
            # evaluation or every 5m): 73m is left unchecked.
            [("72m30s", a, []), ("73m30s", a, [(server, "150.0")])],
            fault_at="60m",
        ),
        _Case(
            "load drop (fewer requests, far fewer tokens/s): no throughput drop",
            series((healthy, hour), (load_drop, hour)),
            [("75m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
        _Case(
            "load rise (each sequence slower, server faster): no throughput drop",
            series((healthy, hour), (load_rise, hour)),
            [("75m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
    ]
    a = AlertNames.SPECULATION_SLOWER_THAN_BASELINE
    cases += [
        _Case(
            "realized per-sequence speed below the baseline: slower than baseline fires",
            series((below_baseline, 30)),
            [("15m30s", a, []), ("16m", a, [({**server, "source": "configured"}, "0.80")])],
            fault_at="0m",
        ),
        _Case(
            "below a baseline the engine measured itself: fires, labelled with its source",
            series((below_measured, 30)),
            [("15m30s", a, []), ("16m", a, [({**server, "source": "demo_measured"}, "0.80")])],
            fault_at="0m",
        ),
        _Case(
            "3x faster than the baseline, or no baseline configured: does not fire",
            series((healthy, 15), (unbaselined, 15)),
            [("14m", a, []), ("29m", a, [])],
        ),
    ]
    a = AlertNames.PHASE_LATENCY_ABOVE_COHORT
    cases += [
        _Case(
            "verify doubles on one pod at the fleet's batch size: phase above cohort fires",
            outlier(verify_slow),
            [
                ("67m30s", a, []),
                ("68m", a, [({**p3, "phase": "verify", "clock": "gpu"}, "12ms")]),
            ],
            fault_at="60m",
        ),
        _Case(
            "verify doubles on one pod because its batch doubled: phase above cohort silent",
            outlier(verify_slow_bigger_batch),
            [("70m", a, []), ("110m", a, [])],
        ),
    ]
    a = AlertNames.PHASE_LATENCY_REGRESSION
    cases += [
        _Case(
            "verify doubles at constant batch size: phase regression fires",
            series((healthy, hour), (verify_slow, hour)),
            [
                ("77m30s", a, []),
                ("78m", a, [({**server, "phase": "verify", "clock": "gpu"}, "12ms")]),
            ],
            fault_at="60m",
        ),
        _Case(
            "verify doubles because the batch doubled (load): no phase regression",
            series((healthy, hour), (verify_slow_bigger_batch, hour)),
            [("80m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
    ]
    a = AlertNames.DECODING_STALLED
    host = {**GROUP, "host": "10.0.0.1"}
    quarter = 4 * 30  # 15 s steps: 30 minutes
    for style in ("vllm", "sglang"):
        cases.append(
            _Case(
                f"{style}-style engine: requests running, cycles stop: stalled fires",
                fleet(
                    server_series(
                        [(engine_only, quarter), (engine_stalled, quarter)], p0, step_seconds=15
                    ),
                    engine_series(style, "10.0.0.1", [3.0] * 2 * quarter, [2.0] * 2 * quarter),
                ),
                [("31m", a, []), ("31m30s", a, [(host, "3")]), ("45m", a, [(host, "3")])],
                fault_at="30m",
                interval="15s",
            )
        )
    cases += [
        _Case(
            "demo-style (specobs's own request gauges): requests waiting, no cycles: stalled",
            series((healthy, hour), (replace(healthy, cycles_per_second=0.0, waiting=5.0), 30)),
            [("61m", a, []), ("61m30s", a, [(host, "8")])],
            fault_at="60m",
        ),
        _Case(
            "quiet engine (no requests, no cycles), busy engine, an engine host without specobs: "
            "not stalled",
            fleet(
                server_series(
                    [(engine_only, quarter), (engine_idle, quarter)], p0, step_seconds=15
                ),
                engine_series(
                    "vllm", "10.0.0.1", [3.0] * quarter + [0.0] * quarter, [0.0] * 2 * quarter
                ),
                server_series([(engine_only, 2 * quarter)], p1, step_seconds=15),
                engine_series("sglang", "10.0.0.2", [4.0] * 2 * quarter, [1.0] * 2 * quarter),
                engine_series("vllm", "10.0.0.7", [4.0] * 2 * quarter, [1.0] * 2 * quarter),
            ),
            [("25m", a, []), ("45m", a, [])],
            interval="15s",
        ),
    ]
    a = AlertNames.EXPORTER_DOWN
    target = {k: v for k, v in server.items() if k not in LLAMA}
    cases += [
        _Case(
            "scrapes fail: exporter down fires",
            series((healthy, 10), (down, 20)),
            [("15m30s", a, []), ("16m", a, [(target, "0")])],
            fault_at="10m",
        ),
        _Case(
            "scrapes succeed: exporter down does not fire", series((healthy, 30)), [("20m", a, [])]
        ),
    ]
    a = AlertNames.TARGET_MISSING
    cases += [
        _Case(
            "no specobs target at all: target missing fires",
            [{"series": 'up{job="node", instance="host:9100"}', "values": "1+0x30"}],
            [("14m30s", a, []), ("15m", a, [({"job": "specobs"}, "1")])],
            fault_at="0m",
        ),
        _Case(
            "a specobs target exists: target missing does not fire",
            series((down, 30)),
            [("20m", a, [])],
        ),
    ]
    a = AlertNames.EXPORTER_DROPPING_RECORDS
    cases += [
        _Case(
            "5% of cycle records dropped: dropping records fires",
            series((healthy, 10), (dropping, 30)),
            [("26m", a, []), ("26m30s", a, [({**server, "reason": "queue_full"}, "5%")])],
            fault_at="10m",
        ),
        _Case(
            "0.1% of cycle records dropped: dropping records does not fire",
            series((trickle, 30)),
            [("25m", a, [])],
        ),
        _Case(
            "5% of cycles raised in the engine (reason exception): not specobs dropping records",
            series((healthy, 10), (raising, 30)),
            [("26m30s", a, []), ("39m", a, [])],
        ),
    ]
    a = AlertNames.LOW_ACCEPTANCE_REQUESTS_JUMP
    serving = replace(healthy, requests_per_second=1.0)
    # One slot of several collapses: 40% of requests now accept <= 20%.
    collapsed = replace(serving, low_acceptance_share=0.4)
    cases += [
        _Case(
            "a server's share of low-acceptance requests jumps from 5% to 40%: fires",
            series((serving, 90), (collapsed, 30)),
            # The 15m share passes 10% (and twice the past's 5%) at 93m; held 5 minutes.
            [("97m30s", a, []), ("98m", a, [(server, "23.67%")])],
            fault_at="90m",
        ),
        _Case(
            "a quiet server (one request a minute) jumps to 40%: silent, too few requests",
            series((replace(serving, requests_per_second=1 / 60), 90),
                   (replace(collapsed, requests_per_second=1 / 60), 30)),
            [("100m", a, []), ("119m", a, [])],
        ),
        _Case(
            "a steady 30% of low-acceptance requests, and a rise from 5% to 8%: silent",
            fleet(
                series((replace(serving, low_acceptance_share=0.3), 120), labels=p0),
                series((serving, 90), (replace(serving, low_acceptance_share=0.08), 30),
                       labels=p1),
            ),
            [("100m", a, []), ("119m", a, [])],
        ),
    ]
    every = [alert.alert for alert in alert_rules(MixinConfig())]
    cases += [
        _Case(
            "a quiet but healthy fleet (a trickle of traffic, one idle pod): no alert at all",
            fleet(
                series((healthy, hour), (quiet, hour), labels=p0),
                series((quiet, 2 * hour), labels=p1),
                series((healthy, 30), (idle, 90), labels=p2),
            ),
            [(t, name, []) for t in ("70m", "110m") for name in every],
        ),
        _Case(
            "a restart (counters reset to zero on the same pod): no alert at all",
            fleet(
                server_series([(healthy, 2 * hour)], p0, restart_at=hour),
                series((healthy, 2 * hour), labels=p1),
            ),
            [(t, name, []) for t in ("61m", "63m", "70m", "90m") for name in every],
        ),
    ]
    return cases


def detection_times() -> dict[str, list[tuple[str, float, float]]]:
    """Alert -> (case, last silent check, first firing check) in minutes after the fault, as the
    promtool tests prove them (the runbook prints them)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for case in _cases():
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
        (n.cohort_acceptance, _cohort(out), 0.5),
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
                "exp_samples": [{"labels": _selector("", labels), "value": value}],
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
        return {"series": _selector(name, labels), "values": _notation(list(values))}

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
        return _selector(rule, {k: labels[k] for k in ("instance", "position") if k in labels})

    tests = [
        {
            "expr": f"round({where(rule, labels)}, 0.001)",
            "eval_time": "15m",
            "exp_samples": [{"labels": _selector("", labels), "value": value}],
        }
        for rule, labels, value in checks
    ]
    tests += [
        {"expr": f'{n.engine["draft_tokens"]}{{instance="10.0.0.1:8000"}}', "eval_time": "15m",
         "exp_samples": []},
        {"expr": f"round({n.acceptance}{{instance=\"10.0.0.1:9477\"}}, 0.001)",
         "eval_time": "15m",
         "exp_samples": [{"labels": _selector("", LABELS), "value": 0.5}]},
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
    for case in _cases():
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
