"""Synthetic servers for the promtool rule tests: a server is a timeline of steady
:class:`ServerState` segments, one sample a step; counters are integrated from the rates, so
every input is self-consistent. :func:`server_series` writes a specobs server's series in
promtool's ``a+bxn`` notation, :func:`engine_series` an engine's own request gauges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import specobs.catalog as c
from specobs.mixin._config import MixinConfig

__all__ = ["GROUP", "LABELS", "LLAMA", "MISTRAL", "ServerState", "engine_series", "notation",
           "pod", "selector", "server_series"]

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


def notation(values: list[float | None]) -> str:
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


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return name + "{" + inner + "}"


class _Writer:
    """The series of one server as they are written: counters integrated from per-second rates
    (their first sample zero), gauges as given, each after ``start`` missing samples."""

    def __init__(self, start: int, restart_at: int | None, step_seconds: float) -> None:
        self.series: dict[str, list[float | None]] = {}
        self.pad: list[float | None] = [None] * start
        self.restart_at = restart_at
        self.step_seconds = step_seconds

    def counter(self, name: str, labels: dict[str, str], per_second: list[float]) -> None:
        total, values = 0.0, [0.0]
        for i, rate in enumerate(per_second):
            if self.restart_at is not None and i == self.restart_at:
                total = 0.0
            total += rate * self.step_seconds
            values.append(total)
        self.series[selector(name, labels)] = [*self.pad, *values]

    def gauge(self, name: str, labels: dict[str, str], values: list[float | None]) -> None:
        if any(v is not None for v in values):
            self.series[selector(name, labels)] = [*self.pad, values[0], *values]


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
    out = _Writer(start, restart_at, step_seconds)
    _tokens(out, steps, labels)
    _times(out, steps, labels)
    _requests_and_drops(out, steps, labels)
    _gauges(out, steps, labels, start)
    return [{"series": k, "values": notation(v)} for k, v in out.series.items()]


def _tokens(out: _Writer, steps: list[ServerState], labels: dict[str, str]) -> None:
    """Cycles, sequences, and the tokens emitted, drafted and accepted."""
    cycles = [s.cycles_per_second for s in steps]
    sequences = [s.cycles_per_second * s.batch_size for s in steps]
    drafted = [q * s.draft_per_sequence for q, s in zip(sequences, steps, strict=True)]
    out.counter(c.CYCLES.name, labels, cycles)
    out.counter(f"{c.BATCH_SIZE.name}_sum", labels, sequences)
    out.counter(f"{c.BATCH_SIZE.name}_count", labels, cycles)
    out.counter(c.EMITTED_TOKENS.name, labels,
                [q * s.emitted for q, s in zip(sequences, steps, strict=True)])
    out.counter(c.DRAFT_TOKENS.name, labels, drafted)
    out.counter(c.ACCEPTED_TOKENS.name, labels,
                [d * s.acceptance for d, s in zip(drafted, steps, strict=True)])


def _times(out: _Writer, steps: list[ServerState], labels: dict[str, str]) -> None:
    """The cycle's time on the host clock, the gaps between cycles, and each phase's time."""
    cycles = [s.cycles_per_second for s in steps]
    host = {**labels, "clock": "host"}
    out.counter(f"{c.CYCLE_DURATION.name}_sum", host,
                [s.cycles_per_second * s.cycle_seconds for s in steps])
    out.counter(f"{c.CYCLE_DURATION.name}_count", host, cycles)
    if any(s.gap_seconds is not None for s in steps):
        out.counter(f"{c.CYCLE_GAP.name}_sum", labels,
                    [s.cycles_per_second * (s.gap_seconds or 0.0) for s in steps])
        out.counter(f"{c.CYCLE_GAP.name}_count", labels, cycles)
    phases = [("gpu", p, [s.phase_gpu_seconds[p] for s in steps])
              for p in steps[0].phase_gpu_seconds]
    phases += [("host", p, [(s.phase_host_seconds or {})[p] for s in steps])
               for p in steps[0].phase_host_seconds or {}]
    for clock, phase, seconds in phases:
        timed = {**labels, "phase": phase, "clock": clock}
        out.counter(f"{c.PHASE_DURATION.name}_sum", timed,
                    [s.cycles_per_second * t for s, t in zip(steps, seconds, strict=True)])
        out.counter(f"{c.PHASE_DURATION.name}_count", timed, cycles)


def _requests_and_drops(out: _Writer, steps: list[ServerState], labels: dict[str, str]) -> None:
    """Finished requests and their acceptance, and the records dropped by reason."""
    if any(s.requests_per_second is not None for s in steps):
        requests = [s.requests_per_second or 0.0 for s in steps]
        low = {**labels, "le": repr(float(MixinConfig().request_acceptance_low))}
        out.counter(f"{c.REQUEST_ACCEPTANCE.name}_bucket", low,
                    [r * s.low_acceptance_share for r, s in zip(requests, steps, strict=True)])
        out.counter(f"{c.REQUEST_ACCEPTANCE.name}_count", labels, requests)
        out.counter(c.REQUESTS_FINISHED.name, labels, requests)
    for reason in dict.fromkeys(s.drop_reason for s in steps):
        out.counter(c.DROPPED_RECORDS.name, {**labels, "reason": reason},
                    [s.dropped_per_second if s.drop_reason == reason else 0.0 for s in steps])


def _gauges(out: _Writer, steps: list[ServerState], labels: dict[str, str], start: int) -> None:
    """The last cycle's end, the baseline by source, the request gauges and ``up``."""
    # The last cycle's end: the sample's own time while cycles run, frozen when they stop.
    last: list[float | None] = []
    seen: float | None = None
    for i, s in enumerate(steps):
        if s.cycles_per_second > 0:
            seen = (start + i + 1) * out.step_seconds
        last.append(seen)
    if any(v is not None for v in last):
        out.series[selector(c.LAST_CYCLE_TIMESTAMP.name, labels)] = [*out.pad, None, *last]
    for source in dict.fromkeys(s.baseline_source for s in steps):
        out.gauge(c.BASELINE_SEQUENCE_TOKENS.name,
                  labels if source is None else {**labels, "source": source},
                  [s.baseline if s.baseline_source == source else None for s in steps])
    out.gauge(c.REQUESTS_WAITING.name, labels, [s.waiting for s in steps])
    out.gauge(c.REQUESTS_RUNNING.name, labels, [s.running for s in steps])
    target = {k: v for k, v in labels.items() if k not in LLAMA}
    out.gauge("up", target, [s.up for s in steps])


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
        {"series": selector(name, labels), "values": notation([values[0], *values])}
        for name, values in zip(names, (running, waiting), strict=True)
    ]
