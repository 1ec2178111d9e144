"""What the two generated Grafana dashboards show (the panels' house style and grafanalib live in
:mod:`specobs.mixin._panels`).

Two dashboards, both with the variables ``datasource``, ``job``, ``instance`` (multi) and
``model``, fixed uids and grid positions:

* **cycle breakdown** — one server (or a few) in depth, from the raw series with
  ``$__rate_interval``: where a cycle's time goes on the GPU and host clocks, latency quantiles and
  heatmaps with exemplars, acceptance, throughput, speedup, and the exporter's own health;
* **fleet** — every server at once, from the ``instance:`` recording rules only, so it stays fast
  for a thousand servers.
"""

from __future__ import annotations

from typing import Any

import specobs.catalog as c
from specobs.mixin._config import MixinConfig, duration_seconds
from specobs.mixin._panels import (
    NEEDS_PLUGIN,
    NEEDS_PLUGIN_VALUE,
    NO_GPU_CLOCK,
    NO_TRAFFIC,
    RATE,
    PanelBuilder,
    dashboard_variables,
)
from specobs.mixin._rule_names import BASELINE_CONFIGURED, ENGINE_SOURCE, RuleNames

#: The ``source`` the fleet dashboard gives a server's figures from specobs's plugin.
PLUGIN_SOURCE = "plugin"

__all__ = ["ENGINE_LATENCY", "NO_ENGINE_METRICS", "render_cycle_breakdown", "render_fleet"]

GPU = 'clock="gpu"'
HOST = 'clock="host"'


def _matchers(config: MixinConfig, *, instance: bool = True, engine: bool = False) -> str:
    """The dashboard variables as label matchers: group labels, job, model (and instance, and
    with ``engine`` the serving engine)."""
    parts = [f'{label}=~"${label}"' for label in config.group_labels]
    parts.append('job=~"$job"')
    if instance:
        parts.append('instance=~"$instance"')
    parts.append(f'{config.model_label}=~"$model"')
    if engine:
        parts.append(f'{config.engine_label}=~"${config.engine_label}"')
    return ", ".join(parts)


#: The engines' own request latency histograms (title, what it is, series names without
#: ``_bucket``), read where Prometheus scrapes the engine: vLLM's and SGLang's names, and
#: vLLM's name for inter-token latency before it was renamed.
ENGINE_LATENCY: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Inter-token latency", "Time between two tokens of a request (TPOT/ITL)",
     ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
      "sglang:inter_token_latency_seconds")),
    ("Time to first token", "Time from a request's arrival to its first token",
     ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")),
    ("End-to-end request latency", "Time from a request's arrival to its last token",
     ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")),
)
#: What an engine-latency panel shows when the engine's metrics are not scraped.
NO_ENGINE_METRICS = "Engine metrics not scraped"


def _engine_matchers(config: MixinConfig) -> str:
    """The engine's series come from its own scrape job and port: matched by the group labels
    and the model only (vLLM and SGLang both label ``model_name``), not by job or instance."""
    parts = [f'{label}=~"${label}"' for label in config.group_labels]
    parts.append(f'{config.model_label}=~"$model"')
    return ", ".join(parts)


#: Draft positions the conditional-acceptance panel plots (0 .. this - 1).
CONDITIONAL_POSITIONS = 8


def _conditional_acceptance(srate: Any) -> str:
    """Accepted at position i over accepted at i - 1 (position 0: over drafted at 0), one
    ``or``-ed term per position so a position nobody drafts is simply absent."""
    acc, drafted = c.ACCEPTED_BY_POSITION.name, c.DRAFTED_BY_POSITION.name

    def at(i: int) -> str:
        return f'position="{i}"'

    terms = [f"{srate('position', acc, at(0))}\n/\n({srate('position', drafted, at(0))} > 0)"]
    for i in range(1, CONDITIONAL_POSITIONS):
        terms.append(
            f"label_replace(\n  {srate('', acc, at(i))}\n  /\n"
            f"  ({srate('', acc, at(i - 1))} > 0),\n"
            f'  "position", "{i}", "", ""\n)'
        )
    return "\nor\n".join(terms)


def render_cycle_breakdown(config: MixinConfig) -> str:
    sel = _matchers(config)

    def s(name: str, extra: str = "") -> str:
        return f"{name}{{{sel}{', ' + extra if extra else ''}}}"

    def rate(name: str, extra: str = "") -> str:
        return f"rate({s(name, extra)}[{RATE}])"

    def srate(by: str, name: str, extra: str = "") -> str:
        return f"sum by ({by}) ({rate(name, extra)})" if by else f"sum({rate(name, extra)})"

    phase = c.PHASE_DURATION.name
    cycle = c.CYCLE_DURATION.name
    b = PanelBuilder(config)
    # The token counts mean the same everywhere; the phase cut follows each engine's code.
    per_engine = (
        f" What each phase covers depends on the engine (label {config.engine_label}, and "
        "specobs_info{integration}): in SGLang bookkeeping is mostly the draft model's catch-up "
        "forward, in vLLM host-side output processing, in transformers token selection and cache "
        "crop; compare phases between servers of one engine (docs/integrations.md)."
    )

    # Shared by the headline row and the throughput row below.
    emitted_per_sequence = (
        f"(\n  {srate('instance', c.EMITTED_TOKENS.name)}\n  /\n"
        f"  ({srate('instance', c.BATCH_SIZE.name + '_sum')} > 0)\n)"
    )
    seq_speed = (
        f"{emitted_per_sequence}\n/\n"
        f"(\n  {srate('instance', cycle + '_sum', HOST)}\n  /\n"
        f"  ({srate('instance', cycle + '_count', HOST)} > 0)\n)"
    )
    realized = (
        f"{seq_speed}\n/ on (instance) group_left (source)\n(\n"
        f"  max by (instance, source) (\n    label_replace("
        f'{s(c.BASELINE_SEQUENCE_TOKENS.name)}, "source", "{BASELINE_CONFIGURED}", '
        '"source", "")\n  )\n  > 0\n)'
    )
    accepted_per_sequence = (
        f"{srate('instance', c.ACCEPT_LENGTH.name + '_sum')}\n/\n"
        f"({srate('instance', c.ACCEPT_LENGTH.name + '_count')} > 0)"
    )

    b.row("At a glance")
    b.stat(
        "Tokens/s",
        "Tokens emitted per second by the selected servers (accepted draft tokens plus bonus "
        "tokens), summed.",
        "short",
        srate("", c.EMITTED_TOKENS.name),
        w=5,
    )
    b.stat(
        "Speedup",
        "Realized speedup: tokens/s per sequence over the non-speculative baseline. Red below "
        "1: speculation is slower than not speculating.",
        "none",
        f"min(\n{realized}\n)",
        w=5,
        red_below=1.0,
        decimals=2,
    )
    b.stat(
        "Acceptance rate",
        "Accepted draft tokens / drafted tokens over the selected servers.",
        "percentunit",
        f"{srate('', c.ACCEPTED_TOKENS.name)}\n/\n({srate('', c.DRAFT_TOKENS.name)} > 0)",
        w=5,
    )
    b.stat(
        "Mean acceptance length",
        "Tokens a sequence gains per cycle, the target's bonus token included: the number vLLM's "
        "and SGLang's dashboards call mean acceptance length (1 + accepted draft tokens).",
        "short",
        f"1 + {srate('', c.ACCEPT_LENGTH.name + '_sum')}\n/\n"
        f"({srate('', c.ACCEPT_LENGTH.name + '_count')} > 0)",
        w=5,
        decimals=2,
    )
    b.stat(
        "Cycle p99",
        "99th percentile of the whole cycle's duration on the host clock (every cycle).",
        "s",
        f"histogram_quantile(0.99, {srate('le', cycle + '_bucket', HOST)}) >= 0",
        w=4,
    )

    b.row("Where a cycle's time goes")
    for clock, what in (
        ("host", "measured with perf_counter on the host, on every cycle"),
        ("gpu", "measured on the GPU's own clock with CUDA events, on sampled cycles only"),
    ):
        b.timeseries(
            f"Mean time per cycle by phase ({clock.upper() if clock == 'gpu' else clock} clock)",
            f"Mean seconds each phase takes per cycle, stacked, {what}. The stack's height is the "
            "mean cycle time. Averaged over the selected instances." + per_engine,
            "s",
            [
                (
                    f"{srate('phase', phase + '_sum', GPU if clock == 'gpu' else HOST)}\n/\n("
                    f"{srate('phase', phase + '_count', GPU if clock == 'gpu' else HOST)} > 0)",
                    "{{phase}}",
                )
            ],
            stack=True,
            no_value=NO_GPU_CLOCK if clock == "gpu" else NO_TRAFFIC,
        )
    b.timeseries(
        "Mean cycle time: GPU vs host clock",
        "Mean cycle duration on each clock. Host time above GPU time is launch and Python overhead "
        "the GPU waits through; GPU above host means the host runs ahead (CUDA graphs, async).",
        "s",
        [
            (
                f"{srate('clock', cycle + '_sum')}\n/\n({srate('clock', cycle + '_count')} > 0)",
                "{{clock}}",
            )
        ],
    )
    b.timeseries(
        "Phase share of the cycle (GPU clock)",
        "Fraction of GPU cycle time spent in each phase. A growing draft share means the draft "
        "model costs more of each cycle than it used to." + per_engine,
        "percentunit",
        [
            (
                f"{srate('phase', phase + '_sum', GPU)}\n/ ignoring (phase) group_left ()\n"
                f"({srate('', phase + '_sum', GPU)} > 0)",
                "{{phase}}",
            )
        ],
        stack=True,
        no_value=NO_GPU_CLOCK,
    )
    b.timeseries(
        "Phase latency p50 / p90 / p99",
        "Quantiles of each phase's duration per clock, from the histogram buckets. Exemplars "
        "(dots) are individual sampled cycles; with a trace datasource they open the cycle's "
        "trace." + per_engine,
        "s",
        [
            (
                f"histogram_quantile({q}, {srate('phase, clock, le', phase + '_bucket')}) >= 0",
                f"{{{{phase}}}} {{{{clock}}}} p{int(q * 100)}",
            )
            for q in (0.5, 0.9, 0.99)
        ],
        exemplars=True,
    )
    b.heatmap(
        "Cycle time heatmap (host clock)",
        "Distribution of whole-cycle durations over time (host clock, every cycle). Exemplars "
        "link to traces when a trace datasource is configured.",
        "s",
        srate("le", cycle + "_bucket", HOST),
        exemplars=True,
    )
    b.timeseries(
        "Cycle time p50 / p99 by clock",
        "Quantiles of whole-cycle duration on each clock, with exemplars.",
        "s",
        [
            (
                f"histogram_quantile({q}, {srate('clock, le', cycle + '_bucket')}) >= 0",
                f"{{{{clock}}}} p{int(q * 100)}",
            )
            for q in (0.5, 0.99)
        ],
        exemplars=True,
    )

    b.timeseries(
        "Engine thread: on a CPU and waiting for one, per cycle",
        "Seconds per cycle the thread that records cycles ran on a CPU and was runnable but "
        "waiting for one (Linux schedstat). Waiting that grows with the cycle time is other work "
        "on the host taking the CPUs, not the speculation; empty where the kernel does not say.",
        "s",
        [
            (
                f"{srate('state', c.WORKER_THREAD_TIME.name)}\n/ ignoring (state) group_left ()\n"
                f"({srate('', c.CYCLES.name)} > 0)",
                "{{state}}",
            )
        ],
        stack=True,
    )
    gap = c.CYCLE_GAP.name
    b.timeseries(
        "Time between cycles",
        "The engine's time outside speculative cycles (its scheduler, detokenisation, Python "
        "between steps), measured on the host from the end of a cycle to the begin of the next "
        "one its thread records: p50 and p99 (left axis), and its share of the time the engine "
        "was busy, gaps over gaps plus host cycle time (right axis). A share that grows while "
        "the phases hold still is overhead outside the speculation. Gaps longer than the idle "
        "bound (SPECOBS_IDLE_GAP_SECONDS, default 1 s) are the engine waiting for work: left "
        "out of the rest, their share of the gaps is the idle line (right axis).",
        "s",
        [
            *(
                (f"histogram_quantile({q}, {srate('instance, le', gap + '_bucket')}) >= 0",
                 f"p{int(q * 100)} {{{{instance}}}}")
                for q in (0.5, 0.99)
            ),
            (
                f"{srate('instance', gap + '_sum')}\n/\n(\n"
                f"  {srate('instance', gap + '_sum')}\n  +\n"
                f"  {srate('instance', cycle + '_sum', HOST)}\n  > 0\n)",
                "share {{instance}}",
            ),
            (
                f"{srate('instance', c.IDLE_GAPS.name)}\n/\n(\n"
                f"  {srate('instance', c.IDLE_GAPS.name)}\n  +\n"
                f"  {srate('instance', gap + '_count')}\n  > 0\n)",
                "idle {{instance}}",
            ),
        ],
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "(share|idle) .*"},
                "properties": [
                    {"id": "unit", "value": "percentunit"},
                    {"id": "max", "value": 1},
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.axisLabel", "value": "share"},
                ],
            }
        ],
    )

    b.row("Acceptance")
    b.timeseries(
        "Acceptance rate",
        "Accepted draft tokens / drafted tokens, per server. A draft model wired to the wrong "
        "hidden layers shows here as a collapse (on the demo's models, 81% to 18%).",
        "percentunit",
        [
            (
                f"{srate('instance', c.ACCEPTED_TOKENS.name)}\n/\n("
                f"{srate('instance', c.DRAFT_TOKENS.name)} > 0)",
                "{{instance}}",
            )
        ],
    )
    b.timeseries(
        "Accepted draft tokens per sequence-cycle (excl. bonus) and acceptance length (incl. "
        "bonus)",
        "Excl. bonus: accepted draft tokens per sequence per cycle (0..k), the mean of "
        "specobs_accept_length. Incl. bonus: 1 + that, the tokens a sequence gains per cycle "
        "including the target's bonus token: the number vLLM's and SGLang's dashboards call "
        "mean acceptance length.",
        "short",
        [
            (accepted_per_sequence, "excl. bonus {{instance}}"),
            (f"1 + {accepted_per_sequence}", "incl. bonus (vLLM's definition) {{instance}}"),
        ],
        axis_label="tokens",
    )
    b.timeseries(
        "Acceptance by draft position",
        "Of the tokens drafted at each position (0 = first), the fraction accepted. Acceptance at "
        "position i is conditional on positions before it being accepted, so it falls with i.",
        "percentunit",
        [
            (
                f"{srate('position', c.ACCEPTED_BY_POSITION.name)}\n/\n("
                f"{srate('position', c.DRAFTED_BY_POSITION.name)} > 0)",
                "position {{position}}",
            )
        ],
    )
    b.timeseries(
        "Conditional acceptance by draft position",
        "Of the sequences whose draft token at position i - 1 was accepted, the fraction whose "
        "token at position i was accepted too (position 0: of all drafted at 0). A healthy "
        "draft holds a high, slowly falling line; a collapse at position 0 alone is a draft "
        "that disagrees with the target from its first token (docs/metrics.md). Exact for a "
        "fixed speculation length; with adaptive lengths the later positions read high.",
        "percentunit",
        [(_conditional_acceptance(srate), "position {{position}}")],
    )
    b.timeseries(
        "Rejected draft tokens/s and the drafts' share of emitted tokens",
        "Rejected: drafted minus accepted tokens per second, compute the target verified for "
        "nothing (left axis). Share: the fraction of emitted tokens that came from accepted "
        "drafts rather than the target's bonus token (right axis).",
        "short",
        [
            (
                f"{srate('instance', c.DRAFT_TOKENS.name)}\n- on (instance)\n"
                f"{srate('instance', c.ACCEPTED_TOKENS.name)}",
                "rejected/s {{instance}}",
            ),
            (
                f"{srate('instance', c.ACCEPTED_TOKENS.name)}\n/\n("
                f"{srate('instance', c.EMITTED_TOKENS.name)} > 0)",
                "drafts' share {{instance}}",
            ),
        ],
        axis_label="tokens/s",
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "drafts' share.*"},
                "properties": [
                    {"id": "unit", "value": "percentunit"},
                    {"id": "max", "value": 1},
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.axisLabel", "value": "share"},
                ],
            }
        ],
    )
    b.heatmap(
        "Accept-length distribution",
        "How many draft tokens each sequence had accepted per cycle, over time: a mass at 0 means "
        "the draft rarely helps, a mass at k means a longer draft could pay.",
        "short",
        srate("le", c.ACCEPT_LENGTH.name + "_bucket"),
    )
    b.timeseries(
        "Batch size",
        "Sequences decoded together per cycle: mean and p90 per server. Larger batches make each "
        "cycle slower and each sequence slower, while the server emits more tokens.",
        "short",
        [
            (
                f"{srate('instance', c.BATCH_SIZE.name + '_sum')}\n/\n("
                f"{srate('instance', c.CYCLES.name)} > 0)",
                "mean {{instance}}",
            ),
            (
                f"histogram_quantile(0.9, {srate('instance, le', c.BATCH_SIZE.name + '_bucket')})"
                " >= 0",
                "p90 {{instance}}",
            ),
        ],
        axis_label="sequences",
    )

    # The cost model at the measured point (the rule instance:specobs_speedup:predicted_*):
    # tokens acceptance gives a sequence per cycle, times a plain step (1 / the baseline),
    # over the cycle's phases on each clock.
    baseline_any = f"(max by (instance) ({s(c.BASELINE_SEQUENCE_TOKENS.name)}) > 0)"
    predicted = (
        f"(\n  (1 + {srate('instance', c.ACCEPTED_TOKENS.name)}\n  / ("
        f"{srate('instance', c.BATCH_SIZE.name + '_sum')} > 0))\n"
        f"  / on (instance)\n  {baseline_any}\n)\n"
        f"/ on (instance) group_right ()\n(\n"
        f"  {srate('instance, clock', phase + '_sum')}\n  /\n"
        f"  ({srate('instance, clock', phase + '_count')} > 0)\n) > 0"
    )
    # Realized over wall time (gaps between cycles counted) over predicted on the host clock.
    gap = c.CYCLE_GAP.name
    busy_share = (
        f"(\n  1 - {srate('instance', gap + '_sum')}\n  / ("
        f"{srate('instance', gap + '_sum')} + {srate('instance', cycle + '_sum', HOST)} > 0)\n)"
        f"\nor on (instance)\n(0 * {srate('instance', c.CYCLES.name)} + 1)"
    )
    calibration = (
        f"{realized}\n* on (instance) group_left ()\n{busy_share}\n"
        f"/ on (instance) group_left ()\n(\n"
        f"  sum by (instance) (\n"
        f"    (1 + {srate('instance', c.ACCEPTED_TOKENS.name)}\n    / ("
        f"{srate('instance', c.BATCH_SIZE.name + '_sum')} > 0))\n"
        f"    / on (instance)\n    {baseline_any}\n  )\n"
        f"  / on (instance)\n"
        f"  (sum by (instance) ({rate(phase + '_sum', HOST)})\n"
        f"   / (max by (instance) ({rate(phase + '_count', HOST)}) > 0) > 0)\n)"
    )

    req = c.REQUEST_ACCEPTANCE.name
    low = f'le="{float(config.request_acceptance_low)!r}"'
    b.timeseries(
        "Per-request acceptance",
        "Finished requests' acceptance rates (each request's accepted / drafted tokens over its "
        "life): the 10th percentile and the median, and the share of requests at or below "
        f"{config.request_acceptance_low:.0%} (right axis). One slot or one kind of prompt "
        "whose acceptance collapsed shows here while the server's aggregate looks fine; the "
        "dots are the worst requests' exemplars (trace ids).",
        "percentunit",
        [
            (f"histogram_quantile(0.1, {srate('le', req + '_bucket')}) >= 0",
             "p10 {{instance}}"),
            (f"histogram_quantile(0.5, {srate('le', req + '_bucket')}) >= 0",
             "p50 {{instance}}"),
            (f"{srate('instance', req + '_bucket', low)}\n/\n"
             f"({srate('instance', req + '_count')} > 0)", "low share {{instance}}"),
        ],
        exemplars=True,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "low share .*"},
                "properties": [{"id": "custom.axisPlacement", "value": "right"}],
            }
        ],
    )

    b.row("Draft length in effect (k chosen at run time)")
    k_hist = c.DRAFT_LENGTH.name
    by_k = c.CYCLES_BY_DRAFT_LENGTH.name
    per_k = (
        "Engines change k at run time: vLLM's num_speculative_tokens_per_batch_size bands, "
        "SGLang's adaptive tiers, TRT-LLM's draft_len_schedule; k = 0 is a plain decode step "
        "(nothing drafted), recorded as a cycle. The cycle's k is what it drafted (vLLM "
        "verifies the previous step's drafts: acceptance by k uses each sequence's own)."
    )
    b.timeseries(
        "Draft length in effect and batch size",
        "Mean draft length k per cycle (left axis), mean sequences per cycle and the mean batch "
        "of the cycles run at each k (right axis): a schedule by batch size shows k stepping as "
        "the batch crosses its bands, each k at its own band of batches; batch x (k + 1) is the "
        "tokens one verify checks. " + per_k,
        "short",
        [
            (f"{srate('instance', k_hist + '_sum')}\n/\n"
             f"({srate('instance', k_hist + '_count')} > 0)", "k {{instance}}"),
            (f"{srate('instance', c.BATCH_SIZE.name + '_sum')}\n/\n"
             f"({srate('instance', c.BATCH_SIZE.name + '_count')} > 0)", "batch {{instance}}"),
            (f"{srate('draft_length', c.SEQUENCES_BY_DRAFT_LENGTH.name)}\n/ on (draft_length)\n"
             f"({srate('draft_length', by_k)} > 0)", "batch at k={{draft_length}}"),
        ],
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "batch .*"},
                "properties": [
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.axisLabel", "value": "sequences"},
                ],
            }
        ],
        axis_label="k",
    )
    b.timeseries(
        "Cycles by draft length",
        "Share of cycles run at each k over time, stacked; k=0 is the share of plain decode "
        "steps (speculation off at that batch). " + per_k,
        "percentunit",
        [(f"{srate('draft_length', by_k)}\n/ ignoring (draft_length) group_left ()\n"
          f"({srate('', by_k)} > 0)", "k={{draft_length}}")],
        stack=True,
    )
    b.timeseries(
        "Mean phase time by draft length (host clock)",
        "Mean seconds per cycle in each phase, for the cycles of each k (host clock, every "
        "cycle): draft time grows with k, verify with the tokens verified. " + per_k,
        "s",
        [(f"{srate('draft_length, phase', c.PHASE_TIME_BY_DRAFT_LENGTH.name)}\n"
          f"/ on (draft_length) group_left ()\n({srate('draft_length', by_k)} > 0)",
          "k={{draft_length}} {{phase}}")],
    )
    b.timeseries(
        "Acceptance by draft length",
        "Accepted / drafted tokens of the sequences that verified k drafts, per k. A rate that "
        "falls as k grows is the late positions' low acceptance (per position: the Acceptance "
        "row). " + per_k,
        "percentunit",
        [(f"{srate('draft_length', c.ACCEPTED_BY_DRAFT_LENGTH.name)}\n/ on (draft_length)\n"
          f"({srate('draft_length', c.DRAFTED_BY_DRAFT_LENGTH.name)} > 0)", "k={{draft_length}}")],
    )
    b.timeseries(
        "Drafts verified and left out",
        "Draft tokens per second the target verified, and those the engine proposed but left "
        "out of verification (an adaptive verify budget: SGLang DSpark's ragged windows; absent "
        "for engines that verify every draft). A growing left-out share is drafting work the "
        "budget throws away.",
        "short",
        [
            (srate("instance", c.DRAFT_TOKENS.name), "verified {{instance}}"),
            # 0 where the engine drafted and left nothing out (the series is absent there).
            (f"{srate('instance', c.DRAFT_TOKENS_UNVERIFIED.name)}\nor\n"
             f"0 * {srate('instance', c.DRAFT_TOKENS.name)}", "left out {{instance}}"),
        ],
        axis_label="tokens/s",
    )
    b.timeseries(
        "Tokens/s of cycle time by draft length",
        "Tokens emitted by the cycles of each k over the host seconds those cycles took: what the "
        "server produces while it runs at that k. k=0 is the plain-step rate the measured "
        "baseline (source=plain_steps) is taken from. " + per_k,
        "short",
        [(f"{srate('draft_length', c.EMITTED_BY_DRAFT_LENGTH.name)}\n/ on (draft_length)\n"
          f"({srate('draft_length', c.PHASE_TIME_BY_DRAFT_LENGTH.name)} > 0)",
          "k={{draft_length}}")],
        axis_label="tokens/s",
    )

    b.row("Throughput and speedup")
    b.timeseries(
        "Emitted tokens/s per server",
        "Tokens emitted to sequences per second (accepted draft tokens plus bonus tokens). This "
        "follows load: fewer requests, fewer tokens/s.",
        "short",
        [(srate("instance", c.EMITTED_TOKENS.name), "{{instance}}")],
        axis_label="tokens/s",
    )
    b.timeseries(
        "Tokens/s per sequence",
        "What one sequence experiences: emitted tokens per sequence per cycle over the mean host "
        "cycle time. Unlike tokens/s it does not fall when load falls.",
        "short",
        [(seq_speed, "{{instance}}")],
        axis_label="tokens/s",
    )
    b.timeseries(
        "Speedup: realized vs predicted",
        "Realized: tokens/s per sequence over the non-speculative baseline "
        f"({c.BASELINE_SEQUENCE_TOKENS.name}; the legend names its source: configured by hand, "
        "or measured by the engine at the batch size it serves: `specobs demo` runs plain "
        "decode steps between cycles, and a k schedule's k = 0 cycles give plain_steps); below "
        "1 speculation is a loss. Predicted: the cost model at the measured point, the tokens "
        "acceptance gives one sequence per cycle (1 + accepted draft tokens) times a plain "
        "step's cost (1 / the baseline) over the cycle's draft + verify + bookkeeping, on each "
        "clock. Calibration: realized over wall time (the time between cycles counted) over "
        "predicted on the host clock, 1 while the model holds; below 1 time goes between "
        "cycles or outside the phases, or tokens acceptance promised were not emitted "
        "(docs/metrics.md).",
        "none",
        [
            (realized, "realized {{instance}} ({{source}} baseline)"),
            (predicted, "predicted {{instance}} ({{clock}} clock)"),
            (calibration, "calibration {{instance}}"),
        ],
        axis_label="x baseline",
        threshold_line=1.0,
    )

    b.timeseries(
        "Time since the last cycle",
        "Seconds since each server completed a cycle (left axis) and the requests waiting "
        "(right axis, a count). Rising while requests wait is a stall.",
        "s",
        [
            (f"time() - max by (instance) ({s(c.LAST_CYCLE_TIMESTAMP.name)})", "{{instance}}"),
            (
                f"max by (instance) ({s(c.REQUESTS_WAITING.name)})",
                "waiting requests {{instance}}",
            ),
        ],
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "waiting requests.*"},
                "properties": [
                    {"id": "unit", "value": "short"},
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.axisLabel", "value": "requests"},
                ],
            }
        ],
    )

    b.row("What users see: the engine's own latency")
    engine_sel = _engine_matchers(config)
    for title, what, names in ENGINE_LATENCY:
        b.timeseries(
            f"{title} p50 / p99 (engine)",
            f"{what}, from the engine's own histograms ({', '.join(names)}) for the selected "
            "model, next to the cycle view above: a slower cycle shows here as what users "
            f"wait. Empty (\"{NO_ENGINE_METRICS}\") when Prometheus does not scrape the "
            "engine's /metrics.",
            "s",
            [
                (
                    f"histogram_quantile({q}, sum by (le) (rate({name}_bucket{{{engine_sel}}}"
                    f"[{RATE}]))) >= 0",
                    f"{name.split(':')[0]} p{int(q * 100)}",
                )
                for name in names
                for q in (0.5, 0.99)
            ],
            no_value=NO_ENGINE_METRICS,
        )

    b.row("Exporter health", collapsed=True)
    b.timeseries(
        "Dropped records and errors",
        "Cycle records specobs dropped or could not GPU-time, by reason, and hot-path misuse by "
        "kind, per second. Anything but a trickle means the metrics undercount, except "
        "`exception`: cycles the engine raised in, discarded.",
        "short",
        [
            (srate("reason", c.DROPPED_RECORDS.name), "dropped: {{reason}}"),
            (srate("kind", c.ERRORS.name), "error: {{kind}}"),
        ],
        axis_label="per second",
    )
    b.timeseries(
        "GPU-sampled share of cycles",
        "Fraction of cycles timed with CUDA events (the GPU clock); the rest are host-timed only.",
        "percentunit",
        [
            (
                f"{srate('instance', c.SAMPLED_CYCLES.name)}\n/\n("
                f"{srate('instance', c.CYCLES.name)} > 0)",
                "{{instance}}",
            )
        ],
    )
    b.timeseries(
        "specobs CPU time per cycle",
        "CPU seconds specobs itself spends per decoding cycle, by component (budget: 15 us).",
        "s",
        [
            (
                f"{srate('component', c.EXPORTER_CPU.name)}\n/ ignoring (component) group_left ()\n"
                f"({srate('', c.CYCLES.name)} > 0)",
                "{{component}}",
            )
        ],
        stack=True,
    )
    b.timeseries(
        "GPU timing overhead",
        "Self-measured cost of specobs on the worker (event records, phase boundaries, CUDA "
        "acceptance copies, the resolver) as a fraction of cycle time, estimated from host "
        "clocks; GPU timing adapts to the budget drawn beside it (none under a fixed sampling "
        "interval). It reads low for CUDA acceptance on sub-millisecond cycles and high on "
        "multi-millisecond ones (docs/metrics.md).",
        "percentunit",
        [(f"max by (instance) ({s(c.OVERHEAD_RATIO.name)})", "{{instance}}"),
         (f"max by (instance) ({s(c.SAMPLING_BUDGET.name)})", "budget {{instance}}")],
    )
    b.timeseries(
        "GPU sampling interval",
        "One cycle in this many is timed with CUDA events; specobs raises it to stay in budget.",
        "short",
        [(f"max by (instance) ({s(c.SAMPLING_INTERVAL.name)})", "{{instance}}")],
        axis_label="cycles",
    )
    return b.dashboard(
        "cycle breakdown",
        "cycle-breakdown",
        "Where each speculative decoding cycle's time goes (draft, verify, bookkeeping on the GPU "
        "and host clocks), acceptance, throughput and speedup, per server. Generated by "
        "`specobs generate`.",
        dashboard_variables(config, c.INFO.name, single_instance=True),
        engine_links=True,
    )


def render_fleet(config: MixinConfig) -> str:
    n = RuleNames(config)
    target = ", ".join(
        [
            *(f'{label}=~"${label}"' for label in config.group_labels),
            'job=~"$job"',
            'instance=~"$instance"',
        ]
    )
    sel = _matchers(config, engine=True)
    model = config.model_label
    engine = config.engine_label
    k = config.outlier_count

    def s(name: str, extra: str = "", selector: str = sel) -> str:
        return f"{name}{{{selector}{', ' + extra if extra else ''}}}"

    # Servers read through their engine's own series (no plugin) carry source="engine" on the
    # fleet series the engines feed; the plugin's carry no source. The table shows both.
    server_labels = config.instance_labels
    by = ", ".join(server_labels)
    by_source = ", ".join((*server_labels, "source"))
    engine_only = f'source="{ENGINE_SOURCE}"'
    engine_servers = f"group by ({by_source}) ({s(n.emitted, engine_only)})"

    def from_plugin(expr: str) -> str:
        return f'label_replace(\n{expr}\n, "source", "{PLUGIN_SOURCE}", "", "")'

    def either(agg: str, rule: str) -> str:
        """One figure per server, the plugin's or the engine's, with its source."""
        return (f"{agg} by ({by_source}) (\n"
                f'label_replace({s(rule)}, "source", "{PLUGIN_SOURCE}", "source", "")\n)')

    def plugin_only(expr: str) -> str:
        """The plugin's figure (``expr`` aggregated by server); a server without the plugin
        gets the value its cell reads as "needs the plugin"."""
        return f"{from_plugin(expr)}\nor\n{NEEDS_PLUGIN_VALUE} * {engine_servers}"

    # Up: the plugin's endpoint, or the engine's own where the engine's series feed the fleet.
    join = ", ".join((*config.group_labels, "job", "instance"))
    servers_up = (
        f"{from_plugin(f'max by ({by}) ({s(n.up, selector=target)})')}\nor\n"
        f"{engine_servers}\n* on ({join})\nmax by ({join}) (up{{{target}}})"
    )
    needs_plugin = (
        " Servers without specobs's plugin (read through their engine's own series) export no "
        f'such figure: "{NEEDS_PLUGIN}" when only they are selected.'
    )

    b = PanelBuilder(config)
    b.row("Fleet totals")
    b.stat(
        "Servers up",
        "Servers whose last scrape succeeded: specobs's endpoints, and the engines' own "
        "endpoints of servers without the plugin.",
        "none",
        f"sum(\n{servers_up}\n)",
    )
    b.stat(
        "Tokens/s",
        "Tokens emitted per second across the selected servers (the engine's own generation "
        "counter where a server has no plugin).",
        "short",
        f"sum({s(n.emitted)})",
    )
    b.stat(
        "Acceptance rate",
        "Accepted / drafted tokens across the selected servers.",
        "percentunit",
        f"sum({s(n.accepted)})\n/\n(sum({s(n.drafted)}) > 0)",
    )
    b.stat(
        "Cycles/s",
        "Speculative decoding cycles per second across the selected servers." + needs_plugin,
        "short",
        f"sum({s(n.cycles)})",
        no_value=NEEDS_PLUGIN,
    )
    b.stat(
        "Median tokens/s per sequence",
        "Median over servers of what one sequence experiences." + needs_plugin,
        "short",
        f"quantile(0.5, {s(n.sequence_speed)})",
        no_value=NEEDS_PLUGIN,
    )
    b.stat(
        "Firing alerts",
        "specobs alerts firing for the selected servers (a cohort's alerts, which servers "
        "without the plugin raise too, are on the alerts page)." + needs_plugin,
        "none",
        f"sum({s(n.alerts_firing, selector=target)})",
        no_value=NEEDS_PLUGIN,
    )

    b.row("Servers")
    index = (*server_labels, "source")  # one row per server: its model, engine and source
    drill = {
        "title": "Cycle breakdown of ${__data.fields.instance}",
        "url": f"/d/{config.uid_prefix}cycle-breakdown?${{__url_time_range}}"
        + "".join(f"&var-{label}=${{__data.fields.{label}}}" for label in config.group_labels)
        + "&var-job=${__data.fields.job}&var-instance=${__data.fields.instance}",
    }
    gpu_share = s(n.phase_share, f'phase="{config.verify_phase}", clock="gpu"')
    host_share = s(n.phase_share, f'phase="{config.verify_phase}", clock="host"')
    plugin_columns = ("Speedup", "Mean k", "Mean batch", "p99 cycle", "Verify share",
                      "Last cycle age", "Firing alerts")
    b.table(
        "Servers",
        "One row per server and its model: where its figures come from (source: specobs's "
        "plugin, or the engine's own series), up, tokens/s, realized speedup (red below 1), "
        "acceptance, the mean draft length k in effect (engines change it with the batch) and "
        "the mean batch, p99 cycle time (host clock), verify share of the cycle (GPU clock "
        "where sampled, else host), seconds since the last cycle, and firing specobs alerts "
        f'(red). A server without the plugin reads "{NEEDS_PLUGIN}" in the columns only the '
        "plugin measures. Click an instance to open its cycle breakdown.",
        [
            ("Up", "none", servers_up),
            ("Tokens/s", "short", either("sum", n.emitted)),
            ("Speedup", "none", plugin_only(f"max by ({by}) ({s(n.speedup_realized)})")),
            ("Acceptance", "percentunit", either("max", n.acceptance)),
            ("Mean k", "short", plugin_only(f"max by ({by}) ({s(n.draft_length_mean)})")),
            ("Mean batch", "short", plugin_only(f"max by ({by}) ({s(n.batch_size_mean)})")),
            ("p99 cycle", "s", plugin_only(f"max by ({by}) ({s(n.cycle_p99, HOST)})")),
            (
                "Verify share",
                "percentunit",
                plugin_only(f"max by ({by}) ({gpu_share})\nor\nmax by ({by}) ({host_share})"),
            ),
            ("Last cycle age", "s", plugin_only(f"max by ({by}) ({s(n.last_cycle_age)})")),
            ("Firing alerts", "none",
             plugin_only(f"sum by ({by}) ({s(n.alerts_firing, selector=target)})")),
        ],
        index=index,
        row_link=drill,
        colours={
            "Up": [("red", None), ("green", 1.0)],
            "Speedup": [("red", None), ("green", 1.0)],
            "Firing alerts": [("green", None), ("red", 1.0)],
            # Red from the stall alert's threshold on: no cycle for that long.
            "Last cycle age": [("green", None), ("red", duration_seconds(config.stall_after))],
        },
        plugin_only=frozenset(plugin_columns),
    )

    b.row("Outliers")
    b.timeseries(
        f"Slowest {k} servers: tokens/s per sequence",
        f"The {k} servers whose sequences decode slowest (bottom-k of the per-sequence speed)."
        + needs_plugin,
        "short",
        [(f"bottomk({k}, {s(n.sequence_speed)})", "{{instance}}")],
        axis_label="tokens/s",
        no_value=NEEDS_PLUGIN,
    )
    b.timeseries(
        f"Lowest {k} acceptance rates",
        f"The {k} servers whose draft model is accepted least, with the plugin or through "
        "their engine's own series.",
        "percentunit",
        [(f"bottomk({k}, {s(n.acceptance)})", f"{{{{instance}}}} ({{{{{engine}}}}})")],
    )
    b.timeseries(
        f"Highest {k} p99 cycle times",
        f"The {k} servers with the slowest p99 cycle (host clock)." + needs_plugin,
        "s",
        [(f"topk({k}, {s(n.cycle_p99, HOST)})", "{{instance}}")],
        no_value=NEEDS_PLUGIN,
    )

    b.row("By model and engine")
    for label in (model, engine):
        b.timeseries(
            f"Tokens/s by {label}",
            f"Tokens emitted per second, summed per {label} label.",
            "short",
            [(f"sum by ({label}) ({s(n.emitted)})", f"{{{{{label}}}}}")],
            axis_label="tokens/s",
        )
        b.timeseries(
            f"Acceptance by {label}",
            f"Accepted / drafted tokens per {label} label.",
            "percentunit",
            [
                (
                    f"sum by ({label}) ({s(n.accepted)})\n/\n"
                    f"(sum by ({label}) ({s(n.drafted)}) > 0)",
                    f"{{{{{label}}}}}",
                )
            ],
        )
        b.timeseries(
            f"Realized speedup by {label}",
            "Mean over servers of tokens/s per sequence over the non-speculative baseline, "
            f"per {label} and baseline source (configured, or measured by the engine)."
            + needs_plugin,
            "none",
            [(f"avg by ({label}, source) ({s(n.speedup_realized)})",
              f"{{{{{label}}}}} ({{{{source}}}} baseline)")],
            axis_label="x baseline",
            no_value=NEEDS_PLUGIN,
        )

    b.row("Distributions across instances")
    # Per cohort, not per server: the instance selection does not narrow these two.
    cohort = _matchers(config, instance=False, engine=True)
    b.heatmap(
        "Cycle time across the fleet (host clock)",
        "Distribution of cycle durations over all servers of the selected clusters, jobs and "
        "models (the instance selection does not apply), from the per-cohort bucket rates of the "
        "recording rules." + needs_plugin,
        "s",
        f"sum by (le) ({s(n.cohort_cycle_bucket, HOST, selector=cohort)})",
        w=12,
        no_value=NEEDS_PLUGIN,
    )
    b.heatmap(
        "Accept length across the fleet",
        "Distribution of accepted draft tokens per sequence per cycle over all servers of the "
        "selected clusters, jobs and models (the instance selection does not apply)."
        + needs_plugin,
        "short",
        f"sum by (le) ({s(n.cohort_accept_length_bucket, selector=cohort)})",
        w=12,
        no_value=NEEDS_PLUGIN,
    )

    return b.dashboard(
        "fleet",
        "fleet",
        "Health of every speculative decoding server, with specobs's plugin or through its "
        "engine's own series (vLLM, SGLang, TensorRT-LLM, llama.cpp, LMDeploy): throughput, "
        "acceptance, cycle time, outliers, per-model and per-engine breakdowns. Reads recording "
        "rules only. Generated by `specobs generate`.",
        dashboard_variables(config, n.emitted, single_instance=False, engine=True),
    )
