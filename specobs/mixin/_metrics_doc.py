"""docs/metrics.md, from the catalog and the recording rules."""

from __future__ import annotations

import specobs.catalog as c
from specobs.mixin._config import MixinConfig, markdown_heading
from specobs.mixin._rules import (
    ENGINE_REQUEST_GAUGES,
    RuleNames,
    alert_inputs,
    history_rules,
    recording_rules,
)

__all__ = ["render"]


def _buckets(metric: c.Metric) -> str:
    if metric.kind != "histogram":
        return ""
    if metric is c.DRAFT_LENGTH:
        return "0, 1, ..., k (k = max draft length; `draft_length_buckets(k)`)"
    if metric.buckets is None:
        return "0, 1, ..., k+1 (k = max draft length; `accept_length_buckets(k)`)"
    return ", ".join(f"{b:g}" for b in metric.buckets)


def render(config: MixinConfig) -> str:
    """docs/metrics.md: the catalog, its labels, the quantities derived from it, the series
    read from other exporters, and every recording rule."""
    n = RuleNames(config)
    lines = [
        *_catalog(config),
        *_label_values(config),
        *_derived_counts(config, n),
        *_derived_speedup(),
        *_derived_per_cycle(n),
        *_other_exporters(config),
        *_recording_rules(config, n),
    ]
    return "\n".join(lines)


def _catalog(config: MixinConfig) -> list[str]:
    """The table of every metric, then each histogram's buckets."""
    lines = [
        *markdown_heading("specobs/catalog.py", "specobs metrics"),
        "Every series specobs exports. The OpenTelemetry name and unit translate to the "
        "Prometheus name by the OpenTelemetry specification's rules, so the same series arrives "
        "under the same name by Prometheus scrape or by OTLP through a Collector. Besides the "
        "labels listed, every series carries the constant labels you configure (for example "
        f"`{config.model_label}` and `{config.engine_label}`) and Prometheus's `job` and "
        "`instance`.",
        "",
        "| Prometheus name | OpenTelemetry name | Kind | Unit | Labels | Description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for metric in c.CATALOG:
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
        kind = metric.kind + (" (self)" if metric.self_metric else "")
        lines.append(
            f"| `{metric.name}` | `{metric.otel_name}` | {kind} | `{metric.unit or '-'}` | "
            f"{labels} | {metric.help} |"
        )
    lines += ["", "## Histogram buckets", "", "| Histogram | Upper bounds |", "| --- | --- |"]
    for metric in c.CATALOG:
        if metric.kind == "histogram":
            lines.append(f"| `{metric.name}` | {_buckets(metric)} |")
    return lines


def _label_values(config: MixinConfig) -> list[str]:
    return [
        "",
        "## Label values",
        "",
        "- `clock`: `gpu` (CUDA events, sampled cycles only) or `host` (perf_counter, every "
        "cycle). The GPU series count only sampled cycles, so a GPU mean is "
        '`rate(..._sum{clock="gpu"}) / rate(..._count{clock="gpu"})` of the GPU series '
        "itself, never divided by all cycles.",
        f"- `phase`: `{config.draft_phase}`, `{config.verify_phase}`, `bookkeeping` by default; "
        "engines may name their own.",
        "- `reason` of `specobs_exporter_dropped_records_total`: "
        + ", ".join(f"`{r}`" for r in c.DROP_REASONS)
        + ".",
        "- `kind` of `specobs_exporter_errors_total`: "
        + ", ".join(f"`{k}`" for k in c.ERROR_KINDS)
        + ".",
    ]


def _derived_counts(config: MixinConfig, n: RuleNames) -> list[str]:
    """Acceptance, the batch, per-sequence speed, realized speedup, accept length."""
    return [
        "",
        "## Derived quantities",
        "",
        "- **Acceptance rate** = accepted / drafted tokens.",
        "- **Per-request acceptance.** `specobs_request_acceptance` takes one sample per "
        "finished request that drafted at least one token: its accepted / drafted draft tokens "
        "over its whole life, as the engine reports them when it finishes "
        "(`Observer.request_finished`; the transformers instrumentor and `specobs demo` do, the "
        "vLLM and SGLang instrumentors from the engines' own per-request counts). Its buckets "
        "show the spread the aggregate rate hides (one collapsed slot of many); no request id "
        "is a label, so its series stay 14 per server. The worst requests are its exemplars "
        f"(OpenMetrics, buckets up to {c.REQUEST_ACCEPTANCE_EXEMPLAR_MAX:g}): the latest traced "
        "request in each, its trace id as `trace_id` (no `span_id`). "
        "`specobs_requests_finished_total` counts every request reported, those that drafted "
        f"nothing included. `{n.request_low_share}` is the share of requests at or below "
        f"{config.request_acceptance_low:g}, which SpecobsLowAcceptanceRequestsJump compares "
        "with its own past.",
        "- **Mean batch size** = `rate(specobs_batch_size_sum) / rate(specobs_cycles_total)`.",
        "- **Tokens per second per sequence** (realized) = (emitted tokens / sequences) / mean "
        "host cycle time, where sequences = `rate(specobs_batch_size_sum)`. It is what one "
        "sequence experiences and, unlike tokens/s, does not fall when load falls.",
        "- **Realized speedup** = tokens/s per sequence / "
        "`specobs_baseline_sequence_tokens_per_second` (the non-speculative rate of one "
        "sequence, configured or measured), recorded as "
        f"`{n.speedup_realized}` with the baseline's `source` label; `specobs top`, "
        "`specobs report` and `specobs doctor` compute the same ratio from the same counters.",
        "- **Accept length.** `specobs_accept_length` counts accepted *draft* tokens per "
        "draft and cycle (0..k), **excluding** the target's bonus token: one sample per sequence "
        "that drafted at least one token, so its count is vLLM's `num_drafts` (a sequence in "
        "prefill, or an n-gram with no match, drafts nothing: it emits its token, counted in "
        "`specobs_emitted_tokens_total`, but has no accept length). The recording rule "
        f"`{n.accept_length_excl_bonus}` is its mean. vLLM's and SGLang's dashboards show the "
        "mean acceptance length **including** the bonus token (vLLM: 1 + accepted / drafts); "
        f"`{n.accept_length_incl_bonus}` = 1 + the former is that number.\n"
        "  `specobs top`, `specobs demo` and `specobs report` show that one first, as \"accept "
        "length\"\n  / \"mean acceptance length (incl. bonus)\", with the accepted drafts beside "
        "it (top:\n  `accept_len=4.26 accepted_per_draft=3.26`; live: `accept length 4.26 (1 + "
        "3.26)`).",
    ]


def _derived_speedup() -> list[str]:
    """The cost model's prediction, its calibration, and the baseline's source."""
    return [
        "- **Predicted speedup** = E x t_plain / (t_draft + t_verify + t_bookkeeping), per "
        "clock: the cost model at the measured point. E is the tokens acceptance gives one "
        "sequence per cycle, 1 + accepted / sequences (= 1 + a_1 + a_1 a_2 + ... with a_i the "
        "*conditional* acceptance at position i; the i.i.d. closed form (1 - a^(k+1)) / (1 - a) "
        "needs that per-token conditional a, not accepted / drafted, and is not used); t_plain "
        "= 1 / the baseline, the plain decode step the engine measured (or the one configured); "
        "the t are the measured mean phase times. A plain step is not taken to cost one "
        "verify: on every GPU at moderate batch a verify of B (k + 1) tokens costs more than a "
        "step of B. `specobs doctor` fits the forward's cost over tokens from the plain step "
        "and each k's verify to predict other ks (docs/diagnosis.md).",
        "- **Calibration** (`instance:specobs_speedup:calibration_rate5m`) = realized speedup "
        "over wall time (x (1 - the share of busy time between cycles)) / predicted on the "
        "host clock. The baseline cancels, so it is 1 while the model accounts for the time "
        "and the tokens, whatever the baseline's age. Below 1: time between cycles "
        "(`instance:specobs_cycle_gap:share_rate5m`), cycle time outside the draft, verify and "
        "bookkeeping phases, or tokens acceptance promised that were not emitted (sequences "
        "that finished inside a cycle). doctor reads the same three when its prediction and "
        "the realized speedup differ by more than 10%.",
        "- **The baseline and its `source`.** Realized speedup compares like with like only when "
        "the baseline was measured at the batch size the server runs at, on the same machine "
        "under the same load: per-sequence speed falls as the batch grows, with or without "
        "speculation. A baseline set by `SPECOBS_BASELINE_TOKENS_PER_SECOND` is exported without "
        "a `source` label and the rules call it `source=\"configured\"`: you measured it, keep it "
        "at the served batch. `specobs demo` measures its own, `source=\"demo_measured\"`: after "
        "every 16th speculative cycle its engine thread runs one plain decode step (one target "
        "forward of one token per sequence, the argmax and the host copy) for the very batch it "
        "serves, at the same positions, into a scratch KV cache and outside specobs's cycle "
        "timing; the baseline is 1 / the mean step time over the last 60 s. So it has the served "
        "batch size, the machine's current load and the same threads competing for the CPU as "
        "the cycles it is compared with (a start-up measurement at batch 1 read 22.7 and 57.5 "
        "tokens/s in two starts of one VM). It leaves out what a plain decoder also pays per "
        "token (handing tokens to requests), so realized speedup errs low, not high. On a CPU "
        "the demo's speculation realizes about 1.6-2x: a k+1-token verify costs about one plain "
        "step there, the four draft steps about as much again, and 3.7 tokens per cycle pay "
        "for both. Where the engine replays CUDA graphs the plain step is replayed as a graph too: "
        "on an H200 at batch 4 the demo realized 1.97x (an eagerly launched plain step would "
        "have read 12.6x). An engine whose schedule runs steps that draft nothing (draft length "
        "0, below) measures it too, `source=\"plain_steps\"`: such a step emits one token per "
        "sequence, so the baseline is the k = 0 cycles over their host seconds "
        f"(`{c.CYCLES_BY_DRAFT_LENGTH.name}{{draft_length=\"0\"}}` over the phases' "
        f"`{c.PHASE_TIME_BY_DRAFT_LENGTH.name}{{draft_length=\"0\"}}`), cumulative since the "
        f"observer started, exported once {c.PLAIN_STEPS_MIN_CYCLES} of them ran. A configured "
        "baseline wins: with one set, the measured one is not exported. How it differs from one "
        "configured by hand: it is measured by the engine itself, on its machine and load, "
        "needing no configuration; but it is taken at the batch sizes where the schedule turns "
        "speculation off (the large ones), where a sequence decodes slower than at the small "
        "batches speculation runs at, so at those small batches realized speedup reads high "
        "against it. Read it beside the k in effect and the batch (the dashboards show both), "
        "or configure a baseline measured at the served batch where that matters.",
    ]


def _derived_per_cycle(n: RuleNames) -> list[str]:
    """The draft length in effect, the time between cycles, the batch at k, the overhead."""
    return [
        "- **The draft length in effect.** Engines change k at run time (vLLM's "
        "`num_speculative_tokens_per_batch_size` bands, k = 0 included; SGLang's adaptive tiers; "
        "TRT-LLM's `draft_len_schedule`). Each cycle is counted under the k the engine passed "
        "to `begin(draft_length=k)` (the k its draft phase drafts; a step that drafts nothing "
        "is a cycle of draft length 0, its phases timed), else under the draft length its "
        "`accept(...)` named (an int, or the largest of one per sequence), else under none and "
        f"left out of `{c.DRAFT_LENGTH.name}` and the cycle series by k "
        f"(`{c.CYCLES_BY_DRAFT_LENGTH.name}`, `{c.PHASE_TIME_BY_DRAFT_LENGTH.name}`, "
        f"`{c.EMITTED_BY_DRAFT_LENGTH.name}`: phase time, cycles and throughput per k). "
        f"`{c.ACCEPTED_BY_DRAFT_LENGTH.name}` and `{c.DRAFTED_BY_DRAFT_LENGTH.name}` are keyed by "
        "each sequence's own draft length instead, the drafts it verified, so their ratio is "
        "the acceptance at k even where a cycle verifies one k and drafts another (vLLM's V2 "
        "runner verifies the previous step's drafts). Label `draft_length` is the decimal k, "
        "only the lengths seen (at most max draft length + 1 values). A value that is not an "
        "int in 0..max draft length is counted as `specobs_exporter_errors_total"
        "{kind=\"bad_draft_length\"}` and the cycle kept without a k.",
        "- **The time between cycles.** `specobs_cycle_gap_seconds` observes, for each cycle, "
        "the host seconds since the end of the previous cycle the same thread recorded on the "
        "observer (cycles of every k, plain k = 0 steps included): what the engine does outside "
        "speculative cycles (its scheduler, detokenisation, Python between steps), which the "
        "phases never see. It is measured by the resolver from the host stamps every cycle "
        "carries, off the engine's thread. A thread's first cycle has no gap. A gap longer than "
        "`idle_gap_seconds` (`SPECOBS_IDLE_GAP_SECONDS`, default 1 s) is the engine waiting for "
        "work, counted in `specobs_cycle_idle_gaps_total` and not observed. A cycle specobs "
        "never resolves (dropped when the queue was full, discarded as misuse or by an "
        "exception, begun in CUDA graph capture) ends the gaps of every thread: the next cycle "
        "starts afresh, so no gap spans a lost cycle. "
        f"`{n.gap_mean}` is the mean gap; `{n.gap_share}` = gap seconds / (gap seconds + host "
        "cycle seconds), the share of the engine's busy time spent outside cycles.",
        "- **Mean batch at each k.** `specobs_sequences_by_draft_length_total` sums the batch "
        "sizes of the cycles of each draft length in effect (keyed as "
        f"`{c.CYCLES_BY_DRAFT_LENGTH.name}`, by the cycle's k), so "
        "`rate(specobs_sequences_by_draft_length_total) / "
        "rate(specobs_cycles_by_draft_length_total)` is the mean batch at k, and that x (k + 1) "
        "the tokens one verify checks: with the verify phase's time at k "
        f"(`{c.PHASE_TIME_BY_DRAFT_LENGTH.name}`) it shows how the target forward's cost "
        "grows with the tokens verified. A cycle without a batch size adds no sequences.",
        "- **The overhead gauge, and how near it reads.** `specobs_exporter_overhead_ratio` "
        "adds up what specobs measures of itself on host clocks: the event records on sampled "
        "cycles, an estimate per phase boundary, the native core's CUDA acceptance copies (the "
        "host time of their runtime calls) and the resolver's CPU per cycle, over the mean "
        "cycle time. Against the loss measured side by side on an H200 (cycles/s with specobs "
        "over without, `benchmarks/gpu_overhead.py`, two or three runs a row; "
        "benchmarks/RESULTS.md): within "
        "0.01-0.24 points on 0.22 ms CUDA-graph cycles with acceptance as a list (0.88 % against "
        "0.89 %, 1.22 % against 0.98 %); low by 0.5-1.6 points with acceptance as a CUDA tensor "
        "there (3.3 % against 3.8 %, 2.8 % against 3.9 %), because the copy also costs time on "
        "the engine's stream, which no host clock sees; on 2.5-3 ms cycles from 0.2 points low "
        "to 0.4 high for a list (0.27-0.5 % against 0.04-0.48 %: the benchmark's own "
        "resolution there) and high by 0.4-2.4 for a CUDA tensor (1.0-2.9 % against 0.5-0.6 "
        "%), because there the worker waits on the GPU while most event records and the "
        "copies' runtime calls (14-29 µs each there, against 5-9 µs on short cycles) run. Its "
        "resolver part is the resolver's CPU under the GIL per cycle that ended, read over at "
        "least 256 cycles (before, a flush's slice could make the gauge read 26 %). Read it "
        "as the right order of magnitude on short cycles and as an upper bound on long ones "
        "with CUDA tensors; measure the loss itself before acting on a tenth of a point. "
        "`specobs_exporter_cpu_time_seconds_total{component=\"acceptance_copy\"}` is the copies' "
        "part.",
    ]


def _other_exporters(config: MixinConfig) -> list[str]:
    return [
        "",
        "## Series from other exporters",
        "",
        "The stall alert also reads the engines' own request gauges: "
        + ", ".join(f"`{name}`" for name in ENGINE_REQUEST_GAUGES)
        + ". They are joined with specobs's series on `host` (the `instance` without its "
        "port) within the same "
        + (", ".join(f"`{g}`" for g in config.group_labels) or "Prometheus")
        + ", so the engine's endpoint and specobs's of one pod or machine meet.",
    ]


def _recording_rules(config: MixinConfig, n: RuleNames) -> list[str]:
    """The rule groups explained, then one row per recording rule with its expression."""
    lines = [
        "",
        "## Recording rules",
        "",
        f"Generated into `deploy/prometheus/rules/specobs-rules.yml`; named "
        f"`level:metric:operations`, window {config.rate_window}. The `instance` level keeps "
        f"`{config.by}`; the `cohort` level `{config.cohort_by}` (the servers of one model and "
        f"engine, whatever their instance); the `host` level `{config.host_by}`. The groups, "
        "which Prometheus evaluates concurrently, are derived from the expressions: the alerts "
        "split into components that share no recording rule, each group holding its alerts "
        "and every rule they read (`specobs` the first; so each alert reads the rules of its "
        "own evaluation); `specobs-history`, evaluated every "
        f"{config.history_step}, the {config.history_step} averages the history alerts read "
        f"{config.history_offset} and more in the past (marked *history* below); "
        "`specobs-dashboards` (and more, split by cost) the rules only dashboards read (marked "
        "*dashboards* below). Cycle-time bucket rates and the p99 are recorded for the host "
        "clock only; the fleet heatmaps "
        "read bucket rates summed per cohort.",
        "",
        "| Rule | Expression |",
        "| --- | --- |",
    ]
    inputs = alert_inputs(config)
    history = {r.record for r in history_rules(config)}
    for rule in [*recording_rules(config), *history_rules(config)]:
        expr = " ".join(rule.expr.split()).replace("|", "\\|")
        group = (
            "" if rule.record in inputs
            else " (*history*)" if rule.record in history
            else " (*dashboards*)"
        )  # fmt: skip
        lines.append(f"| `{rule.record}`{group} | `{expr}` |")
    lines += [
        "",
        f"The fleet dashboard reads only these rules (for example `{n.sequence_speed}`), so it "
        "stays fast for a thousand servers.",
        "",
    ]
    return lines
