"""The words of the findings: every sentence and piece of advice, rendered from a finding's data.

A classifier decides a code, a severity and the evidence; :func:`found` turns them into a
:class:`~specobs.tools._diagnosis._findings.Finding` by filling the code's template in
:data:`TEXTS`. A template reads the evidence, the thresholds that decide the code
(:func:`~specobs.tools._diagnosis._thresholds.used_by`), the facts the classifier passes for the
words alone, and the fragments in :data:`FRAGMENTS`, each made from those values. Besides
Python's format specs a field may use ``pct`` (a percentage), ``+pct`` (a change in percent),
``ms`` and ``ms3`` (a duration), ``x`` (a factor), ``n`` (a count, 0 for none) and a ``z``
prefix (``z.1f``: None reads as 0).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

from specobs.tools._diagnosis._findings import Evidence, Finding
from specobs.tools._diagnosis._thresholds import used_by

__all__ = ["FRAGMENTS", "TEXTS", "found", "ms", "n", "pct", "x"]


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


def x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def n(value: float | None) -> str:
    return "0" if value is None else f"{value:.0f}"


_SPECS: dict[str, Callable[[Any], str]] = {
    "pct": pct, "ms": ms, "x": x, "n": n,
    "+pct": lambda v: f"{v * 100:+.0f}%",  # a change: +12%, -3%
    "ms3": lambda v: f"{v * 1e3:.3f} ms",  # a draft's cost a position, to the microsecond
}

Values = Mapping[str, Any]


class _Formatter(string.Formatter):
    """``str.format`` with the specs above, and fragments looked up by name (before the values,
    so that evidence added under a fragment's name cannot change a sentence)."""

    def get_value(self, key: int | str, args: Any, kwargs: Mapping[str, Any]) -> Any:
        if isinstance(key, str) and key in FRAGMENTS:
            return FRAGMENTS[key](kwargs)
        return super().get_value(key, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        if format_spec in _SPECS:
            return _SPECS[format_spec](value)
        if format_spec.startswith("z"):
            return format(value or 0, format_spec[1:])
        return super().format_field(value, format_spec)


_FORMAT = _Formatter()


def _format(template: str, values: Values) -> str:
    return _FORMAT.vformat(template, (), values)


# -- fragments: parts of a sentence made from the values ------------------------------------------


def _profile(v: Values) -> str:
    """The conditional acceptance by position, from the ``conditional_<i>`` evidence."""
    return ", ".join(f"{k.removeprefix('conditional_')}:{pct(a)}" for k, a in v.items()
                     if k.startswith("conditional_"))


def _shares(v: Values) -> str:
    return ", ".join(f"{k.removesuffix('_share')} {pct(s)}" for k, s in v.items()
                     if k.endswith("_share"))


def _caveat(v: Values) -> str:
    # Under clock=auto with no CUDA initialised the process is CPU-only: the host clock is the
    # device's own, and the caveat would mislead.
    if not v["host_books_gpu"]:
        return ""
    return (" (host clock: with CUDA graphs or asynchronous launches the host books the GPU's "
            "time into the phase that waits for it)")


def _ago(v: Values) -> str:
    age = v["last_cycle_age_seconds"]
    return "; no cycle yet" if age is None else f"; the last cycle ended {age:.0f} s ago"


def _model(v: Values) -> str:
    """What the cost model predicts, and where it is off from the realized speedup."""
    if v["predicted"] is None:
        return "no plain step was measured to predict it from"
    text = f"the cost model predicts {x(v['predicted'])}"
    if v.get("where") is not None:
        text += f", off by {v['calibration_off'] * 100:+.0f}%: {v['where']}"
    return text


def _head(v: Values) -> str:
    return _format("{realized:x} the baseline's tokens/s per sequence "
                   "({sequence_tokens_per_second:z.1f} against {baseline_tokens_per_second:.1f} "
                   "at mean batch {mean_batch_size:z.1f}; {model})", v)


def _slower(v: Values) -> str:
    """A draft or verify that got slower, in parentheses; empty where none did."""
    if v.get("slower_phase") is None:
        return ""
    return f" ({v['slower_phase']} {v['slower_factor']:.2f}x slower than over the lifetime)"


def _neither(v: Values) -> str:
    other, cycle = v["other_seconds"], v["host_cycle_seconds"]
    if other is None or cycle is None or not other > 0:
        return ""
    return f", and {ms(other)} of each {ms(cycle)} cycle is neither"


def _grown(v: Values) -> str:
    factor = v.get("gap_against_past")
    return "" if factor is None or factor < v["GAP_GREW"] else f", {factor:.1f}x what it was before"


def _wall(v: Values) -> str:
    if v.get("realized_over_wall_time") is None:
        return ""
    return _format("; against the baseline the {realized:x} speedup of the cycles is "
                   "{realized_over_wall_time:x} over wall time (a plain decoder paying the same "
                   "gap a step would lose more)", v)


def _each(v: Values) -> str:
    """Each phase's past and recent means, from the ``<phase>_past_seconds`` evidence."""
    return ", ".join(f"{k.removesuffix('_past_seconds')} {ms(a)} → "
                     f"{ms(v[k.replace('_past_', '_recent_')])}"
                     for k, a in v.items() if k.endswith("_past_seconds"))


def _seen(v: Values) -> str:
    """The measured speedup at each batch size, from the ``speedup_batch<b>`` evidence."""
    return ", ".join(f"{x(s)} at {k.removeprefix('speedup_batch')}" for k, s in v.items()
                     if k.startswith("speedup_batch"))


def _span(v: Values) -> str:
    if v["batches_observed"] == 1:
        return f"batch {v['min_batch']:.1f}"
    return f"batches {v['min_batch']:.1f}..{v['max_batch']:.1f}"


def _pays(v: Values) -> str:
    return "every batch size observed" if v["every_batch_pays"] \
        else "the largest batch size observed"


def _k_zero_above(v: Values) -> str:
    """How each engine turns speculation off above a batch size: a k = 0 band of its
    batch-size schedule (vLLM 0.33+ ``num_speculative_tokens_per_batch_size``, SGLang's
    ``--speculative-adaptive-config`` tiers, TensorRT-LLM's ``draft_len_schedule``)."""
    b = max(round(v["threshold_batch"]), 1)
    return (f"vLLM: a k = 0 band in num_speculative_tokens_per_batch_size, "
            f"[[1, {b}, k], [{b + 1}, max_num_seqs, 0]]; SGLang: candidate_steps [0] from batch "
            f"{b + 1} in --speculative-adaptive-config; TensorRT-LLM (after 1.2): "
            f"draft_len_schedule {{{b}: max_draft_len}}, batches above its largest key draft "
            "nothing")


def _also(v: Values) -> str:
    return f"; also {v['also']}" if v["also"] else ""


#: Parts of sentences, each made from a finding's values, by the name templates use.
FRAGMENTS: dict[str, Callable[[Values], str]] = {
    "profile": _profile, "shares": _shares, "caveat": _caveat, "ago": _ago, "model": _model,
    "head": _head, "slower": _slower, "neither": _neither, "grown": _grown, "wall": _wall,
    "each": _each, "seen": _seen, "span": _span, "pays": _pays, "k_zero_above": _k_zero_above,
    "also_text": _also,
}


# -- the templates --------------------------------------------------------------------------------

#: Each template's key: a code (``SPEC-`` left off, ``PAST-`` for the codes of a comparison with
#: the lifetime or a saved run), and after a slash the variant where a code has several sentences.
#: The value: the sentence and the advice.
TEXTS: dict[str, tuple[str, str]] = {
    # the acceptance profile
    "ACCEPT-UNKNOWN": (
        "too few drafted tokens to judge acceptance ({drafted_first_position:n} at the first "
        "position, {MIN_DRAFTED_TOKENS:.0f} needed)",
        "wait for more traffic or lengthen the window (--wait)"),
    "ACCEPT-LOW": (
        "only {first:pct} of drafted tokens are accepted (k=1, so there is no per-position "
        "profile to tell a broken draft from a weak one)",
        "compare with the draft's offline acceptance; check the draft checkpoint, its "
        "hidden-layer wiring and the tokenizer"),
    "ACCEPT-COLLAPSE": (
        "the draft disagrees with the target from its first token: {first:pct} of first "
        "drafted tokens are accepted, but {recovered:pct} of those that pass it are accepted at "
        "the next positions (conditional acceptance {profile})",
        "the draft is wired or loaded wrong rather than weak: check which target hidden layers "
        "an EAGLE head reads, that the draft checkpoint matches this target (and its revision), "
        "the tokenizer and vocabulary of both, and that draft and target sample with the same "
        "temperature and top-p"),
    "ACCEPT-FLAT-LOW": (
        "acceptance is low at every position ({profile}): the draft is weak for this traffic "
        "rather than broken",
        "a draft under-trained or trained on other data, or sampling hotter than it was "
        "trained for; a shorter k wastes less; retrain or distil on this traffic"),
    "ACCEPT-CHAIN-SHORT": (
        "the draft holds the target for {position} positions, then loses it: conditional "
        "acceptance {chain_end:pct} at position {position} ({profile})",
        "tokens drafted at position {position} and beyond are mostly wasted draft and verify "
        "work: try k={position}"),
    "ACCEPT-UNKNOWN/engine": (
        "acceptance {acceptance_rate:pct}, but {engine} exports no acceptance by draft position: "
        "a draft broken from its first token cannot be told from a weak one",
        "specobs's plugin counts drafted and accepted tokens at every position"),
    "ACCEPT-HEALTHY": (
        "acceptance decays as a healthy draft's does: conditional acceptance {profile}", ""),
    # where the cycle goes
    "CYCLE-UNKNOWN/no-clock": (
        "fewer than {MIN_CLOCK_CYCLES:.0f} cycles on either clock: no phase shares to read", ""),
    "CYCLE-UNKNOWN/no-times": ("no phase times in the interval", ""),
    "CYCLE-BOOKKEEPING-BOUND": (
        "bookkeeping takes {bookkeeping_share:pct} of the cycle on the {clock} clock "
        "({shares}){caveat}",
        "bookkeeping (acceptance, KV rollback, handing tokens over) should be a few percent: "
        "look for host syncs (.item(), .cpu(), .tolist()), sampling on the CPU and "
        "per-sequence Python loops in it"),
    "CYCLE-VERIFY-BOUND": (
        "the cycle is verify-bound: verify takes {verify_share:pct} of it on the {clock} clock "
        "({shares}){caveat}",
        "expected for a small draft; verify grows with batch size and k, so speculation pays "
        "less at large batches: see the speedup finding"),
    "CYCLE-DRAFT-BOUND": (
        "the cycle is draft-bound: the draft takes {draft_share:pct} of it on the {clock} clock "
        "({shares}){caveat}",
        "a draft costing more than verify must be accepted very often to pay: a cheaper draft "
        "(fewer layers, CUDA graphs) or a shorter k"),
    "CYCLE-BALANCED": ("no phase dominates the cycle on the {clock} clock ({shares}){caveat}", ""),
    # the host
    "HOST-UNSEEN": (
        "no GPU clock in the interval, so whether the GPU waits for the host cannot be measured "
        "(a CPU-only process, clock=host, or CUDA not initialised)", ""),
    "HOST-BOUND": (
        "the cycle is host-bound: {host_cycle_seconds:ms} on the host against "
        "{gpu_cycle_seconds:ms} of GPU phases, so the GPU waits {waits:ms} ({gap_fraction:pct}) "
        "of every cycle for the host",
        "look for synchronize calls between phases (profiling code, .item(), .cpu()), Python "
        "overhead and CPU-side sampling; CUDA graphs remove launch cost"),
    "HOST-LOCKSTEP": (
        "the host and the GPU meet at every phase boundary (each phase lasts as long on both "
        "clocks, within {phase_disagreement_fraction:pct} of the cycle): nothing overlaps, the "
        "host waits for the GPU between phases or launches eagerly",
        "remove synchronize calls between phases (synchronize-based profiling, .item(), .cpu() "
        "before the cycle ends); capture draft and verify as CUDA graphs"),
    "HOST-OVERLAPPED": (
        "the host runs ahead of the GPU: {host_cycle_seconds:ms} host cycle, "
        "{gpu_cycle_seconds:ms} of GPU phases", ""),
    # a stall
    "STALL": (
        "decoding is stalled: {requests_running:n} requests running and {requests_waiting:n} "
        "waiting, and no cycle in {seconds:.1f} s{ago}",
        "the engine's step loop is hung or blocked: take a stack dump of the worker (py-spy "
        "dump), check for a deadlock, an NCCL hang or a GPU fault (dmesg, nvidia-smi)"),
    "NO-CYCLES": (
        "no cycle in {seconds:.1f} s{ago}; the endpoint exports no request gauges, so idle "
        "cannot be told from stalled",
        "feed Observer.set_requests(running, waiting) (the engine integrations do) so that a "
        "stall is a failure here and in the alert"),
    "IDLE": ("idle: no requests and no cycle in {seconds:.1f} s{ago}", ""),
    # the speedup
    "SPEEDUP-UNKNOWN/no-baseline": (
        "no non-speculative baseline to compare with{predicts}",
        "configure(baseline_tokens_per_second=...) or SPECOBS_BASELINE_TOKENS_PER_SECOND, "
        "measured at the batch size the server runs, or let the engine run plain steps (a k = 0 "
        "band) so that specobs measures one"),
    "SPEEDUP-UNKNOWN/short": (
        "realized speedup {realized:x} over only {cycles:.0f} cycles: too short a window to "
        "judge ({MIN_SPEEDUP_CYCLES:.0f} needed)",
        "lengthen the window (--wait)"),
    "SPEEDUP-OK": ("speculation is faster: {head}", ""),
    "SPEEDUP-WARMING": (
        "speculation is slower, but acceptance is still rising ({past_acceptance:pct} over the "
        "lifetime, {recent_acceptance:pct} now): {head}",
        "the draft is warming up (training, a cache filling): run again later"),
    "SPEEDUP-LOSS/acceptance": (
        "speculation is slower than the baseline: {head}; acceptance is too low for the draft's "
        "cost: a cycle yields {tokens_per_sequence_cycle:.2f} tokens per sequence, and a draft "
        "costing {draft_of_verify:.2f} of verify needs more than {tokens_needed:.2f}",
        "see the acceptance finding: fix the draft, or turn speculation off"),
    "SPEEDUP-LOSS/verify": (
        "speculation is slower than the baseline: {head}; verify-bound at batch "
        "{mean_batch_size:z.1f}: one verify costs {verify_seconds:ms}, more than the "
        "{tokens_per_sequence_cycle:.2f} plain decode steps ({replaced_seconds:ms}) its tokens "
        "replace{slower}",
        "speculation stops paying at this batch size: give batches this large k = 0 in the "
        "engine's batch-size schedule of k (SPEC-ADVICE-SCHEDULE; specobs advise prints it), or "
        "lower k"),
    "SPEEDUP-LOSS/both": (
        "speculation is slower than the baseline: {head}; draft and verify together cost "
        "{cycle_phases_seconds:ms} a cycle ({draft_seconds:ms} + {verify_seconds:ms}), more "
        "than the {tokens_per_sequence_cycle:.2f} plain decode steps ({replaced_seconds:ms}) "
        "their tokens replace: one verify costs {verify_steps:.2f} plain steps{slower}",
        "lower k (a cheaper draft, a shorter verify), or give k = 0 above this batch size"),
    "SPEEDUP-LOSS/verify-slower": (
        "", "see the phase finding: a phase that got slower, not the batch size"),
    "SPEEDUP-LOSS/both-slower": ("", "see the phase finding: a phase that got slower"),
    "SPEEDUP-LOSS/outside": (
        "speculation is slower than the baseline: {head}; the time outside draft and verify "
        "(bookkeeping, host overhead) eats the gain: the {predicted_clock} clock predicts "
        "{predicted_one_verify_per_plain_step:x}{neither}",
        "see SPEC-CYCLE-BOOKKEEPING-BOUND and the SPEC-HOST-* finding: bookkeeping, or the "
        "engine's host work between phases"),
    # time between cycles
    "GAP-HIGH": (
        "{gap}",
        "profile the engine's loop between steps (py-spy on the worker): the scheduler, "
        "detokenisation, output processing or logging on the step's thread; async scheduling "
        "(vLLM --async-scheduling, SGLang's overlap scheduler) hides it"),
    "GAP-OK": ("{gap}", ""),
    # against a past
    "PAST-ACCEPT-DOWN": (
        "acceptance fell from {past:pct} {over} to {recent:pct} in the last {seconds:.1f} s "
        "({points:+.0f} points)",
        "something changed in the draft or the traffic: a deploy, a new draft checkpoint, a "
        "different prompt mix; see the acceptance profile"),
    "PAST-THROUGHPUT-DOWN": (
        "per-sequence tokens/s fell from {past:.1f} {over} to {recent:.1f} in the last "
        "{seconds:.1f} s ({change:+.0f}%)",
        "the other recent findings say why"),
    "PAST-THROUGHPUT-DOWN/unexplained": (
        "",
        "neither acceptance nor a phase explains it: the batch, the prompt mix or the machine "
        "changed"),
    "PAST-STEADY": (
        "the last {seconds:.1f} s match {reference} (acceptance {past:pct} → {recent:pct})", ""),
    "PAST-SLOWER-ALL": (
        "every phase is {uniform_factor:.1f}x slower than {over} ({each}, {clock} clock): the "
        "machine is busier, its clock throttles, or the batch grew (mean batch "
        "{past_batch:z.1f} → {recent_batch:z.1f})",
        "not the speculation itself: check the host's load and the batch size"),
    "PAST-BOUNDARY-COST": (
        "{names} are each about {boundary_seconds:ms} slower per cycle than {over} ({each}, "
        "{clock} clock): the same time added at each phase boundary, a cost paid between phases "
        "rather than work in any one of them",
        "look for a synchronize between phases (synchronize-based profiling, .item(), .cpu()), "
        "a profiler or logging at the phase boundaries"),
    "PAST-PHASE-SLOWER": (
        "{phase} is {ratio:.1f}x slower than {over} ({phase_past:ms} → {phase_recent:ms} per "
        "cycle, {clock} clock) while the other phases changed {others_changed:.2f}x",
        "{phase_advice}"),
    "PAST-HOST-BUSY": (
        "the engine's thread waited {recent_wait_seconds:ms} per cycle for a CPU in the last "
        "{seconds:.1f} s against {past_wait_seconds:ms} {over}: other work on the host took the "
        "CPUs, {wait_share:pct} of the {added_seconds:ms} per cycle the phases gained ({each}, "
        "{clock} clock)",
        "not the speculation: look at what else runs on the host and at the pod's CPU limit; "
        "give the engine's thread a core of its own"),
    # against the cohort
    "COHORT-ACCEPT-BELOW": (
        "acceptance is {server:pct} here against {cohort:pct} on {others} ({points:+.0f} "
        "points, same window)",
        "the same model drafts worse on this server alone: a different draft checkpoint or "
        "config was deployed here, or it serves other traffic; see the acceptance profile"),
    "COHORT-PHASE-SLOWER": (
        "{phase} takes {server_seconds:ms} per cycle here against {cohort_seconds:ms} on "
        "{others} ({ratio:.1f}x, {clock} clock, mean batch {server_batch:z.1f} against "
        "{cohort_batch:z.1f}){also_text}",
        "this server is slower at the same work: its GPU (clocks, thermals, a noisy "
        "neighbour), its driver or kernels, or its config (TP, graphs, quantization) differ "
        "from its peers'"),
    "COHORT-MATCHES": (
        "acceptance {server:pct} against {cohort:pct} and no phase {COHORT_PHASE_RATIO:g}x "
        "slower than on {others}", ""),
    # the advisor: k, and the draft's cost
    "ADVICE-K/best": (
        "k={k} is the best speculation length the measured acceptance and costs predict "
        "(another k gains under {ADVICE_MIN_GAIN:pct}){near}; {how}", ""),
    "ADVICE-K": (
        "k={best} is predicted {predicted_gain:+pct} tokens/s per sequence against the k={k} "
        "measured ({predicted_gain_low:+pct} .. {predicted_gain_high:+pct}){beyond}; {how}",
        "try k={best} and compare; the draft grows by {draft_per_position_seconds:ms3} a "
        "position over {draft_fixed_seconds:ms3} that does not grow"),
    "DRAFT-COSTLY": (
        "{draft_text}: it eats {gain_eaten_by_draft:pct} of the gain (predicted "
        "{predicted_speedup:x}, {speedup_with_a_free_draft:x} with a free draft); at this cost "
        "the best k is {best}",
        "look at the draft: a slower kernel or device, a draft model larger than intended, eager "
        "launches where CUDA graphs were captured, contention on its stream (EAGLE-class heads "
        "cost 0.05-0.2 of a target step a position)"),
    "DRAFT-COST": (
        "{draft_text}; it takes {gain_eaten_by_draft:pct} of what a free draft would gain", ""),
    "ADVICE-SCHEDULE": (
        "k by batch size: {bands} (measured at batch {observed})",
        "specobs advise prints it as each engine's configuration (--engine vllm, sglang, "
        "trtllm)"),
    # the batch size above which speculation stops paying
    "ADVICE-BATCH/none-pays": (
        "speculation did not pay at any batch size observed ({seen}){unmeasured}",
        "see the speedup and acceptance findings"),
    "ADVICE-BATCH/between": (
        "speculation stops paying between batch {paying_batch:.1f} ({paying_speedup:x}) and "
        "{losing_batch:.1f} ({losing_speedup:x}), about {threshold_batch:.0f} (measured at "
        "{span}: {seen})",
        "disable speculation above batch {threshold_batch:.0f} ({k_zero_above})"),
    "ADVICE-BATCH/one": (
        "speculation pays at the one batch size observed ({seen}); where it stops paying cannot "
        "be told from one batch size",
        "to find it, diagnose windows at several batch sizes: doctor --prometheus over a "
        "history in which the load varied, or report over such a run"),
    "ADVICE-BATCH/too-far": (
        "speculation pays at {pays} ({seen}); extrapolated from batches {fitted_on}, the costs' "
        "trend reaches 1 only at about {extrapolated_batch:.0f}, {extrapolation_factor:.0f}x the "
        "largest batch observed, too far to name", ""),
    "ADVICE-BATCH/stays": (
        "speculation pays at {pays} ({seen}); extrapolated from batches {fitted_on}, the costs' "
        "trend stays above 1 up to {searched_batch:.0f}", ""),
    "ADVICE-BATCH/extrapolated": (
        "speculation pays at {pays} ({seen}); extrapolated from batches {fitted_on}, it stops "
        "paying above about {threshold_batch:.0f} ({extrapolation_factor:.1f}x the largest "
        "batch observed, confidence {confidence})",
        "disable speculation above batch {threshold_batch:.0f} ({k_zero_above}) once a window "
        "at that batch confirms it"),
}


def _predicts(v: Values) -> str:
    return "" if v["predicted"] is None else f"; the cost model predicts {x(v['predicted'])}"


def _unmeasured(v: Values) -> str:
    lo = v["min_batch"]
    return " at any batch size" if lo <= 1.5 else f"; below batch {lo:.1f} it was not measured"


def _gap(v: Values) -> str:
    return _format("the engine spends {gap_share:pct} of its busy time between cycles "
                   "({gap_steady_seconds:ms} a gap per {cycle_seconds:ms} cycle{grown}): tokens/s "
                   "per sequence is {gap_share:pct} below what its cycles give{wall}", v)


def _phase_advice(v: Values) -> str:
    return {"verify": "the target's forward got dearer: a larger batch or context, a slower "
                      "kernel, repeated work, or contention on the device",
            "draft": "the draft got dearer: a longer k, a larger draft, or its CUDA graphs no "
                     "longer replaying",
            }.get(v["phase"], "look at what this phase does and what changed in it")


def _near(v: Values) -> str:
    if v["best"] == v["k"]:
        return ""
    return _format("; k={best} is predicted {predicted_gain:+pct} but within the data's spread "
                   "({predicted_gain_low:+pct} .. {predicted_gain_high:+pct})", v)


def _how(v: Values) -> str:
    if v["fitted_on"] is not None:
        return f"from the forward's cost fitted on {v['fitted_on']}"
    return ("holding verify's cost (its growth with tokens was not measured: one step of k at "
            "a time)")


def _beyond(v: Values) -> str:
    return " (extrapolated beyond the measured k)" if v["best"] > v["k"] else ""


def _draft_text(v: Values) -> str:
    factor = v.get("draft_per_position_against_past")
    grown = "" if factor is None or factor < v["DRAFT_GREW"] \
        else f"; it costs {factor:.1f}x a position what it did before"
    return _format("the draft costs {draft_of_verify:.2f} of a verify ({draft_seconds:ms} against "
                   "{verify_seconds:ms} at k={k}), {draft_per_position_of_plain_step:.2f} of a "
                   "plain target step a position", v) + grown


FRAGMENTS.update({"near": _near, "how": _how, "beyond": _beyond, "draft_text": _draft_text})
FRAGMENTS.update({"predicts": _predicts, "unmeasured": _unmeasured, "gap": _gap,
                  "phase_advice": _phase_advice})


def _key(code: str) -> str:
    for prefix in ("SPEC-RECENT-", "SPEC-SAVED-"):
        if code.startswith(prefix):
            return "PAST-" + code.removeprefix(prefix)
    return code.removeprefix("SPEC-")


def found(code: str, severity: str, evidence: Evidence, variant: str = "", *,
          advice: str | None = None, **facts: Any) -> Finding:
    """The finding ``code``: its sentence and advice rendered from ``evidence``, the thresholds
    that decide it and ``facts`` (values the words need that are not evidence). ``variant``
    picks one of the code's sentences; ``advice`` names the variant whose advice replaces the
    sentence's own."""
    key = _key(code)
    sentence, words = TEXTS[f"{key}/{variant}" if variant else key]
    if advice is not None:
        words = TEXTS[f"{key}/{advice}"][1]
    values = {**used_by(code), **evidence, **facts}
    return Finding(code, severity, _format(sentence, values), evidence, _format(words, values))
