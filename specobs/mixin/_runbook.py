"""docs/runbook.md: one entry per alert, with what it means and what to check first."""

from __future__ import annotations

from specobs.mixin._config import MixinConfig
from specobs.mixin._rules import ALERT_PREFIX, RuleNames, alert_rules

__all__ = ["render"]

# alert name (without the prefix) -> (what it means, what to check first)
_ENTRIES: dict[str, tuple[str, list[str]]] = {
    "DecodeThroughputDrop": (
        "Each sequence on this server now gains tokens markedly slower than it did in the recent "
        "past, and the server as a whole is not emitting more tokens than before. Per-sequence "
        "speed is emitted tokens per sequence per cycle divided by the mean host cycle time, so "
        "fewer requests (a load drop) do not move it; more requests do slow each sequence, which "
        "is why the alert stays silent while total tokens/s rises.",
        [
            "Cycle breakdown dashboard, *Mean time per cycle by phase*: which phase grew? A GPU "
            "phase that grew points at the model, kernels, clocks or a noisy neighbour; host time "
            "growing without GPU time points at launch or Python overhead (lost CUDA graphs, a "
            "new logging hook, CPU contention).",
            "*Acceptance rate* and *Mean accept length*: fewer accepted tokens per cycle lower "
            "per-sequence speed at an unchanged cycle time (see SpecobsAcceptanceRateDrop).",
            "*Batch size*: a much larger batch with flat tokens/s means the server is saturated.",
            "Recent deploys, driver or engine upgrades, GPU clocks and thermals (`nvidia-smi -q`).",
        ],
    ),
    "AcceptanceRateDrop": (
        "The target model accepts a much smaller fraction of drafted tokens than it did in the "
        "recent past. Every rejected token is wasted draft and verify work, so speedup falls. A "
        "draft head wired to the wrong hidden layers drops acceptance from about 47% to 19%.",
        [
            "Was the draft model, its checkpoint or the target model changed? A draft must match "
            "its target's exact weights and tokenizer; EAGLE-style heads also need the right "
            "hidden layers.",
            "Cycle breakdown, *Acceptance by draft position*: a collapse at position 0 means the "
            "draft is broken; a decay only at late positions means traffic got harder to predict.",
            "Traffic mix: a new prompt domain, language or sampling temperature lowers acceptance "
            "without anything being broken.",
            "Fleet dashboard, *Acceptance by model*: is it one server or every server of a model?",
        ],
    ),
    "SpeculationSlowerThanBaseline": (
        "Sequences on this server decode slower than the configured non-speculative decode rate "
        "(`specobs_baseline_sequence_tokens_per_second`): speculation is costing time instead of "
        "saving it.",
        [
            "Cycle breakdown, *Speedup: realized vs predicted*. Predicted below 1 too: acceptance "
            "is too low or drafting too costly for this draft length; shorten the draft or turn "
            "speculation off for this traffic.",
            "Realized far below predicted: the time goes outside draft and verify (host overhead, "
            "bookkeeping); compare the GPU and host clock panels.",
            "Is the baseline still right? It is configured by hand; a new GPU, model or batch "
            "regime changes the non-speculative rate too.",
        ],
    ),
    "PhaseLatencyRegression": (
        "One phase of the cycle (label `phase`, on clock `clock`) takes much longer per cycle "
        "than in the recent past, while the mean batch size did not grow enough to explain it.",
        [
            "Which clock? GPU clock: the kernels themselves got slower (new kernel, lost CUDA "
            "graph, lower clocks, another process on the GPU). Host clock only: launch or Python "
            "overhead grew.",
            "Cycle breakdown, *Phase latency p50 / p90 / p99* and exemplars: is it every cycle or "
            "a slow tail? Open an exemplar's trace to see one slow cycle.",
            "Recent changes to the engine, draft length, attention backend or sampling code.",
        ],
    ),
    "DecodingStalled": (
        "The engine reports requests waiting or running, but specobs saw no completed cycle for "
        "the whole rate window: decoding is stuck, or specobs is no longer called from the "
        "decode loop.",
        [
            "Is the engine's process alive and its GPU busy (`nvidia-smi`)? A hung NCCL "
            "collective, a deadlock or an OOM-retry loop stops every cycle.",
            "Engine logs around the time *Time since the last cycle* started rising.",
            "Did an engine upgrade change the decode loop so the specobs instrumentor no longer "
            "wraps it? Then requests complete but no cycle is counted.",
        ],
    ),
    "ExporterDown": (
        "Prometheus reaches the target but every scrape of the specobs endpoint fails (`up` is "
        "0): no specobs data arrives from this server.",
        [
            "Prometheus *Targets* page: the scrape error (connection refused, timeout, HTTP "
            "status).",
            "Is the inference server running, and did it start the specobs endpoint (default port "
            "9477, `SPECOBS_PROMETHEUS_PORT`)? `specobs doctor URL` checks an endpoint.",
            "A scrape timeout: is the endpoint slow (it should answer in under 5 ms)?",
        ],
    ),
    "TargetMissing": (
        "Prometheus has no scrape target at all for the specobs job: every dashboard is empty "
        "and no other specobs alert can fire.",
        [
            "Prometheus *Service discovery* page: were the targets dropped by relabelling?",
            "Kubernetes: the pods' labels and the ServiceMonitor / PodMonitor selector; the job "
            "name in the rules' selector must match the scrape job.",
            "Was the whole inference deployment scaled to zero or deleted?",
        ],
    ),
    "ExporterDroppingRecords": (
        "specobs dropped more than a small fraction of cycle records before aggregating them "
        "(label `reason`), so its counts and timings undercount. The worker is never slowed; "
        "specobs sheds data instead.",
        [
            "`queue_full`: the resolver thread cannot keep up (CPU starved or GIL contention); "
            "check *specobs CPU time per cycle* and raise the sampling interval.",
            "`event_pool_exhausted`: GPU events complete too slowly to be recycled; a stalled GPU "
            "or a very deep queue of work.",
            "`graph_capture`, `misuse`, `fork`, `shutdown`: see docs/metrics.md for the meaning; "
            "`misuse` also counts in `specobs_exporter_errors_total{kind}`.",
        ],
    ),
}


def render(config: MixinConfig) -> str:
    names = RuleNames(config)
    lines = [
        "<!-- Generated by `specobs generate` from specobs/mixin; do not edit by hand. -->",
        "# specobs runbook",
        "",
        "One entry per alert of `deploy/prometheus/rules/specobs-rules.yml`: what it means and "
        "what to check first. Every alert carries `severity`, a static `summary`, a templated "
        "`description` and a `runbook_url` pointing at its entry here.",
        "",
        "Alerts that compare a server with *its own recent past* use the average of a recording "
        f"rule over the {config.history_window} ending {config.history_offset} ago, so a "
        "regression does not hide in its own reference. Thresholds and windows come from "
        "`specobs.mixin.MixinConfig`; regenerate with your own values.",
        "",
        "| Alert | Severity | For |",
        "| --- | --- | --- |",
    ]
    alerts = alert_rules(config)
    for alert in alerts:
        lines.append(f"| [{alert.alert}](#{alert.anchor}) | {alert.severity} | {alert.for_} |")
    lines.append("")
    for alert in alerts:
        meaning, checks = _ENTRIES[alert.alert.removeprefix(ALERT_PREFIX)]
        lines += [
            f"## {alert.alert}",
            "",
            f"**Severity:** {alert.severity} · **for:** {alert.for_} · **summary:** "
            f"{alert.summary}",
            "",
            meaning,
            "",
            "**Check first:**",
            "",
            *[f"{i}. {check}" for i, check in enumerate(checks, 1)],
            "",
            "<details><summary>Expression</summary>",
            "",
            "```promql",
            alert.expr,
            "```",
            "",
            "</details>",
            "",
        ]
    lines += [
        "## Recording rules these alerts read",
        "",
        f"Per-sequence speed `{names.sequence_speed}`, acceptance `{names.acceptance}`, realized "
        f"speedup `{names.speedup_realized}`, phase means `{names.phase_mean}`, mean batch size "
        f"`{names.batch_size_mean}`. docs/metrics.md lists every recording rule with its "
        "expression.",
        "",
    ]
    return "\n".join(lines)


def entries() -> dict[str, tuple[str, list[str]]]:
    """Runbook text keyed by alert name without the prefix (tests check every alert has one)."""
    return dict(_ENTRIES)
