"""The serving engines' own speculative decoding series, and how each maps onto specobs's fleet
series: the one table the normalising recording rules, their tests and docs/integrations.md are
generated from.

A server without specobs's plugin still exports its engine's own counters or gauges. The rules
built here turn them into the ``instance:`` series the fleet dashboard and the cohort alerts read,
labelled with the engine (``MixinConfig.engine_label``) and ``source="engine"``. Where specobs's
plugin is scraped on the same host its series win and the engine's are dropped, so nothing is
counted twice.

Names, types, labels and HELP text are the engines' own, read at the release named in
``Engine.source``. A transform is a PromQL template: ``{rate:NAME}`` is the per-server rate of a
counter, ``{gauge:NAME}`` the per-server mean of a gauge over the rate window; ``{rate_pos:NAME}``
and ``{rate_pos:NAME|LABEL}`` keep the draft position (from ``LABEL``, default ``position``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ENGINES",
    "QUANTITIES",
    "Engine",
    "EngineMetric",
    "Quantity",
    "Transform",
    "by_name",
    "expand",
    "metric_names",
    "template_series",
    "union",
]

COUNTER = "counter"
GAUGE = "gauge"


@dataclass(frozen=True)
class EngineMetric:
    """One series family as the engine writes it in its exposition."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Transform:
    """How one fleet quantity is computed from an engine's series, and what it means there."""

    quantity: str
    template: str
    #: Where the engine's figure differs from specobs's (empty: the same meaning).
    caveat: str = ""


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    #: Where the names were read: the release (or commit) and file.
    source: str
    metrics: tuple[EngineMetric, ...]
    transforms: tuple[Transform, ...]
    #: The engine's request gauges (running, waiting), for the stall alert's host join.
    request_gauges: tuple[str, ...] = ()

    def transform(self, quantity: str) -> Transform | None:
        return next((t for t in self.transforms if t.quantity == quantity), None)


@dataclass(frozen=True)
class Quantity:
    """A fleet quantity the engines feed: its key and what it is."""

    key: str
    title: str
    #: The label that varies within one server besides the instance labels ("" for none).
    extra_label: str = ""


#: The fleet quantities, in the order their rules are evaluated.
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("draft_tokens", "drafted tokens/s"),
    Quantity("accepted_tokens", "accepted draft tokens/s"),
    Quantity("drafts", "verify steps per sequence/s (drafts)"),
    Quantity("emitted_tokens", "generated tokens/s (throughput)"),
    Quantity("accept_length_incl_bonus", "mean tokens per sequence per step, bonus included"),
    Quantity("acceptance_by_position", "acceptance by draft position", "position"),
)

_VLLM_LIKE_POSITION = (
    "accepted at each position over all drafts: the engine exports no drafted-per-position "
    "counter, so once k varies per step (dynamic or adaptive speculation) a position that was "
    "not drafted reads as rejected and the figure is low"
)


def _vllm_schema(prefix: str) -> tuple[Transform, ...]:
    """The counter schema vLLM introduced and llama.cpp and LMDeploy copied."""
    s = f"{prefix}spec_decode_num"
    return (
        Transform("draft_tokens", f"{{rate:{s}_draft_tokens_total}}"),
        Transform("accepted_tokens", f"{{rate:{s}_accepted_tokens_total}}"),
        Transform("drafts", f"{{rate:{s}_drafts_total}}"),
        Transform(
            "accept_length_incl_bonus",
            f"1 + {{rate:{s}_accepted_tokens_total}}\n/\n({{rate:{s}_drafts_total}} > 0)",
        ),
        Transform(
            "acceptance_by_position",
            f"{{rate_pos:{s}_accepted_tokens_per_pos_total}}\n/ ignoring (position) group_left ()\n"
            f"({{rate:{s}_drafts_total}} > 0)",
            _VLLM_LIKE_POSITION,
        ),
    )


def _vllm_schema_metrics(
    prefix: str, labels: tuple[str, ...], drafts: str, draft_tokens: str, accepted: str,
    accepted_per_pos: str,
) -> tuple[EngineMetric, ...]:
    """The counters of :func:`_vllm_schema` as an engine writes them: its ``labels`` (plus
    ``position`` on the per-position counter) and its own HELP text for each."""
    s = f"{prefix}spec_decode_num"
    return (
        EngineMetric(f"{s}_drafts_total", COUNTER, labels, drafts),
        EngineMetric(f"{s}_draft_tokens_total", COUNTER, labels, draft_tokens),
        EngineMetric(f"{s}_accepted_tokens_total", COUNTER, labels, accepted),
        EngineMetric(f"{s}_accepted_tokens_per_pos_total", COUNTER, (*labels, "position"),
                     accepted_per_pos),
    )


_VLLM_LABELS = ("model_name", "engine")
_SGLANG_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
_TRTLLM_LABELS = ("model_name", "engine_type")

ENGINES: tuple[Engine, ...] = (
    Engine(
        "vllm",
        "vLLM",
        "vllm 0.34.0 wheel: vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py",
        (
            *_vllm_schema_metrics(
                "vllm:", _VLLM_LABELS,
                drafts="Number of spec decoding drafts.",
                draft_tokens="Number of draft tokens.",
                accepted="Number of accepted tokens.",
                accepted_per_pos="Accepted tokens per draft position.",
            ),
            EngineMetric("vllm:generation_tokens_total", COUNTER, _VLLM_LABELS,
                         "Number of generation tokens processed."),
            EngineMetric("vllm:num_requests_running", GAUGE, _VLLM_LABELS,
                         "Number of requests in model execution batches."),
            EngineMetric("vllm:num_requests_waiting", GAUGE, _VLLM_LABELS,
                         "Number of requests waiting to be processed."),
        ),
        (
            *_vllm_schema("vllm:"),
            Transform("emitted_tokens", "{rate:vllm:generation_tokens_total}",
                      "every generated token, each request's first (from its prefill) "
                      "included, which specobs's emitted tokens leave out"),
        ),
        ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ),
    Engine(
        "sglang",
        "SGLang",
        "sglang 0.5.23 wheel: sglang/srt/observability/metrics_collector.py "
        "(values: srt/managers/scheduler_components/metrics_reporter.py)",
        (
            EngineMetric("sglang:spec_accept_length", GAUGE, _SGLANG_LABELS,
                         "Mean acceptance length of speculative decoding (accepted drafts + "
                         "bonus token per forward)."),
            EngineMetric("sglang:spec_accept_rate", GAUGE, _SGLANG_LABELS,
                         "Speculative acceptance rate (`accepted drafts / proposed drafts` in "
                         "batch)."),
            EngineMetric("sglang:spec_num_steps", GAUGE, _SGLANG_LABELS,
                         "Currently active speculative_num_steps."),
            EngineMetric("sglang:spec_num_draft_tokens", GAUGE, _SGLANG_LABELS,
                         "Currently active speculative_num_draft_tokens (decouples from steps "
                         "under topk>1)."),
            EngineMetric("sglang:spec_verify_calls_total", COUNTER, _SGLANG_LABELS,
                         "Number of speculative decoding verification calls."),
            EngineMetric("sglang:generation_tokens_total", COUNTER,
                         (*_SGLANG_LABELS, "is_streaming"),
                         "Number of generation tokens processed."),
            EngineMetric("sglang:num_running_reqs", GAUGE, _SGLANG_LABELS,
                         "The number of running requests."),
            EngineMetric("sglang:num_queue_reqs", GAUGE, _SGLANG_LABELS,
                         "The number of requests in the waiting queue."),
        ),
        (
            Transform(
                "draft_tokens",
                "{rate:sglang:spec_verify_calls_total}\n* on (BY)\n"
                "({gauge:sglang:spec_num_draft_tokens} - 1)",
                "estimated: verify calls (counted when a request finishes) times the draft "
                "tokens per verify in effect (speculative_num_draft_tokens - 1); SGLang exports "
                "no drafted-token counter",
            ),
            Transform(
                "accepted_tokens",
                "{rate:sglang:spec_verify_calls_total}\n* on (BY)\n"
                "({gauge:sglang:spec_num_draft_tokens} - 1)\n* on (BY)\n"
                "{gauge:sglang:spec_accept_rate}",
                "estimated: the drafted estimate times sglang:spec_accept_rate, a gauge over the "
                "last logging window that divides accepted drafts by verify steps times the "
                "configured draft tokens per step (not by the tokens actually drafted), so "
                "acceptance reads low when adaptive speculation drafts fewer",
            ),
            Transform("drafts", "{rate:sglang:spec_verify_calls_total}",
                      "counted when a request finishes, not per step"),
            Transform("emitted_tokens", "{rate:sglang:generation_tokens_total}"),
            Transform("accept_length_incl_bonus", "{gauge:sglang:spec_accept_length}",
                      "a gauge over the last logging window, averaged over the rate window; it "
                      "keeps its last value while the server is idle"),
        ),
        ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ),
    Engine(
        "trtllm",
        "TensorRT-LLM",
        "TensorRT-LLM main @050f80d: tensorrt_llm/metrics/collector.py (PyPI 1.2.1 not checked)",
        (
            EngineMetric("trtllm_spec_decode_num_draft_tokens_total", COUNTER, _TRTLLM_LABELS,
                         "Total number of draft tokens in speculative decoding"),
            EngineMetric("trtllm_spec_decode_num_accepted_tokens_total", COUNTER, _TRTLLM_LABELS,
                         "Total number of accepted tokens in speculative decoding"),
            EngineMetric("trtllm_spec_decode_drafted_tokens_total", COUNTER,
                         (*_TRTLLM_LABELS, "token_position"),
                         "Total drafted tokens per speculative decoding position."),
            EngineMetric("trtllm_spec_decode_accepted_tokens_total", COUNTER,
                         (*_TRTLLM_LABELS, "token_position"),
                         "Total accepted tokens per speculative decoding position."),
            EngineMetric("trtllm_spec_decode_acceptance_length", GAUGE, _TRTLLM_LABELS,
                         "Acceptance length in speculative decoding"),
            EngineMetric("trtllm_spec_decode_draft_overhead", GAUGE, _TRTLLM_LABELS,
                         "Draft overhead in speculative decoding"),
            EngineMetric("trtllm_generation_tokens_total", COUNTER, _TRTLLM_LABELS,
                         "Cumulative number of generation (output) tokens produced."),
            EngineMetric("trtllm_num_requests_running", GAUGE, _TRTLLM_LABELS,
                         "Number of active requests"),
            EngineMetric("trtllm_num_requests_waiting", GAUGE, _TRTLLM_LABELS,
                         "Number of queued requests"),
        ),
        (
            Transform("draft_tokens", "{rate:trtllm_spec_decode_num_draft_tokens_total}"),
            Transform(
                "drafts",
                "max by (BY) ({rate_pos:trtllm_spec_decode_drafted_tokens_total|token_position})",
                "the tokens drafted at the first position: every verify step that drafted "
                "drafted one there (TensorRT-LLM exports no count of drafts)",
            ),
            Transform("accepted_tokens", "{rate:trtllm_spec_decode_num_accepted_tokens_total}"),
            Transform("emitted_tokens", "{rate:trtllm_generation_tokens_total}",
                      "counted per request when it finishes"),
            Transform("accept_length_incl_bonus",
                      "{gauge:trtllm_spec_decode_acceptance_length}",
                      "a gauge of the last iteration, averaged over the rate window; read as "
                      "including the bonus token (the HELP text does not say; NVIDIA Dynamo's "
                      "planner reads it so)"),
            Transform(
                "acceptance_by_position",
                "{rate_pos:trtllm_spec_decode_accepted_tokens_total|token_position}\n/\n"
                "({rate_pos:trtllm_spec_decode_drafted_tokens_total|token_position} > 0)",
                "",
            ),
        ),
        ("trtllm_num_requests_running", "trtllm_num_requests_waiting"),
    ),
    Engine(
        "llamacpp",
        "llama.cpp server",
        "llama.cpp master (PR #26389): tools/server/server-task.cpp; no release pinned",
        (
            *_vllm_schema_metrics(
                "llamacpp:", (),
                drafts="Speculative: Total speculative decoding verification steps",
                draft_tokens="Speculative: Total draft tokens generated",
                accepted="Speculative: Total draft tokens accepted by the target model",
                accepted_per_pos="Accepted tokens per draft position",
            ),
            EngineMetric("llamacpp:tokens_predicted_total", COUNTER, (),
                         "Number of generation tokens processed"),
            EngineMetric("llamacpp:requests_processing", GAUGE, (),
                         "Number of requests processing"),
            EngineMetric("llamacpp:requests_deferred", GAUGE, (),
                         "Number of requests deferred"),
        ),
        (
            *_vllm_schema("llamacpp:"),
            Transform("emitted_tokens", "{rate:llamacpp:tokens_predicted_total}"),
        ),
        ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ),
    Engine(
        "lmdeploy",
        "LMDeploy",
        "lmdeploy 0.18.0 wheel: lmdeploy/metrics/loggers.py",
        (
            *_vllm_schema_metrics(
                "lmdeploy:", _VLLM_LABELS,
                drafts="Number of speculative decoding drafts.",
                draft_tokens="Number of speculative decoding draft tokens.",
                accepted="Number of speculative decoding accepted tokens.",
                accepted_per_pos=(
                    "Number of accepted speculative decoding tokens per draft position."
                ),
            ),
            EngineMetric("lmdeploy:spec_decode_mean_accept_rate", GAUGE, _VLLM_LABELS,
                         "Mean speculative decoding acceptance rate. 1 means 100 percent "
                         "accepted."),
            EngineMetric("lmdeploy:spec_decode_mean_accept_length", GAUGE, _VLLM_LABELS,
                         "Mean speculative decoding acceptance length, including the bonus "
                         "token."),
            EngineMetric("lmdeploy:spec_decode_per_position_accept_rate", GAUGE,
                         (*_VLLM_LABELS, "position"),
                         "Speculative decoding acceptance rate per draft position. 1 means 100 "
                         "percent accepted."),
            EngineMetric("lmdeploy:generation_tokens_total", COUNTER, _VLLM_LABELS,
                         "Number of generation tokens processed."),
            EngineMetric("lmdeploy:num_requests_running", GAUGE, _VLLM_LABELS,
                         "Number of requests in model execution batches."),
            EngineMetric("lmdeploy:num_requests_waiting", GAUGE, _VLLM_LABELS,
                         "Number of requests waiting to be processed."),
        ),
        (
            *_vllm_schema("lmdeploy:"),
            Transform("emitted_tokens", "{rate:lmdeploy:generation_tokens_total}"),
        ),
        ("lmdeploy:num_requests_running", "lmdeploy:num_requests_waiting"),
    ),
)


def by_name() -> dict[str, Engine]:
    return {e.name: e for e in ENGINES}


_PLACEHOLDER = re.compile(r"\{(rate|gauge|rate_pos):([A-Za-z_:][A-Za-z0-9_:]*)(?:\|([a-z_]+))?\}")


def expand(template: str, *, by: str, selector: str, window: str) -> str:
    """A transform's PromQL: placeholders become per-server rates and gauge means over
    ``window``, grouped ``by`` (the instance labels); ``BY`` in the template is ``by``."""

    def one(m: re.Match[str]) -> str:
        kind, name, label = m.group(1), m.group(2), m.group(3) or "position"
        sel = f"{name}{{{selector}}}"
        if kind == "rate":
            return f"sum by ({by}) (rate({sel}[{window}]))"
        if kind == "gauge":
            # Ranks of one server (SGLang's tensor-parallel ranks) report the same batch.
            return f"max by ({by}) (avg_over_time({sel}[{window}]))"
        if label == "position":
            return f"sum by ({by}, position) (rate({sel}[{window}]))"
        # TensorRT-LLM names the position token_position: renamed to specobs's position.
        return (f'sum by ({by}, position) (label_replace(rate({sel}[{window}]), "position", '
                f'"$1", "{label}", "(.*)"))')

    return _PLACEHOLDER.sub(one, template).replace("(BY)", f"({by})")


def union(quantity: str, *, by: str, selector: str, window: str, engine_label: str,
          source: str) -> str | None:
    """Every engine's transform of ``quantity`` in one PromQL union, each term labelled with its
    engine (``engine_label``) and ``source``, after a comment saying what the engine's figure
    means; ``None`` when no engine gives ``quantity``. The recording rules and ``specobs
    doctor``/``top`` read the engines' series through this one expression."""
    terms = []
    for engine in ENGINES:
        t = engine.transform(quantity)
        if t is None:
            continue
        expr = expand(t.template, by=by, selector=selector, window=window)
        note = f"# {engine.title}: {t.caveat}\n" if t.caveat else f"# {engine.title}\n"
        terms.append(note + _label(_label(expr, engine_label, engine.name), "source", source))
    return "\nor\n".join(terms) if terms else None


def _label(expr: str, label: str, value: str) -> str:
    """``expr`` with ``label`` set to ``value`` on every series."""
    return f'label_replace(\n{expr}\n, "{label}", "{value}", "", "")'


def template_series(template: str) -> tuple[str, ...]:
    """The engine series a transform reads, in the order it names them, each once."""
    return tuple(dict.fromkeys(m.group(2) for m in _PLACEHOLDER.finditer(template)))


def metric_names() -> frozenset[str]:
    """Every engine series name in the table."""
    return frozenset(m.name for e in ENGINES for m in e.metrics)
