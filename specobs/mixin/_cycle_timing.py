"""The cycle breakdown's rows about time: the headline numbers, where a cycle's time goes, the
engine's own latency, and the exporter's health. Each function adds one row's panels."""

from __future__ import annotations

import specobs.catalog as c
from specobs.mixin._dashboard_queries import (
    ENGINE_LATENCY,
    GPU,
    HOST,
    NO_ENGINE_METRICS,
    CycleQueries,
    engine_matchers,
    percentile,
    share_axis,
)
from specobs.mixin._panels import NO_GPU_CLOCK, NO_TRAFFIC, RATE, PanelBuilder
from specobs.mixin._promql import selector

__all__ = ["at_a_glance", "between_cycles", "engine_latency", "exporter_health", "phases"]

PHASE = c.PHASE_DURATION.name
CYCLE = c.CYCLE_DURATION.name


def per_engine(label: str) -> str:
    """What the phase panels add: the token counts mean the same everywhere, the phase cut
    follows each engine's code."""
    return (
        f" What each phase covers depends on the engine (label {label}, and "
        "specobs_info{integration}): in SGLang bookkeeping is mostly the draft model's catch-up "
        "forward, in vLLM host-side output processing, in transformers token selection and cache "
        "crop; compare phases between servers of one engine (docs/integrations.md)."
    )


def at_a_glance(b: PanelBuilder, q: CycleQueries) -> None:
    b.row("At a glance")
    b.stat("Tokens/s",
           "Tokens emitted per second by the selected servers (accepted draft tokens plus bonus "
           "tokens), summed.",
           "short", q.srate("", c.EMITTED_TOKENS.name), w=5)
    b.stat("Speedup",
           "Realized speedup: tokens/s per sequence over the non-speculative baseline. Red below "
           "1: speculation is slower than not speculating.",
           "none", f"min(\n{q.realized()}\n)", w=5, red_below=1.0, decimals=2)
    b.stat("Acceptance rate", "Accepted draft tokens / drafted tokens over the selected servers.",
           "percentunit", q.per("", c.ACCEPTED_TOKENS.name, c.DRAFT_TOKENS.name), w=5)
    b.stat("Mean acceptance length",
           "Tokens a sequence gains per cycle, the target's bonus token included: the number "
           "vLLM's and SGLang's dashboards call mean acceptance length (1 + accepted draft "
           "tokens).",
           "short", "1 + " + q.mean("", c.ACCEPT_LENGTH.name), w=5, decimals=2)
    b.stat("Cycle p99",
           "99th percentile of the whole cycle's duration on the host clock (every cycle).",
           "s", q.quantile(0.99, "le", CYCLE, HOST), w=4)


def phases(b: PanelBuilder, q: CycleQueries) -> None:
    engine = per_engine(q.config.engine_label)
    b.row("Where a cycle's time goes")
    for name, what, matcher, no_value in (
        ("host", "measured with perf_counter on the host, on every cycle", HOST, NO_TRAFFIC),
        ("GPU", "measured on the GPU's own clock with CUDA events, on sampled cycles only", GPU,
         NO_GPU_CLOCK),
    ):
        b.timeseries(
            f"Mean time per cycle by phase ({name} clock)",
            f"Mean seconds each phase takes per cycle, stacked, {what}. The stack's height is the "
            "mean cycle time. Averaged over the selected instances." + engine,
            "s", [(q.mean("phase", PHASE, matcher), "{{phase}}")],
            stack=True, no_value=no_value)
    b.timeseries(
        "Mean cycle time: GPU vs host clock",
        "Mean cycle duration on each clock. Host time above GPU time is launch and Python overhead "
        "the GPU waits through; GPU above host means the host runs ahead (CUDA graphs, async).",
        "s", [(q.mean("clock", CYCLE), "{{clock}}")])
    b.timeseries(
        "Phase share of the cycle (GPU clock)",
        "Fraction of GPU cycle time spent in each phase. A growing draft share means the draft "
        "model costs more of each cycle than it used to." + engine,
        "percentunit", [(q.share("phase", PHASE + "_sum", PHASE + "_sum", GPU), "{{phase}}")],
        stack=True, no_value=NO_GPU_CLOCK)
    b.timeseries(
        "Phase latency p50 / p90 / p99",
        "Quantiles of each phase's duration per clock, from the histogram buckets. Exemplars "
        "(dots) are individual sampled cycles; with a trace datasource they open the cycle's "
        "trace." + engine,
        "s", [(q.quantile(p, "phase, clock, le", PHASE),
               "{{phase}} {{clock}} " + percentile(p)) for p in (0.5, 0.9, 0.99)],
        exemplars=True)
    b.heatmap(
        "Cycle time heatmap (host clock)",
        "Distribution of whole-cycle durations over time (host clock, every cycle). Exemplars "
        "link to traces when a trace datasource is configured.",
        "s", q.srate("le", CYCLE + "_bucket", HOST), exemplars=True)
    b.timeseries(
        "Cycle time p50 / p99 by clock",
        "Quantiles of whole-cycle duration on each clock, with exemplars.",
        "s", [(q.quantile(p, "clock, le", CYCLE), "{{clock}} " + percentile(p))
              for p in (0.5, 0.99)],
        exemplars=True)


def between_cycles(b: PanelBuilder, q: CycleQueries) -> None:
    """The engine thread's CPU time, and the time the engine spends outside cycles."""
    b.timeseries(
        "Engine thread: on a CPU and waiting for one, per cycle",
        "Seconds per cycle the thread that records cycles ran on a CPU and was runnable but "
        "waiting for one (Linux schedstat). Waiting that grows with the cycle time is other work "
        "on the host taking the CPUs, not the speculation; empty where the kernel does not say.",
        "s", [(q.share("state", c.WORKER_THREAD_TIME.name, c.CYCLES.name), "{{state}}")],
        stack=True)
    gap, idle = c.CYCLE_GAP.name, c.IDLE_GAPS.name

    def of_sum(part: str, other: str) -> str:
        return f"{part}\n/\n(\n  {part}\n  +\n  {other}\n  > 0\n)"

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
            *((q.quantile(p, "instance, le", gap), percentile(p) + " {{instance}}")
              for p in (0.5, 0.99)),
            (of_sum(q.srate("instance", gap + "_sum"), q.srate("instance", CYCLE + "_sum", HOST)),
             "share {{instance}}"),
            (of_sum(q.srate("instance", idle), q.srate("instance", gap + "_count")),
             "idle {{instance}}"),
        ],
        overrides=[share_axis("(share|idle) .*")],
    )


def engine_latency(b: PanelBuilder, q: CycleQueries) -> None:
    b.row("What users see: the engine's own latency")
    engine_sel = engine_matchers(q.config)
    for title, what, names in ENGINE_LATENCY:
        b.timeseries(
            f"{title} p50 / p99 (engine)",
            f"{what}, from the engine's own histograms ({', '.join(names)}) for the selected "
            "model, next to the cycle view above: a slower cycle shows here as what users "
            f"wait. Empty (\"{NO_ENGINE_METRICS}\") when Prometheus does not scrape the "
            "engine's /metrics.",
            "s",
            [
                (f"histogram_quantile({p}, sum by (le) "
                 f"(rate({selector(name + '_bucket', engine_sel)}[{RATE}]))) >= 0",
                 f"{name.split(':')[0]} {percentile(p)}")
                for name in names
                for p in (0.5, 0.99)
            ],
            no_value=NO_ENGINE_METRICS,
        )


def exporter_health(b: PanelBuilder, q: CycleQueries) -> None:
    b.row("Exporter health", collapsed=True)
    b.timeseries(
        "Dropped records and errors",
        "Cycle records specobs dropped or could not GPU-time, by reason, and hot-path misuse by "
        "kind, per second. Anything but a trickle means the metrics undercount, except "
        "`exception`: cycles the engine raised in, discarded.",
        "short", [(q.srate("reason", c.DROPPED_RECORDS.name), "dropped: {{reason}}"),
                  (q.srate("kind", c.ERRORS.name), "error: {{kind}}")],
        axis_label="per second")
    b.timeseries(
        "GPU-sampled share of cycles",
        "Fraction of cycles timed with CUDA events (the GPU clock); the rest are host-timed only.",
        "percentunit",
        [(q.per("instance", c.SAMPLED_CYCLES.name, c.CYCLES.name), "{{instance}}")])
    b.timeseries(
        "specobs CPU time per cycle",
        "CPU seconds specobs itself spends per decoding cycle, by component (budget: 15 us).",
        "s", [(q.share("component", c.EXPORTER_CPU.name, c.CYCLES.name), "{{component}}")],
        stack=True)
    b.timeseries(
        "GPU timing overhead",
        "Self-measured cost of specobs on the worker (event records, phase boundaries, CUDA "
        "acceptance copies, the resolver) as a fraction of cycle time, estimated from host "
        "clocks; GPU timing adapts to the budget drawn beside it (none under a fixed sampling "
        "interval). It reads low for CUDA acceptance on sub-millisecond cycles and high on "
        "multi-millisecond ones (docs/metrics.md).",
        "percentunit", [(q.max(c.OVERHEAD_RATIO.name), "{{instance}}"),
                        (q.max(c.SAMPLING_BUDGET.name), "budget {{instance}}")])
    b.timeseries(
        "GPU sampling interval",
        "One cycle in this many is timed with CUDA events; specobs raises it to stay in budget.",
        "short", [(q.max(c.SAMPLING_INTERVAL.name), "{{instance}}")], axis_label="cycles")
