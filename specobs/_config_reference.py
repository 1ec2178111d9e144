"""The configuration reference: every ``SPECOBS_*`` variable and every ``configure()`` argument,
with its default, unit, accepted values, what it bounds and when to change it.

``specobs generate`` renders it into docs/configuration.md. The settings table
(:data:`specobs._config.SETTINGS`) gives what it already knows: a setting's variable, its
default (from :class:`~specobs.Settings`) and its accepted values (from its parser, which holds
the bounds). :data:`SETTING_TEXTS` adds the words for each setting; :data:`VARIABLES` lists the
variables read outside the settings table, each with its reader named.
tests/test_config_reference.py fails on a ``SPECOBS_*`` name in the package that is not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specobs._config import SETTINGS, Settings

__all__ = [
    "GROUPS", "SETTING_TEXTS", "VARIABLES", "Entry", "Text", "Variable", "documented_variables",
    "entries",
]

#: The sections of the reference, in order.
GROUPS: tuple[str, ...] = (
    "Recording", "Tracing", "Multi-process servers", "Exporters", "Engines", "Native core",
    "Demo",
)


@dataclass(frozen=True)
class Text:
    """The words for one setting of :data:`specobs._config.SETTINGS`."""

    group: str
    #: The unit of the value (``"-"`` when it has none).
    unit: str
    #: What it does and what it bounds.
    summary: str
    #: When to change it.
    change: str
    #: The default in words, where the :class:`~specobs.Settings` default (``None``, empty)
    #: does not say it.
    default: str | None = None
    #: What it accepts, where its parser's words (written for the variable) do not fit.
    accepts: str | None = None


@dataclass(frozen=True)
class Variable:
    """A variable read outside the settings table."""

    name: str
    group: str
    #: The default, as Markdown: a value in backticks, or words.
    default: str
    unit: str
    accepts: str
    summary: str
    change: str
    #: Who reads it, and when.
    read: str


@dataclass(frozen=True)
class Entry:
    """One row of the reference, as docs/configuration.md prints it."""

    #: The ``SPECOBS_*`` variable, or ``None`` for a ``configure()`` argument that has none.
    variable: str | None
    #: The ``configure()`` keyword, or ``None`` for a variable read outside the settings.
    argument: str | None
    group: str
    #: As Markdown: a value in backticks, or words.
    default: str
    unit: str
    accepts: str
    summary: str
    change: str
    read: str


SETTING_TEXTS: Mapping[str, Text] = {
    "enabled": Text(
        "Recording", "-",
        "`0` turns every specobs call into a no-op: nothing is recorded, no endpoint is served, "
        "nothing is exported. The engine's code stays as it is.",
        "To run a server without specobs (for example to compare its throughput with and "
        "without) without changing its code or its plugin flags."),
    "phases": Text(
        "Recording", "-",
        "The phases of a cycle, in the order the engine runs them: the values of the `phase` "
        "label.",
        "When a hand-instrumented engine cuts its cycle into other phases. The engine "
        "integrations use the default."),
    "sample_every": Text(
        "Recording", "cycles",
        "GPU-time one cycle in N with CUDA events. Every cycle is counted and host-timed "
        "whatever N is. Unset, N adapts so that recording the events costs at most "
        "`overhead_budget` of the cycle time.",
        "For a benchmark that must GPU-time the same cycles on every run, or `1` to GPU-time "
        "every cycle while debugging (which costs more than the budget).",
        default="unset: adaptive, under `overhead_budget`"),
    "overhead_budget": Text(
        "Recording", "fraction of cycle time",
        "The adaptive sampler's bound: the CUDA event records of the sampled cycles cost at "
        "most this fraction of cycle time. Not used when `sample_every` is set.",
        "Raise it when too few cycles are GPU-timed for the per-phase histograms "
        "(`specobs_exporter_sampled_cycles_total` grows slowly on a slow server); lower it "
        "when the throughput it costs matters more than the GPU times."),
    "clock": Text(
        "Recording", "-",
        "Which clock times the sampled cycles: `auto` uses CUDA events once the engine has "
        "initialised CUDA, `cuda` requires them, `host` never records an event (phases then "
        "have host times only).",
        "`host` on engines that run without a GPU, or to rule the events out while "
        "debugging; `cuda` to fail at start rather than run without GPU times."),
    "queue_size": Text(
        "Recording", "cycle records",
        "Most ended cycles waiting for the resolver thread. It bounds the memory the hot path "
        "holds; when full, the oldest record is dropped and counted as "
        "`specobs_exporter_dropped_records_total{reason=\"queue_full\"}`.",
        "Raise it when `queue_full` drops grow in bursts (the resolver thread gets too little "
        "CPU); the memory held grows in proportion. A quarter of it (16 to 1,024, at most "
        "half) is also how many cycles may wait behind a deferred cycle that is never settled "
        "before it is handed on, `unsettled`, without waiting out `settle_timeout_seconds`."),
    "max_cycle_sequences": Text(
        "Recording", "values per list",
        "The most values one list of a cycle's acceptance may carry (accepted lengths, "
        "per-sequence draft lengths, emitted counts: one per sequence), checked before "
        "anything is copied. A cycle past it keeps its times and batch size, not its tokens "
        "(`specobs_exporter_dropped_records_total{reason=\"oversized\"}`). Acceptance the ring "
        "stores itself takes one byte a sequence in its slot, so at most `queue_size` + 1 "
        "times this.",
        "Raise it only for batches of more sequences than this in one step; lower it to bound "
        "the slots' memory on a small host."),
    "max_queue_bytes": Text(
        "Recording", "bytes",
        "The most the acceptance that waiting cycles keep as objects for the resolver may "
        "hold (lists the ring cannot store itself, emitted counts, per-sequence draft "
        "lengths), as the ring estimates it: 56 bytes and 8 a value per list, 64 for another "
        "object; the default is 64 MiB. A cycle that would take the queue past it keeps its "
        "times, not its tokens (`oversized`).",
        "Raise it when `oversized` drops grow while the resolver keeps up with large batches "
        "that pass `emitted` or draft lengths per sequence."),
    "event_pool_size": Text(
        "Recording", "CUDA events",
        "CUDA events created and recorded once up front, then reused. When none is free a "
        "cycle is counted and host-timed but not GPU-timed "
        "(`specobs_exporter_dropped_records_total{reason=\"event_pool_exhausted\"}`).",
        "Raise it when `event_pool_exhausted` grows: the host runs far ahead of the GPU, so "
        "many sampled cycles' events are still pending."),
    "max_draft_length": Text(
        "Recording", "tokens",
        "The largest draft length k. It bounds the `position` label (k values) and the "
        "accept-length buckets (0..k+1), so the number of series. A cycle that drafts more is "
        "counted as `specobs_exporter_errors_total{kind=\"bad_acceptance\"}` and its tokens "
        "are not.",
        "Set it to at least the engine's largest speculation length (the engine integrations "
        "read it from the engine's configuration)."),
    "labels": Text(
        "Recording", "-",
        "Constant labels on every series, for example "
        "`model_name=llama-3-8b,serving_engine=sglang`.",
        "To tell servers apart on one dashboard: the fleet dashboard and rules group by "
        "`model_name` and `serving_engine`.",
        default="none"),
    "max_label_value_length": Text(
        "Recording", "characters",
        "The longest label value. A longer constant label is refused at `configure()`; a "
        "longer value that reaches the exporters otherwise is cut to it and counted "
        "(`specobs_exporter_errors_total{kind=\"bad_label\"}`).",
        "Raise it only for long values such as model paths: every series repeats each "
        "constant label, so its length multiplies into every scrape and export."),
    "baseline_tokens_per_second": Text(
        "Recording", "tokens/s per sequence",
        "The non-speculative decode rate of one sequence, exported as "
        "`specobs_baseline_sequence_tokens_per_second`: the rate speculation must beat.",
        "Set it from a run without speculation on the same model and hardware, so that the "
        "speedup panels and the slower-than-baseline alert have a reference where the engine "
        "measures none.",
        default="unset: only a baseline the engine measures is exported"),
    "poll_interval_seconds": Text(
        "Recording", "seconds",
        "How long the resolver thread sleeps between drains when the hot path has not woken "
        "it (a filling queue wakes it sooner).",
        "Rarely: lower it for fresher numbers on a quiet server, at more CPU for the resolver "
        "thread."),
    "settle_timeout_seconds": Text(
        "Recording", "seconds",
        "How long the resolver holds a cycle ended by `defer()` for its `settle()`. Then it "
        "is counted with its times and without its tokens "
        "(`specobs_exporter_dropped_records_total{reason=\"unsettled\"}`).",
        "Raise it when an engine settles its cycles later than this and `unsettled` drops "
        "grow. A cycle never settled is handed on sooner once a quarter of `queue_size` "
        "(16 to 1,024, at most half) cycles wait behind it: the cycles after a deferred one "
        "wait for it."),
    "trace_head_rate": Text(
        "Tracing", "fraction of cycles",
        "The fraction of cycles exported as traces whatever their duration (GPU-timed spans on "
        "GPU-sampled cycles, host-timed otherwise); the default traces one cycle a second at "
        "1,000 cycles a second. Traced cycles are the exemplars on the histograms.",
        "`0` to export no traces (metrics stay); higher for more exemplars on a server that "
        "runs few cycles."),
    "trace_slow_cycle_seconds": Text(
        "Tracing", "seconds",
        "Every cycle at least this slow is traced (tail sampling; GPU time when sampled, else "
        "host time).",
        "Set it a little above the cycle time's p99 to get a trace of every outlier.",
        default="unset: off"),
    "idle_gap_seconds": Text(
        "Recording", "seconds",
        "A gap between two cycles of one thread longer than this is the engine idling: counted "
        "in `specobs_cycle_idle_gaps_total`, not observed in `specobs_cycle_gap_seconds`.",
        "Raise it when the engine's scheduler pauses longer between cycles while under load; "
        "lower it when waits for work inflate the gap histogram."),
    "rank": Text(
        "Multi-process servers", "-",
        "This process's rank in a multi-process server (tensor or pipeline parallel); only "
        "rank 0 records unless `all_ranks`.",
        "When the launcher sets neither `RANK` nor `LOCAL_RANK`, or they name another rank "
        "than the one that should record.",
        default="`RANK`, else `LOCAL_RANK`, else 0"),
    "all_ranks": Text(
        "Multi-process servers", "-",
        "`1`: every rank records, with a `rank` label, and the default Prometheus port moves "
        "by the rank so that the ranks on one host do not compete for it.",
        "To compare the ranks of one server (a straggling rank shows in its phase times)."),
    "replica": Text(
        "Multi-process servers", "-",
        "The data-parallel replica this process serves: series carry `dp_rank` and the "
        "default Prometheus port moves by it.",
        "Set by the engine integrations; a hand-instrumented data-parallel server passes it.",
        default="unset: one replica"),
    "replicas": Text(
        "Multi-process servers", "replicas",
        "How many data-parallel replicas the server runs (with `all_ranks`, the ranks' ports "
        "step by it).",
        "Set by the engine integrations; a hand-instrumented data-parallel server passes it."),
    "leader": Text(
        "Multi-process servers", "-",
        "Whether this process is the one of its replica that records.",
        "For engines whose sampling runs on another process than rank 0 (the last pipeline "
        "stage); the engine integrations pass it.",
        default="unset: `rank == 0`", accepts="`True` or `False`"),
    "integration": Text(
        "Recording", "-",
        "Who records, as `specobs_info{integration}`: `manual` for the API, or an "
        "integration's name.",
        "Set by the engine integrations; a custom integration names itself."),
}

VARIABLES: tuple[Variable, ...] = (
    Variable(
        "SPECOBS_EXPORTERS", "Exporters",
        "unset: no sink (read the numbers with `Observer.snapshot()`)", "-",
        "comma-separated: `prometheus`, `otlp`, `none`",
        "The sinks `configure()` starts when no `sinks=` is passed: the Prometheus endpoint, "
        "OTLP export (configured by the standard `OTEL_EXPORTER_OTLP_*` variables), or both.",
        "Set it on every server the engine integrations instrument: they start only what it "
        "names.",
        "`configure()` without `sinks=`"),
    Variable(
        "SPECOBS_PROMETHEUS_PORT", "Exporters", "`9477`", "TCP port",
        "an integer from 0 to 65535 (0: any free port)",
        "The port of the Prometheus endpoint. Ranks and data-parallel replicas add their "
        "offset to it (see `all_ranks` and `replica`).",
        "When 9477 is taken, or to give each server on one host its own port.",
        "`PrometheusSink()` without `port=`, `configure()` through `SPECOBS_EXPORTERS`, "
        "`specobs demo`"),
    Variable(
        "SPECOBS_PROMETHEUS_ADDR", "Exporters", "`127.0.0.1`", "-", "an address to bind",
        "The address the Prometheus endpoint binds. The default serves only this host.",
        "`0.0.0.0` (or the pod's address) for a Prometheus on another host to scrape it; the "
        "endpoint has no authentication, so keep it inside the cluster's network.",
        "`PrometheusSink()` without `addr=`, `configure()` through `SPECOBS_EXPORTERS`, "
        "`specobs demo`"),
    Variable(
        "SPECOBS_OTLP_FORK_WAIT_SECONDS", "Exporters", "`0.5`", "seconds",
        "a number in [0, 60]",
        "The most `fork()` waits for specobs's own OTLP/gRPC export in progress. A child "
        "forked while one still runs keeps its OTLP sink off (docs/reliability.md).",
        "Raise it when forked children must always export and the collector is slow; `0` "
        "never delays a `fork()`.",
        "when an OTLP sink with the gRPC protocol is made"),
    Variable(
        "SPECOBS_EXIT_TIMEOUT_SECONDS", "Exporters", "`5`", "seconds", "a number in [0, 3600]",
        "The most the exit hook spends flushing every observer still open when the "
        "interpreter exits (pending records, the final OTLP export), for all of them together.",
        "Raise it when the last interval is lost at exit behind a slow collector; lower it to "
        "fit a shorter termination grace period. A bad value is logged and the default used.",
        "at interpreter exit"),
    Variable(
        "SPECOBS_VLLM", "Engines", "unset: off", "-",
        "`1`, `true`, `yes` or `on` (any case); anything else is off",
        "Turns on the vLLM integration through vLLM's `vllm.general_plugins` entry point.",
        "Set it to `1` on a vLLM server to instrument it (docs/integrations.md).",
        "when vLLM loads its plugins"),
    Variable(
        "SPECOBS_SGLANG", "Engines", "unset: off", "-",
        "`1`, `true`, `yes` or `on` (any case); anything else is off",
        "Turns on the SGLang integration through SGLang's `sglang.srt.plugins` entry point "
        "(with `SGLANG_PLUGINS=specobs`).",
        "Set it to `1` on an SGLang server to instrument it (docs/integrations.md).",
        "when SGLang loads its plugins"),
    Variable(
        "SPECOBS_CORE", "Native core", "unset: the native core where it was built", "-",
        "`python` for the pure-Python core; anything else: the native one",
        "Which hot-path ring runs: the native core (C) or its pure-Python specification. "
        "`specobs_info{core}` says which one runs.",
        "`python` to rule the native core out while debugging, or to run the tests on the "
        "specification. The pure-Python core costs more per phase boundary.",
        "once, when specobs is imported"),
    Variable(
        "SPECOBS_DEMO_ADMIN_TOKEN", "Demo", "unset: admin endpoints off", "-",
        "at least 16 characters of UTF-8 text",
        "The bearer token of the `specobs demo` server's admin endpoints (faults switched at "
        "run time). `--admin-token` wins over it.",
        "To switch the demo's faults while it serves. Prefer it to the flag, which every "
        "local user can read in the process list.",
        "`specobs demo`, at start"),
    Variable(
        "SPECOBS_CACHE_DIR", "Demo", "`$XDG_CACHE_HOME/specobs`, else `~/.cache/specobs`",
        "-", "a directory",
        "Where the demo keeps the draft weights it trains. `--cache-dir` wins over it.",
        "When the home directory is read-only, or to share trained weights between machines "
        "or containers.",
        "`specobs demo`, when it loads the draft weights"),
    Variable(
        "SPECOBS_GENAI_PROVIDER_NAME",
        "Exporters",
        "unset: the `serving_engine` label, else the instrumented engine",
        "-",
        "a provider name (`vllm`, `sglang`, ...)",
        "The OpenTelemetry GenAI attribute `gen_ai.provider.name` of the OTLP resource and of"
        " every cycle span. The `OtlpSink(provider_name=)` argument and `resource_attributes`"
        " win over it; `OTEL_RESOURCE_ATTRIBUTES` loses to it (docs/otel-genai.md).",
        "When the serving engine is not what the label or the integration says, e.g. a fork "
        "of vLLM under its own name.",
        "`OtlpSink()`, when it is attached to an observer"),
    Variable(
        "SPECOBS_GENAI_REQUEST_MODEL",
        "Exporters",
        "unset: the `model_name` label",
        "-",
        "a model name",
        "`gen_ai.request.model` of the OTLP resource and cycle spans, with the same precedence.",
        "When the model served is not the `model_name` label, or no label names it.",
        "`OtlpSink()`, when it is attached to an observer"),
    Variable(
        "SPECOBS_GENAI_RESPONSE_MODEL",
        "Exporters",
        "unset: the request model",
        "-",
        "a model name",
        "`gen_ai.response.model` of the OTLP resource and cycle spans, with the same precedence.",
        "When the engine answers with another model than the one requested (an alias resolved"
        " to a version).",
        "`OtlpSink()`, when it is attached to an observer"),
    Variable(
        "SPECOBS_SERVER_ADDRESS",
        "Exporters",
        "unset: none",
        "-",
        "a host name or address",
        "`server.address` of the OTLP resource and cycle spans: the address clients reach the"
        " inference server on.",
        "To join specobs's telemetry with the clients' GenAI spans, which carry the same "
        "attribute.",
        "`OtlpSink()`, when it is attached to an observer"),
    Variable(
        "SPECOBS_SERVER_PORT",
        "Exporters",
        "unset: none",
        "-",
        "an integer from 1 to 65535",
        "`server.port` of the OTLP resource and cycle spans: the port clients reach the "
        "inference server on.",
        "With `SPECOBS_SERVER_ADDRESS`, for the same join.",
        "`OtlpSink()`, when it is attached to an observer"),
)


def _default_words(value: Any) -> str:
    """A :class:`~specobs.Settings` default as the text of its variable."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def entries() -> list[Entry]:
    """Every row of the reference: the settings in table order, then :data:`VARIABLES`.

    Raises ``KeyError`` naming a setting that has no :data:`SETTING_TEXTS` entry."""
    defaults = Settings()
    out: list[Entry] = []
    for setting in SETTINGS:
        text = SETTING_TEXTS.get(setting.field)
        if text is None:
            raise KeyError(f"the setting {setting.field!r} has no entry in SETTING_TEXTS; "
                           f"add its unit, summary and when to change it")
        value = getattr(defaults, setting.field)
        default = text.default if text.default is not None else f"`{_default_words(value)}`"
        read = "`configure()`" if setting.variable is not None else "`configure()` argument only"
        accepts = text.accepts if text.accepts is not None else setting.parse.accepts
        out.append(Entry(setting.variable, setting.field, text.group, default, text.unit,
                         accepts, text.summary, text.change, read))
    for var in VARIABLES:
        out.append(Entry(var.name, None, var.group, var.default, var.unit, var.accepts,
                         var.summary, var.change, var.read))
    return out


def documented_variables() -> set[str]:
    """Every ``SPECOBS_*`` name the reference documents."""
    return {e.variable for e in entries() if e.variable is not None}

