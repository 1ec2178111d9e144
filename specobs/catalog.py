"""The metric catalog: the single source of every series specobs exports.

Every metric's OpenTelemetry name, kind, unit, help text, labels and bucket boundaries live here.
The Prometheus sink, the OTLP sink, the dashboard and rule generators and ``docs/metrics.md`` all
read this module; nothing else spells a metric name.

Prometheus names are *derived* from the OpenTelemetry name and unit with the OpenTelemetry
specification's translation rules (``prometheus_name``), so a series is called the same whether it
was scraped from the specobs endpoint or pushed over OTLP through a Collector's Prometheus
exporter: ``specobs.phase.duration`` with unit ``s`` is ``specobs_phase_duration_seconds``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# The rule for label values is its own module; these names are the catalog's too.
from specobs._labels import (
    DEFAULT_MAX_LABEL_VALUE_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    exportable_label_value,
    label_value_problem,
)

__all__ = [
    "ACCEPTED_BY_DRAFT_LENGTH",
    "ACCEPTED_BY_POSITION",
    "ACCEPTED_TOKENS",
    "ACCEPT_LENGTH",
    "BASELINE_SEQUENCE_TOKENS",
    "BASELINE_SOURCE_CONFIGURED",
    "BASELINE_SOURCE_PLAIN_STEPS",
    "BATCH_SIZE",
    "BATCH_SIZE_BUCKETS",
    "CATALOG",
    "CYCLES",
    "CYCLES_BY_DRAFT_LENGTH",
    "CYCLE_DURATION",
    "CYCLE_GAP",
    "CYCLE_SPAN_NAME",
    "DEFAULT_MAX_LABEL_VALUE_LENGTH",
    "DRAFTED_BY_DRAFT_LENGTH",
    "DRAFTED_BY_POSITION",
    "DRAFT_LENGTH",
    "DRAFT_TOKENS",
    "DRAFT_TOKENS_UNVERIFIED",
    "DROPPED_RECORDS",
    "DROP_REASONS",
    "DROP_REASON_EXCEPTION",
    "DURATION_BUCKETS_SECONDS",
    "EMITTED_BY_DRAFT_LENGTH",
    "EMITTED_TOKENS",
    "ERRORS",
    "ERROR_KINDS",
    "EXEMPLAR_SPAN_ID_LABEL",
    "EXEMPLAR_TRACE_ID_LABEL",
    "EXPORTER_CPU",
    "IDLE_GAPS",
    "INFO",
    "LAST_CYCLE_TIMESTAMP",
    "MAX_LABEL_VALUE_LENGTH",
    "OVERHEAD_RATIO",
    "PHASE_DURATION",
    "PHASE_TIME_BY_DRAFT_LENGTH",
    "PLAIN_STEPS_MIN_CYCLES",
    "REQUESTS_FINISHED",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "REQUEST_ACCEPTANCE",
    "REQUEST_ACCEPTANCE_BUCKETS",
    "REQUEST_ACCEPTANCE_EXEMPLAR_MAX",
    "SAMPLED_CYCLES",
    "SAMPLING_BUDGET",
    "SAMPLING_INTERVAL",
    "SEQUENCES_BY_DRAFT_LENGTH",
    "SPAN_ATTRIBUTES",
    "WORKER_THREAD_TIME",
    "Metric",
    "SpanAttribute",
    "accept_length_buckets",
    "by_prometheus_name",
    "draft_length_buckets",
    "exportable_label_value",
    "label_value_problem",
    "prometheus_name",
]

Kind = Literal["counter", "histogram", "gauge", "info"]

#: Phase and cycle duration buckets, seconds: a 1-2.5-5 series from 10 µs to 5 s. Small EAGLE
#: cycles on a data-center GPU sit around 0.3-1 ms with phases of tens of microseconds; CPU
#: engines and large batches reach hundreds of milliseconds.
DURATION_BUCKETS_SECONDS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005,
    0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
)  # fmt: skip

#: Batch size buckets: powers of two up to 1024 sequences.
BATCH_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(11))

#: Per-request acceptance buckets (a finished request's accepted / drafted draft tokens): 0 alone
#: (a request whose every draft was rejected), fine steps at both ends, where a collapsed slot
#: (a few percent up to about half) and a looping output (near 1) sit.
REQUEST_ACCEPTANCE_BUCKETS: tuple[float, ...] = (
    0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
)  # fmt: skip
#: The per-request acceptance histogram keeps exemplars (the latest traced request in each) on
#: its buckets up to this bound only: the worst requests, at most 5 exemplars.
REQUEST_ACCEPTANCE_EXEMPLAR_MAX = 0.3

#: The labels of the exemplars on the duration histograms (OpenMetrics): the traced cycle's ids
#: as W3C trace-context hex. Grafana finds a trace by the first (its Prometheus datasource's
#: ``exemplarTraceIdDestinations``, deploy/grafana/provisioning/datasources/specobs.yml).
EXEMPLAR_TRACE_ID_LABEL = "trace_id"
EXEMPLAR_SPAN_ID_LABEL = "span_id"

#: The drop reason that is the engine's failure, not specobs's: a cycle the engine raised in,
#: discarded. The dropped-records alert and ``doctor`` leave it out of specobs's own drops.
DROP_REASON_EXCEPTION = "exception"
#: Why a cycle record was dropped before it reached the aggregation.
DROP_REASONS: tuple[str, ...] = (
    "queue_full",  # the worker produced records faster than the resolver drained them
    "event_pool_exhausted",  # no free CUDA event: the cycle was counted but not GPU-timed
    "graph_capture",  # the cycle ran while a CUDA graph was being captured
    "misuse",  # the hot path was called out of order; the cycle was discarded
    DROP_REASON_EXCEPTION,  # the engine raised inside ``with observer.cycle()``: discarded
    "shutdown",  # records still pending when shutdown() ran out of time
    "fork",  # records inherited from the parent process after fork()
    "span_export",  # cycle spans the OTLP exporter dropped (queue full, collector down)
    "metric_export",  # OTLP metric exports that failed (the next export resends cumulative data)
    "resolver_error",  # cycles whose Python stages raised (a specobs bug; logged)
    "unsettled",  # deferred cycles not settled within the timeout: times counted, tokens not
    "clock_backwards",  # a sampled cycle's GPU time read negative: counted without GPU times
    "oversized",  # a cycle's acceptance past max_cycle_sequences / max_queue_bytes: no tokens
)

#: Kinds of hot-path misuse, counted in ``specobs_exporter_errors_total{kind}``.
ERROR_KINDS: tuple[str, ...] = (
    "mark_without_begin",
    "wrong_phase_order",
    "unknown_phase",
    "begin_while_open",
    "end_without_begin",
    "bad_acceptance",
    "bad_batch_size",
    "bad_draft_length",  # begin(draft_length=): not an int in 0..max_draft_length
    "bad_request_counts",
    "bad_request_acceptance",  # request_finished(): not 0 <= accepted <= drafted, or a bad id
    "bad_settle",  # settle() twice, without defer(), or after the cycle's timeout
    "unsupported_engine",
    "internal",
    "sink_error",  # a sink's on_cycles raised (anything, SystemExit included): lost to it alone
    "resolver_restart",  # the resolver's loop ended by an exception and was started again
    "bad_label",  # a label value from the engine broke the label rule: made to fit, exported
    "signal_reentry",  # a hot-path call inside another on its thread (pure-Python core): refused
)


def accept_length_buckets(max_draft_length: int) -> tuple[float, ...]:
    """Buckets for the accept-length histogram: one per possible value, 0..k+1."""
    return tuple(float(i) for i in range(max_draft_length + 2))


def draft_length_buckets(max_draft_length: int) -> tuple[float, ...]:
    """Buckets for the draft-length histogram: one per possible value, 0..k."""
    return tuple(float(i) for i in range(max_draft_length + 1))


@dataclass(frozen=True)
class Metric:
    """One catalog entry.

    ``unit`` is a UCUM unit as OpenTelemetry writes it (``s``, ``1``, ``{token}``).
    ``buckets`` are the explicit histogram boundaries (upper bounds, +Inf implied); ``None`` for
    the accept-length histogram, whose boundaries depend on the configured draft length.
    ``self_metric``: about specobs itself, not the engine.
    """

    otel_name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    self_metric: bool = False
    #: A series that has no value until something sets it (no cycle yet, no baseline configured,
    #: the engine never reported its requests, a kernel without schedstat): left out of every
    #: export until then.
    optional: bool = False

    @property
    def name(self) -> str:
        """The Prometheus name (see :func:`prometheus_name`)."""
        return prometheus_name(self.otel_name, self.unit, self.kind)

    @property
    def base_name(self) -> str:
        """The Prometheus name without the ``_total`` suffix of counters (the family name)."""
        name = self.name
        return name[: -len("_total")] if self.kind == "counter" else name

    def series(self) -> tuple[str, ...]:
        """Every series name this metric produces in the Prometheus text format."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


# OpenTelemetry specification, "Prometheus and OpenMetrics Compatibility", metric name and unit
# translation: units are converted to full words, annotations in braces are dropped, "foo/bar"
# becomes "foo_per_bar", a unit already in the name is not repeated, counters end in "_total",
# and a gauge with unit "1" ends in "_ratio".
_UNIT_WORDS: dict[str, str] = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "KBy": "kilobytes", "MBy": "megabytes",
    "GBy": "gigabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules",
    "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz", "%": "percent",
}  # fmt: skip
_PER_UNIT_WORDS: dict[str, str] = {
    "s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month",
    "y": "year",
}  # fmt: skip


def _unit_suffix(unit: str) -> str:
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if not unit or unit == "1":
        return ""
    if "/" in unit:
        num, _, den = unit.partition("/")
        num_word = _UNIT_WORDS.get(num, num) if num else ""
        den_word = _PER_UNIT_WORDS.get(den, _UNIT_WORDS.get(den, den))
        return f"{num_word}_per_{den_word}" if num_word else f"per_{den_word}"
    return _UNIT_WORDS.get(unit, unit)


def prometheus_name(otel_name: str, unit: str, kind: Kind) -> str:
    """Translate an OpenTelemetry metric name and unit into its Prometheus name.

    >>> prometheus_name("specobs.phase.duration", "s", "histogram")
    'specobs_phase_duration_seconds'
    >>> prometheus_name("specobs.cycles", "{cycle}", "counter")
    'specobs_cycles_total'
    """
    name = re.sub(r"[^a-zA-Z0-9_:]", "_", otel_name)
    name = re.sub(r"__+", "_", name)
    suffix = _unit_suffix(unit)
    if kind == "info":
        return name if name.endswith("_info") else f"{name}_info"
    if suffix and not name.endswith(suffix) and f"_{suffix}_" not in f"{name}_":
        name = f"{name}_{suffix}"
    if kind == "gauge" and unit == "1" and not name.endswith("_ratio"):
        name = f"{name}_ratio"
    if kind == "counter" and not name.endswith("_total"):
        name = f"{name}_total"
    return name


PHASE_DURATION = Metric(
    "specobs.phase.duration", "histogram", "s",
    "Time spent in one phase of a speculative decoding cycle, by phase and clock "
    "(gpu: CUDA events on sampled cycles; host: perf_counter on every cycle).",
    labels=("phase", "clock"), buckets=DURATION_BUCKETS_SECONDS,
)  # fmt: skip
CYCLE_DURATION = Metric(
    "specobs.cycle.duration", "histogram", "s",
    "Duration of a whole speculative decoding cycle (draft + verify + bookkeeping), by clock.",
    labels=("clock",), buckets=DURATION_BUCKETS_SECONDS,
)  # fmt: skip
CYCLE_GAP = Metric(
    "specobs.cycle.gap", "histogram", "s",
    "Host seconds from the end of one cycle to the begin of the next cycle the same thread "
    "recorded on this observer (cycles of every draft length, plain k = 0 steps included): "
    "the engine's time outside speculative cycles (its scheduler, detokenisation, Python "
    "between steps). A thread's first cycle has no gap. A gap longer than idle_gap_seconds "
    "(SPECOBS_IDLE_GAP_SECONDS, default 1 s) is the engine idling: counted in "
    "specobs_cycle_idle_gaps_total instead. A cycle specobs never resolves (dropped when the "
    "queue was full; discarded: misuse, an exception, CUDA graph capture) ends the gaps: the "
    "next cycle of every thread starts afresh, so no gap spans a lost cycle.",
    buckets=DURATION_BUCKETS_SECONDS,
)  # fmt: skip
IDLE_GAPS = Metric(
    "specobs.cycle.idle_gaps", "counter", "{gap}",
    "Gaps between two cycles of one thread longer than idle_gap_seconds "
    "(SPECOBS_IDLE_GAP_SECONDS, default 1 s): the engine idling, not its overhead between "
    "cycles, so left out of specobs_cycle_gap_seconds.",
)  # fmt: skip
CYCLES = Metric(
    "specobs.cycles", "counter", "{cycle}",
    "Speculative decoding cycles completed (every cycle is counted, sampled or not).",
)  # fmt: skip
DRAFT_TOKENS = Metric(
    "specobs.draft_tokens", "counter", "{token}",
    "Draft tokens proposed, summed over the sequences of each cycle.",
)  # fmt: skip
DRAFT_TOKENS_UNVERIFIED = Metric(
    "specobs.draft_tokens.unverified", "counter", "{token}",
    "Draft tokens the engine proposed and then left out of verification (an adaptive verify "
    "budget trimmed them: SGLang DSpark's ragged windows), not in specobs_draft_tokens_total. "
    "Absent until the engine reports some (Observer.drafts_unverified).",
    optional=True,
)  # fmt: skip
ACCEPTED_TOKENS = Metric(
    "specobs.accepted_tokens", "counter", "{token}",
    "Draft tokens accepted by the target model's verification.",
)  # fmt: skip
EMITTED_TOKENS = Metric(
    "specobs.emitted_tokens", "counter", "{token}",
    "Tokens emitted to sequences (accepted draft tokens plus the target's bonus token).",
)  # fmt: skip
ACCEPT_LENGTH = Metric(
    "specobs.accept_length", "histogram", "{token}",
    "Accepted draft tokens per draft (a sequence that drafted at least one token) per cycle "
    "(0..k); its count is the number of drafts.",
    buckets=None,
)  # fmt: skip
ACCEPTED_BY_POSITION = Metric(
    "specobs.accepted_tokens_by_position", "counter", "{token}",
    "Accepted draft tokens by draft position (0 = the first drafted token).",
    labels=("position",),
)  # fmt: skip
DRAFTED_BY_POSITION = Metric(
    "specobs.draft_tokens_by_position", "counter", "{token}",
    "Draft tokens proposed by draft position; the denominator of per-position acceptance.",
    labels=("position",),
)  # fmt: skip
DRAFT_LENGTH = Metric(
    "specobs.draft.length", "histogram", "{token}",
    "Draft length in effect per cycle: the k the engine scheduled for the cycle's draft phase "
    "(begin(draft_length=)), else the draft length its acceptance named (an int, or the "
    "largest of one per sequence); 0 is a step that drafted nothing. One observation per cycle "
    "that has one; cycles with none are left out. Buckets: one per value 0..max_draft_length.",
    buckets=None,
)  # fmt: skip
CYCLES_BY_DRAFT_LENGTH = Metric(
    "specobs.cycles_by_draft_length", "counter", "{cycle}",
    "Cycles by the draft length in effect (as specobs_draft_length counts them); label "
    "draft_length is the decimal k, only the lengths seen.",
    labels=("draft_length",), optional=True,
)  # fmt: skip
PHASE_TIME_BY_DRAFT_LENGTH = Metric(
    "specobs.phase.time_by_draft_length", "counter", "s",
    "Host-clock seconds spent in each phase by the cycles of each draft length in effect "
    "(perf_counter on every cycle, deferred ones included); divided by "
    "specobs_cycles_by_draft_length_total, the mean phase time at that k.",
    labels=("phase", "draft_length"), optional=True,
)  # fmt: skip
EMITTED_BY_DRAFT_LENGTH = Metric(
    "specobs.emitted_tokens_by_draft_length", "counter", "{token}",
    "Tokens emitted to sequences by the cycles of each draft length in effect (the cycle's k, "
    "as specobs_draft_length counts it); over the phase seconds, throughput at that k.",
    labels=("draft_length",), optional=True,
)  # fmt: skip
SEQUENCES_BY_DRAFT_LENGTH = Metric(
    "specobs.sequences_by_draft_length", "counter", "{sequence}",
    "Sequences decoded by the cycles of each draft length in effect: their batch sizes summed "
    "by the cycle's k (as specobs_draft_length counts it; a cycle without a batch size adds "
    "none). Over specobs_cycles_by_draft_length_total, the mean batch at that k; batch x "
    "(k + 1) is the tokens the target verified per cycle.",
    labels=("draft_length",), optional=True,
)  # fmt: skip
ACCEPTED_BY_DRAFT_LENGTH = Metric(
    "specobs.accepted_tokens_by_draft_length", "counter", "{token}",
    "Accepted draft tokens by each sequence's own draft length (the drafts it verified, which "
    "may differ from the cycle's k: vLLM verifies the previous step's drafts); over "
    "specobs_draft_tokens_by_draft_length_total, acceptance at that k.",
    labels=("draft_length",), optional=True,
)  # fmt: skip
DRAFTED_BY_DRAFT_LENGTH = Metric(
    "specobs.draft_tokens_by_draft_length", "counter", "{token}",
    "Draft tokens verified by each sequence's own draft length: k times the sequences that "
    "verified k drafts; the denominator of acceptance at that k.",
    labels=("draft_length",), optional=True,
)  # fmt: skip
BATCH_SIZE = Metric(
    "specobs.batch_size", "histogram", "{sequence}",
    "Sequences decoded together in one speculative cycle.",
    buckets=BATCH_SIZE_BUCKETS,
)  # fmt: skip
INFO = Metric(
    "specobs.info", "info", "",
    "specobs build and configuration: version, phases, clock, sampling (adaptive, or every_N for "
    "a fixed interval), the integration that records (manual, vllm_v1, vllm_v2, sglang, "
    "transformers; unsupported when the engine built something specobs cannot time) and the "
    "ring the hot path writes (core: native or python).",
    labels=("version", "phases", "gpu_clock", "sampling", "integration", "core"),
)  # fmt: skip
LAST_CYCLE_TIMESTAMP = Metric(
    "specobs.last_cycle.timestamp", "gauge", "s",
    "Unix time at which the most recent cycle ended.",
    optional=True,
)  # fmt: skip
BASELINE_SEQUENCE_TOKENS = Metric(
    "specobs.baseline.sequence_tokens", "gauge", "{token}/s",
    "Non-speculative decode rate of one sequence (tokens/s) at the batch size served, the "
    "baseline speculation must beat; label source says who measured it (none: configured; "
    "plain_steps: k0 cycles / host seconds of the cycles of draft length 0, cumulative, once 16 "
    "ran and none was configured). Absent when there is none.",
    optional=True,
)  # fmt: skip
# Configured (``SPECOBS_BASELINE_TOKENS_PER_SECOND``): no ``source`` label, which the recording
# rules read as ``source="configured"``. Measured by the engine: ``source`` names how (``specobs
# demo``: ``demo_measured``, plain decode steps of the served batch between cycles).
#: The ``source`` of a baseline gauge that has no ``source`` label: set by configuration
#: (``SPECOBS_BASELINE_TOKENS_PER_SECOND``), not measured by the engine.
BASELINE_SOURCE_CONFIGURED = "configured"
#: The ``source`` of a baseline measured from the cycles that drafted nothing (draft length 0,
#: one token per sequence): ``k0 cycles / host seconds of k0 cycles``, cumulative since the
#: observer started, exported once :data:`PLAIN_STEPS_MIN_CYCLES` of them ran and no baseline
#: was configured (a configured one wins).
BASELINE_SOURCE_PLAIN_STEPS = "plain_steps"
#: Cycles of draft length 0 the measured ``plain_steps`` baseline needs before it is exported.
PLAIN_STEPS_MIN_CYCLES = 16
REQUESTS_RUNNING = Metric(
    "specobs.requests.running", "gauge", "{request}",
    "Requests being decoded, as reported by the engine.",
    optional=True,
)  # fmt: skip
REQUESTS_WAITING = Metric(
    "specobs.requests.waiting", "gauge", "{request}",
    "Requests waiting to be scheduled, as reported by the engine.",
    optional=True,
)  # fmt: skip
REQUEST_ACCEPTANCE = Metric(
    "specobs.request.acceptance", "histogram", "1",
    "Acceptance rate of each finished request (its accepted / drafted draft tokens over its "
    "whole life), as the engine reports it when the request finishes; a request that drafted "
    "nothing is not observed. Exemplars on the lowest buckets carry the worst requests' trace "
    "ids. Absent until the engine reports a finished request.",
    buckets=REQUEST_ACCEPTANCE_BUCKETS, optional=True,
)  # fmt: skip
REQUESTS_FINISHED = Metric(
    "specobs.requests.finished", "counter", "{request}",
    "Requests the engine reported finished, including those that drafted nothing (which "
    "specobs_request_acceptance leaves out). Absent until the engine reports one.",
    optional=True,
)  # fmt: skip
DROPPED_RECORDS = Metric(
    "specobs.exporter.dropped_records", "counter", "{record}",
    "Cycle records specobs dropped or could not GPU-time, by reason.",
    labels=("reason",), self_metric=True,
)  # fmt: skip
SAMPLED_CYCLES = Metric(
    "specobs.exporter.sampled_cycles", "counter", "{cycle}",
    "Cycles timed on the GPU clock with CUDA events.",
    self_metric=True,
)  # fmt: skip
SAMPLING_INTERVAL = Metric(
    "specobs.exporter.sampling_interval", "gauge", "{cycle}",
    "Current GPU sampling interval: one cycle in this many is timed with CUDA events.",
    self_metric=True,
)  # fmt: skip
SAMPLING_BUDGET = Metric(
    "specobs.exporter.sampling_budget", "gauge", "1",
    "Overhead budget the adaptive GPU sampler holds the GPU timing's cost under, as a fraction "
    "of cycle time (configured; absent when the sampling interval is fixed).",
    self_metric=True, optional=True,
)  # fmt: skip
OVERHEAD_RATIO = Metric(
    "specobs.exporter.overhead", "gauge", "1",
    "Self-measured cost of specobs on the worker (GPU event records, phase boundaries, CUDA "
    "acceptance copies, resolver CPU) as a fraction of cycle time: an estimate from host "
    "clocks (docs/metrics.md says how near the measured loss it reads).",
    self_metric=True,
)  # fmt: skip
EXPORTER_CPU = Metric(
    "specobs.exporter.cpu.time", "counter", "s",
    "CPU time specobs spent, by component (hot_path: event recording on sampled cycles; "
    "acceptance_copy: copying CUDA acceptance tensors to the host, on the engine's thread; "
    "resolver; prometheus: scrapes; otlp: exports).",
    labels=("component",), self_metric=True,
)  # fmt: skip
WORKER_THREAD_TIME = Metric(
    "specobs.worker.thread.time", "counter", "s",
    "Time the thread that records cycles spent on a CPU (state=running) and runnable but "
    "waiting for a CPU (state=waiting), from Linux schedstat; waiting time grows when other "
    "work on the host takes the CPUs, and lengthens every phase by it. Absent where the kernel "
    "does not keep it.",
    labels=("state",), optional=True,
)  # fmt: skip
ERRORS = Metric(
    "specobs.exporter.errors", "counter", "{error}",
    "Hot-path misuse and internal errors, by kind. The worker is never interrupted.",
    labels=("kind",), self_metric=True,
)  # fmt: skip

#: Every metric, in exposition order.
CATALOG: tuple[Metric, ...] = (
    PHASE_DURATION,
    CYCLE_DURATION,
    CYCLE_GAP,
    IDLE_GAPS,
    CYCLES,
    DRAFT_TOKENS,
    DRAFT_TOKENS_UNVERIFIED,
    ACCEPTED_TOKENS,
    EMITTED_TOKENS,
    ACCEPT_LENGTH,
    ACCEPTED_BY_POSITION,
    DRAFTED_BY_POSITION,
    DRAFT_LENGTH,
    CYCLES_BY_DRAFT_LENGTH,
    PHASE_TIME_BY_DRAFT_LENGTH,
    EMITTED_BY_DRAFT_LENGTH,
    SEQUENCES_BY_DRAFT_LENGTH,
    ACCEPTED_BY_DRAFT_LENGTH,
    DRAFTED_BY_DRAFT_LENGTH,
    BATCH_SIZE,
    INFO,
    LAST_CYCLE_TIMESTAMP,
    BASELINE_SEQUENCE_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    REQUEST_ACCEPTANCE,
    REQUESTS_FINISHED,
    DROPPED_RECORDS,
    SAMPLED_CYCLES,
    SAMPLING_INTERVAL,
    SAMPLING_BUDGET,
    OVERHEAD_RATIO,
    EXPORTER_CPU,
    WORKER_THREAD_TIME,
    ERRORS,
)


def by_prometheus_name() -> dict[str, Metric]:
    """Map every Prometheus series name (including ``_bucket``/``_sum``/``_count``) to its entry."""
    out: dict[str, Metric] = {}
    for metric in CATALOG:
        for series in metric.series():
            out[series] = metric
    return out


# -- traces ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanAttribute:
    """One attribute the OTLP sink sets on the spans of a traced cycle.

    ``type`` is the OpenTelemetry attribute type (``string`` or ``int``); ``spans`` says which
    spans carry it: ``cycle`` (the ``specobs.cycle`` span), ``phase`` (its child span per
    phase) or ``both``; ``conditional``: set only when the cycle recorded what it reports.
    """

    key: str
    type: Literal["string", "int"]
    brief: str
    spans: Literal["cycle", "phase", "both"]
    conditional: bool = False


#: The name of the span of a traced cycle; each phase is a child span named after the phase.
CYCLE_SPAN_NAME = "specobs.cycle"

#: Every ``specobs.*`` span attribute, in the order the cycle span sets them.
SPAN_ATTRIBUTES: tuple[SpanAttribute, ...] = (
    SpanAttribute("specobs.cycle.index", "int",
                  "Index of the cycle among the cycles of its observer, from 0.", "both"),
    SpanAttribute("specobs.clock", "string",
                  "Clock the span durations come from: gpu (CUDA events) or host.", "both"),
    SpanAttribute("specobs.host_duration_ns", "int",
                  "Host-clock duration of the span, in nanoseconds, whatever its clock.", "both"),
    SpanAttribute("specobs.batch_size", "int",
                  "Sequences decoded together in the cycle.", "cycle", conditional=True),
    SpanAttribute("specobs.draft_tokens", "int",
                  "Draft tokens the cycle's sequences verified.", "cycle", conditional=True),
    SpanAttribute("specobs.accepted_tokens", "int",
                  "Draft tokens the target model accepted in the cycle.", "cycle",
                  conditional=True),
    SpanAttribute("specobs.emitted_tokens", "int",
                  "Tokens the cycle emitted to its sequences (accepted plus bonus tokens).",
                  "cycle", conditional=True),
)
