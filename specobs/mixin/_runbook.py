"""docs/runbook.md: one entry per alert, with what it means and what to check first."""

from __future__ import annotations

from specobs.mixin import _rule_tests
from specobs.mixin._config import MixinConfig, duration_seconds, markdown_heading
from specobs.mixin._rule_names import ALERT_PREFIX, AlertRule, RuleNames
from specobs.mixin._rules import alert_rules, history_name

__all__ = ["doctor_entries", "render"]

#: The doctor commands an entry shows (``specobs doctor``, docs/diagnosis.md): the alerted server
#: from Prometheus, or its own endpoint read over a window of at least this many cycles.
DOCTOR_MIN_CYCLES = 200

# alert name (without the prefix) -> which of doctor's findings (or checks) explain it. The codes
# are those of specobs/tools/_diagnosis/ (tests/test_diagnosis_runbook.py checks each exists).
_DOCTOR: dict[str, tuple[tuple[str, ...], str]] = {
    "AcceptanceBelowCohort": (
        ("SPEC-ACCEPT-COLLAPSE", "SPEC-ACCEPT-FLAT-LOW", "SPEC-ACCEPT-CHAIN-SHORT"),
        "the acceptance profile tells a draft broken from its first token (wiring, checkpoint, "
        "tokenizer, sampling) from a weak one",
    ),
    "AcceptanceRateDrop": (
        ("SPEC-RECENT-ACCEPT-DOWN", "SPEC-ACCEPT-COLLAPSE", "SPEC-ACCEPT-FLAT-LOW"),
        "the size of the drop against the server's lifetime, and the profile's likely cause",
    ),
    "DecodeThroughputBelowCohort": (
        ("SPEC-RECENT-PHASE-SLOWER", "SPEC-RECENT-BOUNDARY-COST", "SPEC-HOST-BOUND",
         "SPEC-HOST-LOCKSTEP", "SPEC-ACCEPT-COLLAPSE"),
        "which phase is slow, whether the host holds the GPU back, or whether acceptance is low",
    ),
    "CohortThroughputDrop": (
        ("SPEC-RECENT-THROUGHPUT-DOWN", "SPEC-RECENT-PHASE-SLOWER", "SPEC-RECENT-BOUNDARY-COST",
         "SPEC-RECENT-ACCEPT-DOWN"),
        "run it on one server of the cohort: what changed against its lifetime",
    ),
    "DecodeThroughputDrop": (
        ("SPEC-RECENT-THROUGHPUT-DOWN", "SPEC-RECENT-PHASE-SLOWER", "SPEC-RECENT-BOUNDARY-COST",
         "SPEC-RECENT-SLOWER-ALL", "SPEC-RECENT-ACCEPT-DOWN"),
        "the drop with its explanation: acceptance, one phase, a cost per boundary, or the "
        "whole machine",
    ),
    "SpeculationSlowerThanBaseline": (
        ("SPEC-SPEEDUP-LOSS", "SPEC-SPEEDUP-WARMING"),
        "the reason from the data: acceptance too low for the draft's cost, verify-bound at "
        "this batch size, or time outside draft and verify",
    ),
    "PhaseLatencyAboveCohort": (
        ("SPEC-CYCLE-VERIFY-BOUND", "SPEC-CYCLE-DRAFT-BOUND", "SPEC-CYCLE-BOOKKEEPING-BOUND",
         "SPEC-HOST-BOUND", "SPEC-HOST-LOCKSTEP"),
        "where this server's cycle goes, and whether its host waits between phases",
    ),
    "PhaseLatencyRegression": (
        ("SPEC-RECENT-PHASE-SLOWER", "SPEC-RECENT-BOUNDARY-COST", "SPEC-RECENT-SLOWER-ALL"),
        "one phase slower, the same time added at every boundary (a synchronize or profiler), "
        "or every phase by one factor (the machine or the batch)",
    ),
    "DecodingStalled": (
        ("SPEC-STALL",),
        "fails (exit 1) with the requests running and waiting and the age of the last cycle",
    ),
    "ExporterDown": (
        (),
        "its `reachable` and `specobs endpoint` checks say why the endpoint is unusable (exit 2)",
    ),
    "TargetMissing": (
        (),
        "on the endpoint the target should have: exit 2 when nothing specobs answers there",
    ),
    "ExporterDroppingRecords": (
        (),
        "its `dropped records` check gives the fraction by reason",
    ),
    "LowAcceptanceRequestsJump": (
        (),
        "the server's acceptance profile over the same window (a whole-server collapse shows "
        "there; a few collapsed requests may not); `specobs top http://<instance>/metrics` "
        "shows the per-request distribution and the worst requests' trace ids",
    ),
}

# alert name (without the prefix) -> what it cannot see (its blind spots and false alarms)
_BLIND: dict[str, str] = {
    "AcceptanceBelowCohort": (
        "A cohort of one server (nothing to compare with: AcceptanceRateDrop covers it); a "
        "rollout where more than half the pods are broken (the median is broken too: "
        "AcceptanceRateDrop catches that); pods drafting under 1 token/s (no evidence); servers "
        "missing the model or engine label are one cohort per job."
    ),
    "AcceptanceRateDrop": (
        "One bad server among many (it barely moves the cohort: AcceptanceBelowCohort); a "
        "slow decline over more than the history window; a cohort that started broken (no "
        "healthy past). A traffic change (new prompt domain, temperature) fires it too."
    ),
    "DecodeThroughputBelowCohort": (
        "A server whose batch is over 1.2x the cohort median (load, by design); fleets that "
        "mix GPU types under one model and engine label (the slower GPUs look like outliers: "
        "add the GPU type to group_labels); cohorts of one."
    ),
    "CohortThroughputDrop": (
        "One slow server (DecodeThroughputBelowCohort); a slowdown that arrives with a batch "
        "size growth (hidden as load); a decline slower than the history window."
    ),
    "DecodeThroughputDrop": (
        "New pods (no past of their own: the cohort alerts cover them); a slowdown together "
        "with more total tokens/s (hidden as load)."
    ),
    "SpeculationSlowerThanBaseline": (
        "Servers without a baseline gauge (the alert needs one); a configured baseline that no "
        "longer matches the batch size, GPU or model the server runs (the comparison is then not "
        "like for like; the label `source` says whether the baseline was configured or measured "
        "by the engine at the served batch, as `specobs demo` does)."
    ),
    "PhaseLatencyAboveCohort": (
        "Phases that differ by design between engines or GPU types in one cohort; a server whose "
        "batch is over 1.2x the cohort median; cohorts of one (PhaseLatencyRegression)."
    ),
    "PhaseLatencyRegression": (
        "New pods (no past: PhaseLatencyAboveCohort); a regression that comes with batch growth; "
        "the GPU clock when no cycle is sampled in the window."
    ),
    "DecodingStalled": (
        "An engine whose request gauges are not scraped, or scraped under another host name "
        "than specobs's endpoint (the join is on the host part of `instance`); an engine that "
        "stops speculating on purpose while serving fires it where its integration does not "
        "record the plain steps (vLLM's k = 0 bands are recorded, as cycles of draft length 0, "
        "and do not); a dead process (its gauges go stale: ExporterDown)."
    ),
    "ExporterDown": (
        "Engines that push OTLP through a collector (no scrape target: watch the collector)."
    ),
    "TargetMissing": "Targets of another job name than the rules' selector.",
    "ExporterDroppingRecords": (
        "Records lost before they reach specobs (an engine that never calls the observer)."
    ),
    "LowAcceptanceRequestsJump": (
        "Engines that do not report finished requests (`Observer.request_finished`: the "
        "series are absent); servers that finished fewer than 50 requests in 15 minutes; a "
        "server that started collapsed, or a rise slower than the hour of reference; requests "
        "that drafted nothing (not in the histogram)."
    ),
}

# alert name (without the prefix) -> (what it means, what to check first)
_ENTRIES: dict[str, tuple[str, list[str]]] = {
    "AcceptanceBelowCohort": (
        "One server's draft acceptance is far below the median server of its cohort: the "
        "servers of the same model and engine in the same cluster and namespace. This is the "
        "alert for a new pod with a broken or mismatched draft (it has no past of its own to "
        "compare with) and for a single bad server.",
        [
            "Which pod, and how new is it? A pod from the latest rollout points at its image, "
            "draft checkpoint or config (draft must match the target's exact weights and "
            "tokenizer; EAGLE heads also need the right hidden layers).",
            "Cycle breakdown (opens on that instance from the fleet table), *Acceptance by "
            "draft position*: a collapse at position 0 means the draft is broken.",
            "Does the pod get different traffic (a routing rule, a tenant)?",
        ],
    ),
    "DecodeThroughputBelowCohort": (
        "Each sequence on one server decodes far slower than on the median server of its "
        "cohort, while its batch is not much larger: one slow machine (GPU clocks, thermals, a "
        "noisy neighbour), or a pod started with other settings (no CUDA graphs, another "
        "attention backend).",
        [
            "Cycle breakdown for that instance, *Mean time per cycle by phase*: which phase is "
            "slower than on its peers (PhaseLatencyAboveCohort may fire too)?",
            "`nvidia-smi -q` on the node: clocks, throttling, ECC, other processes.",
            "The pod's engine flags against its peers'.",
        ],
    ),
    "CohortThroughputDrop": (
        "The median server of a cohort decodes each sequence markedly slower than the cohort "
        "did in the recent past, with no matching growth in batch size: a rollout (engine, "
        "driver, model or draft version) that slowed every pod, whatever their instance.",
        [
            "The last rollout of that model: roll back and compare.",
            "Fleet dashboard, *Acceptance by model*: fewer accepted tokens per cycle slow each "
            "sequence at an unchanged cycle time.",
            "Cycle breakdown on one new pod: which phase grew?",
        ],
    ),
    "PhaseLatencyAboveCohort": (
        "One phase (label `phase`, clock `clock`) takes far longer on one server than on the "
        "median server of its cohort, at a comparable batch size.",
        [
            "GPU clock: that GPU's kernels are slower (clocks, thermals, a co-located process, a "
            "lost CUDA graph). Host clock only: CPU contention or Python overhead on that node.",
            "Cycle breakdown for that instance, *Phase latency p50 / p90 / p99*: every cycle or "
            "a slow tail?",
        ],
    ),
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
        "Across all servers of one model and engine (the cohort, whatever their instance), the "
        "target model accepts a much smaller fraction of drafted tokens than the cohort did in "
        "the recent past: a rollout of a broken draft to every pod survives the new instances, "
        "and a cohort of one server is that server's own history. Every rejected token is "
        "wasted draft and verify work, so speedup falls. A "
        "draft head wired to the wrong hidden layers drops acceptance from about 81% to 18% on the "
        "demo's models.",
        [
            "Was the draft model, its checkpoint or the target model changed? A draft must match "
            "its target's exact weights and tokenizer; EAGLE-style heads also need the right "
            "hidden layers.",
            "Cycle breakdown, *Acceptance by draft position*: a collapse at position 0 means the "
            "draft is broken; a decay only at late positions means traffic got harder to predict.",
            "Traffic mix: a new prompt domain, language or sampling temperature lowers acceptance "
            "without anything being broken.",
            "Fleet dashboard, *Acceptance by model*: when did it start, and does it match a "
            "rollout?",
        ],
    ),
    "SpeculationSlowerThanBaseline": (
        "Sequences on this server decode slower than the non-speculative decode rate "
        "(`specobs_baseline_sequence_tokens_per_second`, configured or measured by the engine: "
        "label `source`): speculation is costing time instead of saving it.",
        [
            "Cycle breakdown, *Speedup: realized vs predicted*. Predicted below 1 too: acceptance "
            "is too low or drafting too costly for this draft length; shorten the draft or turn "
            "speculation off for this traffic.",
            "Calibration below 1 (realized far below predicted): the time goes between cycles "
            "(*Time between cycles*: scheduler, detokenisation, Python outside the step) or "
            "outside the phases, or sequences finish inside cycles; `specobs doctor` names which.",
            "Is the baseline still right? `source=\"configured\"`: it was set by hand, and a "
            "new GPU, model or batch regime changes the non-speculative rate too; measure it at "
            "the batch size the server runs. A measured source (`demo_measured`) is taken at the "
            "served batch under the same load, so believe it.",
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
        "The engine's own gauges (vLLM `vllm:num_requests_running`/`waiting`, SGLang "
        "`sglang:num_running_reqs`/`num_queue_reqs`, or specobs's `specobs_requests_*` where an "
        "engine sets them) report requests on a host whose specobs exporter is up, but no cycle "
        "ended there recently (`specobs_last_cycle_timestamp_seconds`): decoding is stuck, or "
        "specobs is no longer called from the decode loop. Engine and specobs series are joined "
        "on `host`, the `instance` without its port, within the same cluster and namespace.",
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
    "LowAcceptanceRequestsJump": (
        "Among the requests that finished on this server in the last 15 minutes, a far larger "
        "share than in the hour before accepted almost none of their drafted tokens "
        "(`specobs_request_acceptance`, the bucket at or below 20%). The server's overall "
        "acceptance averages over every request and may look fine: one collapsed slot of "
        "sixteen (llama.cpp#27117: 0.06-0.49, under sustained load 0.0018) moves it little. "
        "Very low acceptance also goes with garbled output (vllm#44487).",
        [
            "`specobs top http://<instance>/metrics`: the per-request distribution and the "
            "worst requests' trace ids (OpenMetrics exemplars on the lowest buckets); open "
            "those traces: which slot, tenant, prompt or sampling settings do they share?",
            "Cycle breakdown, *Acceptance by draft position*: a server-wide collapse at "
            "position 0 is a broken draft (SpecobsAcceptanceBelowCohort fires too); a few "
            "requests collapsing points at per-request state: a slot's KV or draft cache "
            "reused wrongly, a sampling temperature, a language or domain the draft never saw.",
            "The engine's own per-request figures (vLLM `--per-request-spec-decode-metrics`, "
            "SGLang `meta_info.spec_accept_rate`) for the same requests.",
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
            "`exception` does not raise this alert: the engine's step raised inside `with "
            "observer.cycle()` and the cycle was discarded (its times mean nothing). The "
            "*Dropped records and errors* panel shows it; look at the engine's log, not at "
            "specobs.",
            "`graph_capture`, `misuse`, `fork`, `shutdown`: see docs/metrics.md for the meaning; "
            "`misuse` also counts in `specobs_exporter_errors_total{kind}`.",
        ],
    ),
}


def render(config: MixinConfig) -> str:
    """docs/runbook.md: what the alerts share, a summary table, then one entry per alert."""
    names = RuleNames(config)
    alerts = alert_rules(config)
    lines = [*_intro(config, names), *_summary(config, alerts), ""]
    for alert in alerts:
        lines += _entry(alert)
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


def _intro(config: MixinConfig, names: RuleNames) -> list[str]:
    """The page's heading and what every alert shares: history, cohorts, detection times."""
    return [
        *markdown_heading("specobs/mixin", "specobs runbook"),
        "One entry per alert of `deploy/prometheus/rules/specobs-rules.yml`: what it means and "
        "what to check first. Every alert carries `severity`, a static `summary`, a templated "
        "`description` and a `runbook_url` pointing at its entry here.",
        "",
        "Alerts that compare a server with *its own recent past* use the average of a recording "
        f"rule over the {config.history_window} ending {config.history_offset} ago, so a "
        "regression does not hide in its own reference. They read it from the rule's "
        f"{config.history_step} averages (`{history_name(names.phase_mean, config)}` and the "
        f"like, the group `specobs-history`, evaluated every {config.history_step}): "
        f"{_count(config)} samples per series per evaluation instead of one per evaluation "
        f"of the whole {config.history_window}. The reference window therefore moves in "
        f"{config.history_step} steps: it holds the data from up to "
        f"{_plus(_plus(config.history_window, config.history_offset), config.history_step)} "
        f"ago up to between {config.history_offset} and "
        f"{_plus(config.history_offset, config.history_step)} ago, so a fault enters the "
        f"reference up to {config.history_step} later than it would at every evaluation (never "
        "sooner), and detection is never later. "
        "Thresholds and windows come from "
        "`specobs.mixin.MixinConfig`; regenerate with your own values.",
        "",
        "A **cohort** is the servers of one model and engine (labels "
        f"`{config.model_label}`, `{config.engine_label}`) in one "
        f"{', '.join(f'`{g}`' for g in config.group_labels) or 'fleet'} and job. Cohort alerts "
        "compare a server with the cohort's median server (a new pod needs no past of its own) "
        "or the whole cohort with its own recent past (a rollout replaces every instance but "
        "not the cohort).",
        "",
        "**Detected after** is measured by the generated promtool tests "
        "(`deploy/prometheus/rules/specobs-rules.test.yml`, rule evaluation every "
        f"{_rule_tests.EVALUATION_INTERVAL}, a sample a minute, 15 s for the stall cases): the "
        "alert is proven silent at the first time and firing at the second, counted from the "
        "fault (the default thresholds; a milder fault takes longer).",
        "",
        "| Alert | Severity | For | Catches | Detected after (promtool) | Cannot see |",
        "| --- | --- | --- | --- | --- | --- |",
    ]


def _summary(config: MixinConfig, alerts: list[AlertRule]) -> list[str]:
    """One table row per alert, with the detection times the promtool cases prove."""
    lines = []
    times = _rule_tests.detection_times() if _rule_tests.is_default(config) else {}
    for alert in alerts:
        measured = (
            "; ".join(
                f"{_duration(fired)} ({case}; silent at {_duration(silent)})"
                for case, silent, fired in times.get(alert.alert, [])
            )
            or "not measured for this config"
        )
        short = alert.alert.removeprefix(ALERT_PREFIX)
        lines.append(
            f"| [{alert.alert}](#{alert.anchor}) | {alert.severity} | {alert.for_} | "
            f"{alert.summary} | {measured} | {_BLIND[short]} |"
        )
    return lines


def _entry(alert: AlertRule) -> list[str]:
    """One alert's section: what it means, what it cannot see, what to check, its expression."""
    short = alert.alert.removeprefix(ALERT_PREFIX)
    meaning, checks = _ENTRIES[short]
    return [
        f"## {alert.alert}",
        "",
        f"**Severity:** {alert.severity} · **for:** {alert.for_} · **summary:** "
        f"{alert.summary}",
        "",
        meaning,
        "",
        f"**Cannot see:** {_BLIND[short]}",
        "",
        _doctor_line(short),
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


def _doctor_line(name: str) -> str:
    codes, what = _DOCTOR[name]
    command = (f"`specobs doctor --prometheus <prometheus URL> --instance <instance>` over the "
               "alert's window, or `specobs doctor http://<instance>/metrics --min-cycles "
               f"{DOCTOR_MIN_CYCLES}` on the server itself (docs/diagnosis.md)")
    found = f": findings {', '.join(f'`{c}`' for c in codes)}; " if codes else ": "
    return f"**Explain with:** {command}{found}{what}."


def doctor_entries() -> dict[str, tuple[tuple[str, ...], str]]:
    """The doctor findings each alert's entry names, keyed by alert name without the prefix."""
    return dict(_DOCTOR)


def _count(config: MixinConfig) -> int:
    """Samples per series in one history window: one per ``history_step``."""
    return round(duration_seconds(config.history_window) / duration_seconds(config.history_step))


def _plus(a: str, b: str) -> str:
    """The sum of two Prometheus durations, written as one (``10m`` + ``5m`` = ``15m``)."""
    total = duration_seconds(a) + duration_seconds(b)
    if total % 60:
        return f"{total:g}s"
    if total % 3600 or total < 3600:
        return f"{total // 3600:g}h{total % 3600 / 60:g}m" if total > 3600 else f"{total / 60:g}m"
    return f"{total / 3600:g}h"


def _duration(minutes: float) -> str:
    whole = int(minutes)
    seconds = round((minutes - whole) * 60)
    return f"{whole} min {seconds} s" if seconds else f"{whole} min"


def entries() -> dict[str, tuple[str, list[str]]]:
    """Runbook text keyed by alert name without the prefix (tests check every alert has one)."""
    return dict(_ENTRIES)
