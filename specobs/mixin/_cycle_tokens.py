"""The cycle breakdown's rows about tokens: acceptance, the draft length in effect, throughput
and speedup. Each function adds one row's panels."""

from __future__ import annotations

import specobs.catalog as c
from specobs.mixin._dashboard_queries import (
    HOST,
    CycleQueries,
    right_axis,
    share_axis,
)
from specobs.mixin._panels import PanelBuilder
from specobs.mixin._promql import ratio

__all__ = ["acceptance", "draft_length", "request_acceptance", "throughput"]

PHASE = c.PHASE_DURATION.name
BATCH = c.BATCH_SIZE.name
INSTANCE = "{{instance}}"
BY_K = "k={{draft_length}}"
#: What the draft-length panels add about k chosen at run time.
PER_K = (
    "Engines change k at run time: vLLM's num_speculative_tokens_per_batch_size bands, "
    "SGLang's adaptive tiers, TRT-LLM's draft_len_schedule; k = 0 is a plain decode step "
    "(nothing drafted), recorded as a cycle. The cycle's k is what it drafted (vLLM "
    "verifies the previous step's drafts: acceptance by k uses each sequence's own)."
)


def acceptance(b: PanelBuilder, q: CycleQueries) -> None:
    accepted = q.accepted_per_sequence()
    b.row("Acceptance")
    b.timeseries(
        "Acceptance rate",
        "Accepted draft tokens / drafted tokens, per server. A draft model wired to the wrong "
        "hidden layers shows here as a collapse (on the demo's models, 81% to 18%).",
        "percentunit", [(q.per("instance", c.ACCEPTED_TOKENS.name, c.DRAFT_TOKENS.name),
                         INSTANCE)])
    b.timeseries(
        "Accepted draft tokens per sequence-cycle (excl. bonus) and acceptance length (incl. "
        "bonus)",
        "Excl. bonus: accepted draft tokens per sequence per cycle (0..k), the mean of "
        "specobs_accept_length. Incl. bonus: 1 + that, the tokens a sequence gains per cycle "
        "including the target's bonus token: the number vLLM's and SGLang's dashboards call "
        "mean acceptance length.",
        "short", [(accepted, "excl. bonus {{instance}}"),
                  ("1 + " + accepted,
                   "incl. bonus (vLLM's definition) {{instance}}")],
        axis_label="tokens")
    b.timeseries(
        "Acceptance by draft position",
        "Of the tokens drafted at each position (0 = first), the fraction accepted. Acceptance at "
        "position i is conditional on positions before it being accepted, so it falls with i.",
        "percentunit",
        [(q.per("position", c.ACCEPTED_BY_POSITION.name, c.DRAFTED_BY_POSITION.name),
          "position {{position}}")])
    b.timeseries(
        "Conditional acceptance by draft position",
        "Of the sequences whose draft token at position i - 1 was accepted, the fraction whose "
        "token at position i was accepted too (position 0: of all drafted at 0). A healthy "
        "draft holds a high, slowly falling line; a collapse at position 0 alone is a draft "
        "that disagrees with the target from its first token (docs/metrics.md). Exact for a "
        "fixed speculation length; with adaptive lengths the later positions read high.",
        "percentunit", [(q.conditional_acceptance(), "position {{position}}")])
    rejected = (f"{q.srate('instance', c.DRAFT_TOKENS.name)}\n- on (instance)\n"
                f"{q.srate('instance', c.ACCEPTED_TOKENS.name)}")
    b.timeseries(
        "Rejected draft tokens/s and the drafts' share of emitted tokens",
        "Rejected: drafted minus accepted tokens per second, compute the target verified for "
        "nothing (left axis). Share: the fraction of emitted tokens that came from accepted "
        "drafts rather than the target's bonus token (right axis).",
        "short",
        [(rejected, "rejected/s {{instance}}"),
         (q.per("instance", c.ACCEPTED_TOKENS.name, c.EMITTED_TOKENS.name),
          "drafts' share {{instance}}")],
        axis_label="tokens/s", overrides=[share_axis("drafts' share.*")])
    b.heatmap(
        "Accept-length distribution",
        "How many draft tokens each sequence had accepted per cycle, over time: a mass at 0 means "
        "the draft rarely helps, a mass at k means a longer draft could pay.",
        "short", q.srate("le", c.ACCEPT_LENGTH.name + "_bucket"))
    b.timeseries(
        "Batch size",
        "Sequences decoded together per cycle: mean and p90 per server. Larger batches make each "
        "cycle slower and each sequence slower, while the server emits more tokens.",
        "short", [(q.per("instance", BATCH + "_sum", c.CYCLES.name),
                   "mean {{instance}}"),
                  (q.quantile(0.9, "instance, le", BATCH), "p90 {{instance}}")],
        axis_label="sequences")


def request_acceptance(b: PanelBuilder, q: CycleQueries) -> None:
    """Finished requests' own acceptance: the tail the server's aggregate hides."""
    config, req = q.config, c.REQUEST_ACCEPTANCE.name
    low = f'le="{float(config.request_acceptance_low)!r}"'
    low_share = ratio(q.srate("instance", req + "_bucket", low),
                           q.srate("instance", req + "_count"))
    b.timeseries(
        "Per-request acceptance",
        "Finished requests' acceptance rates (each request's accepted / drafted tokens over its "
        "life): the 10th percentile and the median, and the share of requests at or below "
        f"{config.request_acceptance_low:.0%} (right axis). One slot or one kind of prompt "
        "whose acceptance collapsed shows here while the server's aggregate looks fine; the "
        "dots are the worst requests' exemplars (trace ids).",
        "percentunit",
        [(q.quantile(0.1, "le", req), "p10 {{instance}}"),
         (q.quantile(0.5, "le", req), "p50 {{instance}}"),
         (low_share, "low share {{instance}}")],
        exemplars=True, overrides=[right_axis("low share .*")])


def draft_length(b: PanelBuilder, q: CycleQueries) -> None:
    by_k, time_by_k = c.CYCLES_BY_DRAFT_LENGTH.name, c.PHASE_TIME_BY_DRAFT_LENGTH.name

    def at_k(num: str, den: str) -> str:
        return (f"{q.srate('draft_length', num)}\n/ on (draft_length)\n"
                f"({q.srate('draft_length', den)} > 0)")

    b.row("Draft length in effect (k chosen at run time)")
    b.timeseries(
        "Draft length in effect and batch size",
        "Mean draft length k per cycle (left axis), mean sequences per cycle and the mean batch "
        "of the cycles run at each k (right axis): a schedule by batch size shows k stepping as "
        "the batch crosses its bands, each k at its own band of batches; batch x (k + 1) is the "
        "tokens one verify checks. " + PER_K,
        "short",
        [(q.mean("instance", c.DRAFT_LENGTH.name), "k {{instance}}"),
         (q.mean("instance", BATCH), "batch {{instance}}"),
         (at_k(c.SEQUENCES_BY_DRAFT_LENGTH.name, by_k),
          "batch at k={{draft_length}}")],
        overrides=[right_axis("batch .*", label="sequences")], axis_label="k")
    b.timeseries(
        "Cycles by draft length",
        "Share of cycles run at each k over time, stacked; k=0 is the share of plain decode "
        "steps (speculation off at that batch). " + PER_K,
        "percentunit", [(q.share("draft_length", by_k, by_k), BY_K)], stack=True)
    b.timeseries(
        "Mean phase time by draft length (host clock)",
        "Mean seconds per cycle in each phase, for the cycles of each k (host clock, every "
        "cycle): draft time grows with k, verify with the tokens verified. " + PER_K,
        "s", [(f"{q.srate('draft_length, phase', time_by_k)}\n"
               f"/ on (draft_length) group_left ()\n({q.srate('draft_length', by_k)} > 0)",
               "k={{draft_length}} {{phase}}")])
    b.timeseries(
        "Acceptance by draft length",
        "Accepted / drafted tokens of the sequences that verified k drafts, per k. A rate that "
        "falls as k grows is the late positions' low acceptance (per position: the Acceptance "
        "row). " + PER_K,
        "percentunit",
        [(at_k(c.ACCEPTED_BY_DRAFT_LENGTH.name, c.DRAFTED_BY_DRAFT_LENGTH.name), BY_K)])
    drafted = q.srate("instance", c.DRAFT_TOKENS.name)
    b.timeseries(
        "Drafts verified and left out",
        "Draft tokens per second the target verified, and those the engine proposed but left "
        "out of verification (an adaptive verify budget: SGLang DSpark's ragged windows; absent "
        "for engines that verify every draft). A growing left-out share is drafting work the "
        "budget throws away.",
        "short",
        [(drafted, "verified {{instance}}"),
         # 0 where the engine drafted and left nothing out (the series is absent there).
         (f"{q.srate('instance', c.DRAFT_TOKENS_UNVERIFIED.name)}\nor\n0 * {drafted}",
          "left out {{instance}}")],
        axis_label="tokens/s")
    b.timeseries(
        "Tokens/s of cycle time by draft length",
        "Tokens emitted by the cycles of each k over the host seconds those cycles took: what the "
        "server produces while it runs at that k. k=0 is the plain-step rate the measured "
        "baseline (source=plain_steps) is taken from. " + PER_K,
        "short", [(at_k(c.EMITTED_BY_DRAFT_LENGTH.name, time_by_k), BY_K)],
        axis_label="tokens/s")


def _predicted(q: CycleQueries) -> str:
    """The cost model at the measured point (the rule instance:specobs_speedup:predicted_*):
    tokens acceptance gives a sequence per cycle, times a plain step (1 / the baseline), over
    the cycle's phases on each clock."""
    return (
        f"(\n  {_gain(q, '  ')}\n)\n"
        f"/ on (instance) group_right ()\n(\n"
        f"  {q.srate('instance, clock', PHASE + '_sum')}\n  /\n"
        f"  ({q.srate('instance, clock', PHASE + '_count')} > 0)\n) > 0"
    )


def _gain(q: CycleQueries, indent: str) -> str:
    """Tokens per sequence-cycle over the baseline's tokens per second."""
    baseline = f"({q.max(c.BASELINE_SEQUENCE_TOKENS.name)} > 0)"
    return (f"(1 + {q.srate('instance', c.ACCEPTED_TOKENS.name)}\n{indent}/ ("
            f"{q.srate('instance', BATCH + '_sum')} > 0))\n"
            f"{indent}/ on (instance)\n{indent}{baseline}")


def _calibration(q: CycleQueries) -> str:
    """Realized over wall time (gaps between cycles counted) over predicted on the host
    clock."""
    gap = q.srate("instance", c.CYCLE_GAP.name + "_sum")
    busy_share = (
        f"(\n  1 - {gap}\n  / ("
        f"{gap} + {q.srate('instance', c.CYCLE_DURATION.name + '_sum', HOST)} > 0)\n)"
        f"\nor on (instance)\n(0 * {q.srate('instance', c.CYCLES.name)} + 1)"
    )
    return (
        f"{q.realized()}\n* on (instance) group_left ()\n{busy_share}\n"
        f"/ on (instance) group_left ()\n(\n"
        f"  sum by (instance) (\n    {_gain(q, '    ')}\n  )\n"
        f"  / on (instance)\n"
        f"  (sum by (instance) ({q.rate(PHASE + '_sum', HOST)})\n"
        f"   / (max by (instance) ({q.rate(PHASE + '_count', HOST)}) > 0) > 0)\n)"
    )


def throughput(b: PanelBuilder, q: CycleQueries) -> None:
    b.row("Throughput and speedup")
    b.timeseries(
        "Emitted tokens/s per server",
        "Tokens emitted to sequences per second (accepted draft tokens plus bonus tokens). This "
        "follows load: fewer requests, fewer tokens/s.",
        "short", [(q.srate("instance", c.EMITTED_TOKENS.name), INSTANCE)], axis_label="tokens/s")
    b.timeseries(
        "Tokens/s per sequence",
        "What one sequence experiences: emitted tokens per sequence per cycle over the mean host "
        "cycle time. Unlike tokens/s it does not fall when load falls.",
        "short", [(q.sequence_speed(), INSTANCE)], axis_label="tokens/s")
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
        [(q.realized(), "realized {{instance}} ({{source}} baseline)"),
         (_predicted(q), "predicted {{instance}} ({{clock}} clock)"),
         (_calibration(q), "calibration {{instance}}")],
        axis_label="x baseline", threshold_line=1.0)
    b.timeseries(
        "Time since the last cycle",
        "Seconds since each server completed a cycle (left axis) and the requests waiting "
        "(right axis, a count). Rising while requests wait is a stall.",
        "s",
        [(f"time() - {q.max(c.LAST_CYCLE_TIMESTAMP.name)}", INSTANCE),
         (q.max(c.REQUESTS_WAITING.name), "waiting requests {{instance}}")],
        overrides=[right_axis("waiting requests.*", unit="short", label="requests")])
