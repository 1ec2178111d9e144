"""specobs's speculative-decoding names as a proposal to the OpenTelemetry GenAI conventions.

The GenAI semantic conventions (open-telemetry/semantic-conventions-genai) have no names for
speculative decoding. This module maps specobs's own names (catalog metrics, their labels and
the cycle span's attributes) to proposed ``gen_ai.server.speculative.*`` metrics and
``gen_ai.speculative.*`` attributes, and renders that mapping as the generated region of
docs/otel-genai.md: the tables, the registry and metrics YAML in the shape of that
repository's ``model/gen-ai/*.yaml`` (``file_format: definition/2``, everything at stability
``development``), and an OpenTelemetry Collector configuration that maps specobs's names to
the proposed ones. Every catalog metric appears in the region, proposed or with the reason it
is not, so a metric added to the catalog shows up there on the next render.

    specobs generate    # rewrite the region of docs/otel-genai.md

Stdlib only: the YAML is written by hand, one fixed shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import specobs.catalog as c

__all__ = [
    "ATTRIBUTES",
    "BEGIN",
    "END",
    "METRICS",
    "METRIC_ATTRIBUTE_GROUP",
    "NOT_PROPOSED",
    "PATH",
    "SPAN_NOT_PROPOSED",
    "ProposedAttribute",
    "ProposedMetric",
    "collector_config",
    "metrics_yaml",
    "registry_yaml",
    "render",
]

PATH = "docs/otel-genai.md"
BEGIN = ("<!-- BEGIN GENERATED: the proposal, from specobs/mixin/_genai_proposal.py and the "
         "catalog (specobs generate; do not edit by hand) -->")
END = "<!-- END GENERATED: the proposal -->"

#: The GenAI attributes every proposed metric carries, as the existing ``gen_ai.server.*``
#: metrics do (the upstream group ``metric_attributes.gen_ai``: provider required, models and
#: server address and port recommended).
METRIC_ATTRIBUTE_GROUP = "metric_attributes.gen_ai"


@dataclass(frozen=True)
class ProposedAttribute:
    """A proposed attribute and the specobs names it stands for.

    ``members``: the values of an enum attribute (``type`` is then ``members``); ``labels``:
    the catalog labels it replaces on metrics; ``span_keys``: the span attributes it replaces.
    """

    key: str
    type: str
    brief: str
    examples: tuple[str | int, ...] = ()
    members: tuple[tuple[str, str], ...] = ()
    note: str = ""
    labels: tuple[str, ...] = ()
    span_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProposedMetric:
    """A proposed metric: the catalog metric it is, a brief, and its attributes by the catalog
    label each replaces (every label of the metric)."""

    name: str
    metric: c.Metric
    brief: str
    attributes: tuple[tuple[str, str], ...] = ()
    note: str = ""


ATTRIBUTES: tuple[ProposedAttribute, ...] = (
    ProposedAttribute(
        "gen_ai.speculative.phase", "members",
        "The phase of a speculative decoding cycle.",
        members=(("draft", "The draft model or head proposes tokens."),
                 ("verify", "The target model scores the proposed tokens."),
                 ("bookkeeping", "Acceptance, KV-cache and sequence updates after the verify.")),
        note="Engines whose cycle has other phases record them under their own names.",
        labels=("phase",)),
    ProposedAttribute(
        "gen_ai.speculative.clock", "members",
        "The clock a speculative decoding duration was measured on.",
        members=(("gpu", "Device timestamps (CUDA events) around the phase's work, on a "
                         "sample of cycles."),
                 ("host", "Host monotonic clock at the phase boundaries, on every cycle; "
                          "under CUDA graphs it measures launches, not device work.")),
        labels=("clock",), span_keys=("specobs.clock",)),
    ProposedAttribute(
        "gen_ai.speculative.draft.position", "int",
        "The position of a draft token in its draft, from 0 (the first drafted token).",
        examples=(0, 3), labels=("position",)),
    ProposedAttribute(
        "gen_ai.speculative.batch.size", "int",
        "The number of sequences decoded together in a speculative decoding cycle.",
        examples=(1, 32), span_keys=("specobs.batch_size",)),
    ProposedAttribute(
        "gen_ai.speculative.draft_tokens", "int",
        "The number of draft tokens the sequences of a cycle verified.",
        examples=(128,), span_keys=("specobs.draft_tokens",)),
    ProposedAttribute(
        "gen_ai.speculative.accepted_tokens", "int",
        "The number of draft tokens the target model accepted in a cycle.",
        examples=(71,), span_keys=("specobs.accepted_tokens",)),
    ProposedAttribute(
        "gen_ai.speculative.emitted_tokens", "int",
        "The number of tokens a cycle emitted: the accepted draft tokens plus one token the "
        "target model produced for each sequence.",
        examples=(103,), span_keys=("specobs.emitted_tokens",)),
)

METRICS: tuple[ProposedMetric, ...] = (
    ProposedMetric(
        "gen_ai.server.speculative.phase.duration", c.PHASE_DURATION,
        "Duration of one phase of a speculative decoding cycle.",
        (("phase", "gen_ai.speculative.phase"), ("clock", "gen_ai.speculative.clock")),
        note="Draft, verify and bookkeeping durations on one clock sum to the cycle's."),
    ProposedMetric(
        "gen_ai.server.speculative.cycle.duration", c.CYCLE_DURATION,
        "Duration of a whole speculative decoding cycle.",
        (("clock", "gen_ai.speculative.clock"),)),
    ProposedMetric(
        "gen_ai.server.speculative.cycles", c.CYCLES,
        "Speculative decoding cycles completed."),
    ProposedMetric(
        "gen_ai.server.speculative.draft_tokens", c.DRAFT_TOKENS,
        "Draft tokens proposed and verified, summed over the sequences of each cycle."),
    ProposedMetric(
        "gen_ai.server.speculative.accepted_tokens", c.ACCEPTED_TOKENS,
        "Draft tokens the target model accepted.",
        note="The acceptance rate is accepted over draft tokens."),
    ProposedMetric(
        "gen_ai.server.speculative.emitted_tokens", c.EMITTED_TOKENS,
        "Tokens emitted to sequences by speculative decoding cycles: the accepted draft tokens "
        "plus the target model's own token of each sequence."),
    ProposedMetric(
        "gen_ai.server.speculative.accept_length", c.ACCEPT_LENGTH,
        "Accepted draft tokens of one sequence in one cycle, for sequences that drafted.",
        note="Excludes the target model's own token; engines that report a mean acceptance "
             "length including it report this plus one."),
    ProposedMetric(
        "gen_ai.server.speculative.position.draft_tokens", c.DRAFTED_BY_POSITION,
        "Draft tokens proposed at each draft position.",
        (("position", "gen_ai.speculative.draft.position"),),
        note="The denominator of per-position acceptance, which stays right when the draft "
             "length changes from cycle to cycle."),
    ProposedMetric(
        "gen_ai.server.speculative.position.accepted_tokens", c.ACCEPTED_BY_POSITION,
        "Draft tokens accepted at each draft position.",
        (("position", "gen_ai.speculative.draft.position"),)),
    ProposedMetric(
        "gen_ai.server.speculative.draft.length", c.DRAFT_LENGTH,
        "Draft length the engine scheduled for a cycle; 0 for a step that drafted nothing.",
        note="Engines that change the draft length at run time (per batch size, adaptively) "
             "record one value per cycle."),
    ProposedMetric(
        "gen_ai.server.speculative.request.acceptance", c.REQUEST_ACCEPTANCE,
        "Acceptance rate of each finished request that drafted: its accepted over its draft "
        "tokens."),
)

#: Catalog metrics left out of the proposal, and why. Self-metrics (``Metric.self_metric``) are
#: specobs's own health and need no entry; a metric in neither table is not proposed yet.
NOT_PROPOSED: dict[str, str] = {
    c.CYCLE_GAP.otel_name: "the engine's time between decode steps is not speculative; "
                           "decode-loop metrics belong with semconv-genai#87",
    c.IDLE_GAPS.otel_name: "specobs's split of idle time out of the gaps above",
    c.DRAFT_TOKENS_UNVERIFIED.otel_name: "one engine's adaptive verification so far",
    c.CYCLES_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.PHASE_TIME_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.EMITTED_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.SEQUENCES_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.ACCEPTED_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.DRAFTED_BY_DRAFT_LENGTH.otel_name: "a breakdown by draft length for specobs's advisor",
    c.BATCH_SIZE.otel_name: "batching is not speculative: semconv-genai#87",
    c.INFO.otel_name: "specobs's build and settings; the resource identifies the server",
    c.LAST_CYCLE_TIMESTAMP.otel_name: "specobs's liveness signal",
    c.BASELINE_SEQUENCE_TOKENS.otel_name: "a configured or specobs-measured reference rate",
    c.REQUESTS_RUNNING.otel_name: "queue state is not speculative: semconv-genai#87",
    c.REQUESTS_WAITING.otel_name: "queue state is not speculative: semconv-genai#87",
    c.REQUESTS_FINISHED.otel_name: "the count of the request acceptance histogram covers it",
    c.WORKER_THREAD_TIME.otel_name: "the recording thread's CPU and run-queue time: a process "
                                    "metric, not speculative",
}

#: Span attributes left out of the proposal, and why.
SPAN_NOT_PROPOSED: dict[str, str] = {
    "specobs.cycle.index": "an observer-local sequence number",
    "specobs.host_duration_ns": "specobs's cross-check of a GPU-timed span against the host "
                                "clock",
}

_INSTRUMENTS = {"histogram": "histogram", "counter": "counter", "gauge": "gauge"}


def _q(value: str | int) -> str:
    """A YAML scalar: ints as they are, strings double-quoted (JSON's escapes are YAML's)."""
    return str(value) if isinstance(value, int) else json.dumps(value, ensure_ascii=False)


def registry_yaml() -> str:
    """The proposed attributes, as upstream's ``model/gen-ai/registry.yaml`` writes them."""
    lines = ["file_format: definition/2", "attributes:"]
    for a in ATTRIBUTES:
        lines.append(f"  - key: {a.key}")
        if a.members:
            lines += ["    type:", "      members:"]
            for value, brief in a.members:
                lines += [f"        - id: {value}", f"          value: {_q(value)}",
                          f"          brief: {_q(brief)}", "          stability: development"]
        else:
            lines.append(f"    type: {a.type}")
        lines.append(f"    brief: {_q(a.brief)}")
        if a.note:
            lines.append(f"    note: {_q(a.note)}")
        if a.examples:
            lines.append(f"    examples: [{', '.join(_q(e) for e in a.examples)}]")
        lines.append("    stability: development")
    return "\n".join(lines) + "\n"


def metrics_yaml() -> str:
    """The proposed metrics, as upstream's ``model/gen-ai/metrics.yaml`` writes them."""
    lines = ["file_format: definition/2", "metrics:"]
    for m in METRICS:
        lines += [
            f"  - name: {m.name}",
            f"    instrument: {_INSTRUMENTS[m.metric.kind]}",
            f"    unit: {_q(m.metric.unit)}",
            f"    brief: {_q(m.brief)}",
        ]
        if m.note:
            lines.append(f"    note: {_q(m.note)}")
        lines += ["    stability: development", "    attributes:",
                  f"      - ref_group: {METRIC_ATTRIBUTE_GROUP}"]
        for _, key in m.attributes:
            lines += [f"      - ref: {key}", "        requirement_level: required"]
    return "\n".join(lines) + "\n"


def collector_config() -> str:
    """An OpenTelemetry Collector configuration that adds the proposed names to what specobs
    sends: a ``metricstransform`` copy of each proposed metric with its labels renamed, and
    ``transform`` statements that put the resource's GenAI attributes on those copies' points
    and the proposed attributes on the spans."""
    lines = [
        "processors:",
        "  # A gen_ai.* copy of each proposed metric; specobs's own names stay, since the",
        "  # specobs dashboards and rules read them (action: update renames in place instead).",
        "  metricstransform/genai:",
        "    transforms:",
    ]
    for m in METRICS:
        lines += [
            f"      - include: {m.metric.otel_name}",
            "        match_type: strict",
            "        action: insert",
            f"        new_name: {m.name}",
        ]
        if m.attributes:
            lines.append("        operations:")
            for label, key in m.attributes:
                lines += ["          - action: update_label", f"            label: {label}",
                          f"            new_label: {key}"]
    genai_keys = ("gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
                  "server.address", "server.port")
    # [.] rather than an escaped dot: no backslashes through YAML and OTTL string quoting.
    only_copies = 'where IsMatch(metric.name, "^gen_ai[.]server[.]speculative[.]")'
    lines += [
        "  # The server's GenAI attributes, which specobs puts on the resource, onto the points of",
        "  # the copies, where the conventions put them (an exporter with",
        "  # resource_to_telemetry_conversion labels every series with them already); set() of",
        "  # an absent value does nothing. Span attributes gain their proposed names beside",
        "  # specobs's.",
        "  transform/genai:",
        "    error_mode: ignore",
        "    metric_statements:",
        "      - context: datapoint",
        "        statements:",
    ]
    for key in genai_keys:
        lines.append(
            f"          - 'set(attributes[\"{key}\"], resource.attributes[\"{key}\"]) "
            f"{only_copies}'")
    lines += ["    trace_statements:", "      - context: span", "        statements:"]
    for a in ATTRIBUTES:
        for span_key in a.span_keys:
            lines.append(
                f"          - 'set(attributes[\"{a.key}\"], attributes[\"{span_key}\"])'")
    lines += [
        "service:",
        "  pipelines:",
        "    traces:",
        "      receivers: [otlp]",
        "      processors: [memory_limiter, transform/genai, batch]",
        "      exporters: [otlp/tempo]",
        "    metrics:",
        "      receivers: [otlp]",
        "      processors: [memory_limiter, filter/scraped, metricstransform/genai, "
        "transform/genai, batch]",
        "      exporters: [prometheusremotewrite]",
    ]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _not_proposed_rows(proposed: dict[str, ProposedMetric]) -> list[str]:
    """A row for every metric of the catalog not proposed, with why."""
    rows = []
    for metric in c.CATALOG:
        if metric.otel_name in proposed:
            continue
        if metric.otel_name in NOT_PROPOSED:
            reason = NOT_PROPOSED[metric.otel_name]
        elif metric.self_metric:
            reason = "specobs's own health"
        else:
            reason = "not proposed yet"
        rows.append(f"| `{metric.name}` | {_cell(reason)} |")
    return rows


def render() -> str:
    """The generated region of docs/otel-genai.md, its markers included. Pure."""
    proposed = {m.metric.otel_name: m for m in METRICS}
    lines = [
        BEGIN,
        "",
        "### Metrics",
        "",
        "| specobs (OpenTelemetry) | specobs (Prometheus) | proposed | instrument | unit "
        "| attributes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in METRICS:
        attrs = ", ".join(f"`{label}` → `{key}`" for label, key in m.attributes) or "-"
        lines.append(
            f"| `{m.metric.otel_name}` | `{m.metric.name}` | `{m.name}` | "
            f"{_INSTRUMENTS[m.metric.kind]} | `{m.metric.unit}` | {attrs} |")
    lines += [
        "",
        "Every proposed metric also carries the GenAI server attributes of the existing "
        "`gen_ai.server.*` metrics (`gen_ai.provider.name`, required; `gen_ai.request.model`, "
        "`gen_ai.response.model`, `server.address`, `server.port`), which specobs puts on the "
        "resource.",
        "",
        "### Span attributes",
        "",
        "On the `" + c.CYCLE_SPAN_NAME + "` span (and, for the clock, on its phase spans):",
        "",
        "| specobs | proposed | type |",
        "| --- | --- | --- |",
    ]
    by_span_key = {k: a for a in ATTRIBUTES for k in a.span_keys}
    for s in c.SPAN_ATTRIBUTES:
        if s.key in by_span_key:
            lines.append(f"| `{s.key}` | `{by_span_key[s.key].key}` | {s.type} |")
        else:
            reason = SPAN_NOT_PROPOSED.get(s.key, "not proposed yet")
            lines.append(f"| `{s.key}` | not proposed: {_cell(reason)} | {s.type} |")
    lines += [
        "",
        "### Not proposed",
        "",
        "| specobs (Prometheus) | why |",
        "| --- | --- |",
    ]
    lines += _not_proposed_rows(proposed)
    lines += [
        "",
        "### Attribute registry (`model/gen-ai/registry.yaml` shape)",
        "",
        "```yaml",
        registry_yaml().rstrip("\n"),
        "```",
        "",
        "### Metrics (`model/gen-ai/metrics.yaml` shape)",
        "",
        "```yaml",
        metrics_yaml().rstrip("\n"),
        "```",
        "",
        "### Collector pipeline",
        "",
        "The receivers, exporters and other processors are those of "
        "`deploy/otel-collector/config.yaml`; the two `genai` processors are new.",
        "",
        "```yaml",
        collector_config().rstrip("\n"),
        "```",
        "",
        END,
    ]
    return "\n".join(lines) + "\n"
