"""The promtool cases for the alerts: for every alert one that fires and at least one that
must not (a load drop must not look like a throughput drop).

Each case is a timeline of synthetic servers (:mod:`specobs.mixin._rule_series`) and checks: at
an evaluation time, the alert and the alerts expected with their value as printed. The states
and fleets below are the cases' vocabulary; one builder per group of alerts returns its cases.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import specobs.catalog as c
from specobs.mixin._alert_rules import alert_rules
from specobs.mixin._config import MixinConfig
from specobs.mixin._rule_names import AlertNames
from specobs.mixin._rule_series import (
    GROUP,
    LABELS,
    LLAMA,
    MISTRAL,
    ServerState,
    engine_series,
    pod,
    server_series,
)

__all__ = ["Case", "Check", "cases", "cohort"]

Check = tuple[str, str, list[tuple[dict[str, str], str]]]


@dataclass(frozen=True)
class Case:
    """One promtool test: a timeline, and checks (eval time, alert, the alerts expected with
    their value as printed). ``fault_at`` is when the fault begins, for detection times."""

    name: str
    input_series: list[dict[str, str]]
    checks: list[Check]
    fault_at: str | None = None
    interval: str = "1m"


def cohort(labels: dict[str, str]) -> dict[str, str]:
    """A server's labels less the ones that name the server: its cohort's."""
    return {k: v for k, v in labels.items() if k not in ("instance", "pod")}


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


def _acceptance_cases() -> list[Case]:
    """A server's acceptance against its cohort, a cohort's against its past."""
    cases: list[Case] = []
    a = AlertNames.ACCEPTANCE_BELOW_COHORT
    cases += [
        Case(
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
        Case(
            "one outlier of four pods loses its draft: acceptance below cohort fires",
            outlier(wrong_layers),
            [("67m", a, []), ("67m30s", a, [(p3, "19%")])],
            fault_at="60m",
        ),
        Case(
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
        Case(
            "a whole rollout degrades one model (new pods, broken draft): acceptance drop fires "
            "for that model only",
            fleet(new_pods(broken), series((healthy, 150), labels=m0)),
            [
                ("97m", a, []),
                ("97m30s", a, [(cohort(p0), "10%")]),
                ("120m", AlertNames.ACCEPTANCE_BELOW_COHORT, []),
            ],
            fault_at="90m",
        ),
        Case(
            "draft wired to the wrong hidden layers on a fixed server: acceptance drop fires",
            series((healthy, hour), (wrong_layers, hour)),
            [("67m", a, []), ("67m30s", a, [(cohort(server), "19%")])],
            fault_at="60m",
        ),
        Case(
            "a rollout with a healthy draft, a load drop and mild drift: no acceptance drop",
            fleet(
                series((healthy, 90), labels=p0),
                series((load_drop, 20), (drift, 40), labels=p2, start=90),
            ),
            [("95m", a, []), ("110m", a, []), ("145m", a, [])],
        ),
    ]
    return cases


def _throughput_cases() -> list[Case]:
    """Per-sequence speed against the cohort and against the past: load is no fault."""
    cases: list[Case] = []
    a = AlertNames.DECODE_THROUGHPUT_BELOW_COHORT
    cases += [
        Case(
            "one pod's cycle time doubles at the fleet's load: throughput below cohort fires",
            outlier(slow),
            [("68m", a, []), ("68m30s", a, [(p3, "150.0")])],
            fault_at="60m",
        ),
        Case(
            "one pod gets four times the batch (load, not a fault): throughput below cohort silent",
            outlier(load_rise),
            [("70m", a, []), ("110m", a, [])],
        ),
    ]
    a = AlertNames.COHORT_THROUGHPUT_DROP
    cases += [
        Case(
            "a rollout slows every pod of one model (new pods): cohort throughput drop fires",
            new_pods(slow),
            [("104m", a, []), ("104m30s", a, [(cohort(p0), "150.0")])],
            fault_at="90m",
        ),
        Case(
            "a rollout under four times the load: cohort throughput drop silent",
            fleet(series((healthy, 90), labels=p0), series((load_rise, hour), labels=p2, start=90)),
            [("100m", a, []), ("140m", a, [])],
        ),
    ]
    a = AlertNames.DECODE_THROUGHPUT_DROP
    cases += [
        Case(
            "cycle time doubles at constant load: throughput drop fires",
            series((healthy, hour), (slow, hour)),
            # At 63m the rate sits exactly at 70% of the reference, so whether that evaluation
            # counts depends on the reference's last bit (its 5m averages sampled every
            # evaluation or every 5m): 73m is left unchecked.
            [("72m30s", a, []), ("73m30s", a, [(server, "150.0")])],
            fault_at="60m",
        ),
        Case(
            "load drop (fewer requests, far fewer tokens/s): no throughput drop",
            series((healthy, hour), (load_drop, hour)),
            [("75m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
        Case(
            "load rise (each sequence slower, server faster): no throughput drop",
            series((healthy, hour), (load_rise, hour)),
            [("75m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
    ]
    return cases


def _speedup_and_phase_cases() -> list[Case]:
    """Speedup below the baseline, and a phase slower than its cohort or its past."""
    cases: list[Case] = []
    a = AlertNames.SPECULATION_SLOWER_THAN_BASELINE
    cases += [
        Case(
            "realized per-sequence speed below the baseline: slower than baseline fires",
            series((below_baseline, 30)),
            [("15m30s", a, []), ("16m", a, [({**server, "source": "configured"}, "0.80")])],
            fault_at="0m",
        ),
        Case(
            "below a baseline the engine measured itself: fires, labelled with its source",
            series((below_measured, 30)),
            [("15m30s", a, []), ("16m", a, [({**server, "source": "demo_measured"}, "0.80")])],
            fault_at="0m",
        ),
        Case(
            "3x faster than the baseline, or no baseline configured: does not fire",
            series((healthy, 15), (unbaselined, 15)),
            [("14m", a, []), ("29m", a, [])],
        ),
    ]
    a = AlertNames.PHASE_LATENCY_ABOVE_COHORT
    cases += [
        Case(
            "verify doubles on one pod at the fleet's batch size: phase above cohort fires",
            outlier(verify_slow),
            [
                ("67m30s", a, []),
                ("68m", a, [({**p3, "phase": "verify", "clock": "gpu"}, "12ms")]),
            ],
            fault_at="60m",
        ),
        Case(
            "verify doubles on one pod because its batch doubled: phase above cohort silent",
            outlier(verify_slow_bigger_batch),
            [("70m", a, []), ("110m", a, [])],
        ),
    ]
    a = AlertNames.PHASE_LATENCY_REGRESSION
    cases += [
        Case(
            "verify doubles at constant batch size: phase regression fires",
            series((healthy, hour), (verify_slow, hour)),
            [
                ("77m30s", a, []),
                ("78m", a, [({**server, "phase": "verify", "clock": "gpu"}, "12ms")]),
            ],
            fault_at="60m",
        ),
        Case(
            "verify doubles because the batch doubled (load): no phase regression",
            series((healthy, hour), (verify_slow_bigger_batch, hour)),
            [("80m", a, []), ("90m", a, []), ("115m", a, [])],
        ),
    ]
    return cases


def _stall_cases() -> list[Case]:
    """Requests waiting or running with no cycle, on every kind of engine."""
    cases: list[Case] = []
    a = AlertNames.DECODING_STALLED
    host = {**GROUP, "host": "10.0.0.1"}
    quarter = 4 * 30  # 15 s steps: 30 minutes
    for style in ("vllm", "sglang"):
        cases.append(
            Case(
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
        Case(
            "demo-style (specobs's own request gauges): requests waiting, no cycles: stalled",
            series((healthy, hour), (replace(healthy, cycles_per_second=0.0, waiting=5.0), 30)),
            [("61m", a, []), ("61m30s", a, [(host, "8")])],
            fault_at="60m",
        ),
        Case(
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
    return cases


def _scrape_cases() -> list[Case]:
    """An exporter that cannot be scraped, a target that is gone, records dropped."""
    cases: list[Case] = []
    a = AlertNames.EXPORTER_DOWN
    target = {k: v for k, v in server.items() if k not in LLAMA}
    cases += [
        Case(
            "scrapes fail: exporter down fires",
            series((healthy, 10), (down, 20)),
            [("15m30s", a, []), ("16m", a, [(target, "0")])],
            fault_at="10m",
        ),
        Case(
            "scrapes succeed: exporter down does not fire", series((healthy, 30)), [("20m", a, [])]
        ),
    ]
    a = AlertNames.TARGET_MISSING
    cases += [
        Case(
            "no specobs target at all: target missing fires",
            [{"series": 'up{job="node", instance="host:9100"}', "values": "1+0x30"}],
            [("14m30s", a, []), ("15m", a, [({"job": "specobs"}, "1")])],
            fault_at="0m",
        ),
        Case(
            "a specobs target exists: target missing does not fire",
            series((down, 30)),
            [("20m", a, [])],
        ),
    ]
    a = AlertNames.EXPORTER_DROPPING_RECORDS
    cases += [
        Case(
            "5% of cycle records dropped: dropping records fires",
            series((healthy, 10), (dropping, 30)),
            [("26m", a, []), ("26m30s", a, [({**server, "reason": "queue_full"}, "5%")])],
            fault_at="10m",
        ),
        Case(
            "0.1% of cycle records dropped: dropping records does not fire",
            series((trickle, 30)),
            [("25m", a, [])],
        ),
        Case(
            "5% of cycles raised in the engine (reason exception): not specobs dropping records",
            series((healthy, 10), (raising, 30)),
            [("26m30s", a, []), ("39m", a, [])],
        ),
    ]
    return cases


def _request_cases() -> list[Case]:
    """A jump in the requests that accept almost nothing."""
    cases: list[Case] = []
    a = AlertNames.LOW_ACCEPTANCE_REQUESTS_JUMP
    serving = replace(healthy, requests_per_second=1.0)
    # One slot of several collapses: 40% of requests now accept <= 20%.
    collapsed = replace(serving, low_acceptance_share=0.4)
    cases += [
        Case(
            "a server's share of low-acceptance requests jumps from 5% to 40%: fires",
            series((serving, 90), (collapsed, 30)),
            # The 15m share passes 10% (and twice the past's 5%) at 93m; held 5 minutes.
            [("97m30s", a, []), ("98m", a, [(server, "23.67%")])],
            fault_at="90m",
        ),
        Case(
            "a quiet server (one request a minute) jumps to 40%: silent, too few requests",
            series((replace(serving, requests_per_second=1 / 60), 90),
                   (replace(collapsed, requests_per_second=1 / 60), 30)),
            [("100m", a, []), ("119m", a, [])],
        ),
        Case(
            "a steady 30% of low-acceptance requests, and a rise from 5% to 8%: silent",
            fleet(
                series((replace(serving, low_acceptance_share=0.3), 120), labels=p0),
                series((serving, 90), (replace(serving, low_acceptance_share=0.08), 30),
                       labels=p1),
            ),
            [("100m", a, []), ("119m", a, [])],
        ),
    ]
    return cases


def _silent_cases() -> list[Case]:
    """A quiet fleet and a restart: no alert at all."""
    cases: list[Case] = []
    every = [alert.alert for alert in alert_rules(MixinConfig())]
    cases += [
        Case(
            "a quiet but healthy fleet (a trickle of traffic, one idle pod): no alert at all",
            fleet(
                series((healthy, hour), (quiet, hour), labels=p0),
                series((quiet, 2 * hour), labels=p1),
                series((healthy, 30), (idle, 90), labels=p2),
            ),
            [(t, name, []) for t in ("70m", "110m") for name in every],
        ),
        Case(
            "a restart (counters reset to zero on the same pod): no alert at all",
            fleet(
                server_series([(healthy, 2 * hour)], p0, restart_at=hour),
                series((healthy, 2 * hour), labels=p1),
            ),
            [(t, name, []) for t in ("61m", "63m", "70m", "90m") for name in every],
        ),
    ]
    return cases
    return cases


def cases() -> list[Case]:
    """Every alert case, in the order of the alerts."""
    return [
        *_acceptance_cases(),
        *_throughput_cases(),
        *_speedup_and_phase_cases(),
        *_stall_cases(),
        *_scrape_cases(),
        *_request_cases(),
        *_silent_cases(),
    ]
