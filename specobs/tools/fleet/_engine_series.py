"""A simulated server's engine exposition: the engine's own speculative decoding series, as the
engine writes them, over the same simulated cycles as the plugin's series.

Names, types, label names and HELP text come from the rules' one table
(:data:`specobs.mixin._engines.ENGINES`), so the simulator serves exactly what the normalising
rules read; this module gives each series its value from an :class:`EngineState` and each label
its value. A series of the table with no value here is an error (a test serves every engine).

What each engine's figures mean follows the engine's own code (the table's ``source``): SGLang
counts verify calls when a request finishes and reports acceptance as gauges over its last
logging window; TensorRT-LLM counts generated tokens when a request finishes; the vLLM schema
(vLLM, llama.cpp, LMDeploy) counts drafts, draft tokens and accepted tokens per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from specobs.mixin import _engines

__all__ = ["ENGINE_PORTS", "EngineCollector", "EngineState", "engine_job", "render",
           "series_values", "target_labels"]

#: Each engine's usual serving port: its endpoint's ``instance`` is ``<pod>:<port>``.
ENGINE_PORTS: dict[str, int] = {"vllm": 8000, "sglang": 30000, "trtllm": 8000,
                                "llamacpp": 8080, "lmdeploy": 23333}

#: The labels an engine's series carry, with the value a single-replica server gives them
#: (the model's name is the server's; positions are per series).
_LABEL_VALUES: dict[str, dict[str, str]] = {
    "vllm": {"engine": "0"},
    "sglang": {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0",
               "is_streaming": "false"},
    "trtllm": {"engine_type": "trtllm"},
    "llamacpp": {},
    "lmdeploy": {"engine": "0"},
}
_POSITION_LABELS = ("position", "token_position")


def engine_job(engine: str) -> str:
    """The Prometheus job an engine's own endpoint is scraped under: its name, as a scrape
    config per engine would name it (distinct from specobs's job, so the plugin's series win)."""
    return engine


@dataclass(frozen=True)
class EngineState:
    """What a server's engine series are computed from: its cumulative counts (what the engine's
    counters hold) and what its recent steps look like (what its gauges report)."""

    #: Draft length k of every step (the engine's configured ``num_speculative_tokens``).
    k: int
    #: Verify steps summed over sequences (vLLM's "drafts"): one per sequence per step.
    drafts: int
    #: Accepted draft tokens at each draft position (0-based) since the start.
    accepted_by_position: tuple[int, ...]
    #: Generated tokens since the start: accepted drafts plus one bonus token per draft.
    generated: int
    #: Sequence-steps per finished request (SGLang and TensorRT-LLM count at request finish).
    steps_per_request: int
    #: Recent steps: the mean accepted draft tokens per sequence-step (no bonus token) and the
    #: share of sequence-steps that accepted each position.
    recent_accept_length: float
    recent_accepted_share: tuple[float, ...]
    #: The draft phase's share of a step's time (TensorRT-LLM's draft overhead).
    draft_overhead: float
    requests_running: float
    requests_waiting: float

    @property
    def accepted(self) -> int:
        return sum(self.accepted_by_position)

    @property
    def finished_drafts(self) -> int:
        """Drafts of finished requests: what a counter bumped at request finish holds."""
        return self.drafts // self.steps_per_request * self.steps_per_request


Value = float | dict[int, float]


def _vllm_schema(prefix: str) -> dict[str, Callable[[EngineState], Value]]:
    s = f"{prefix}spec_decode_num"
    return {
        f"{s}_drafts_total": lambda st: st.drafts,
        f"{s}_draft_tokens_total": lambda st: st.drafts * st.k,
        f"{s}_accepted_tokens_total": lambda st: st.accepted,
        f"{s}_accepted_tokens_per_pos_total": lambda st: dict(enumerate(st.accepted_by_position)),
    }


def _finished_generated(st: EngineState) -> float:
    # Generated tokens of finished requests: the same share of the total as their drafts.
    return st.generated * st.finished_drafts / st.drafts if st.drafts else 0.0


_VALUES: dict[str, Callable[[EngineState], Value]] = {
    **_vllm_schema("vllm:"),
    "vllm:generation_tokens_total": lambda st: st.generated,
    "vllm:num_requests_running": lambda st: st.requests_running,
    "vllm:num_requests_waiting": lambda st: st.requests_waiting,
    # SGLang (EAGLE chain, topk 1): k steps, k + 1 tokens per verify (the root and k drafts).
    "sglang:spec_accept_length": lambda st: 1 + st.recent_accept_length,
    "sglang:spec_accept_rate": lambda st: st.recent_accept_length / st.k,
    "sglang:spec_num_steps": lambda st: st.k,
    "sglang:spec_num_draft_tokens": lambda st: st.k + 1,
    "sglang:spec_verify_calls_total": lambda st: st.finished_drafts,
    "sglang:generation_tokens_total": lambda st: st.generated,
    "sglang:num_running_reqs": lambda st: st.requests_running,
    "sglang:num_queue_reqs": lambda st: st.requests_waiting,
    "trtllm_spec_decode_num_draft_tokens_total": lambda st: st.drafts * st.k,
    "trtllm_spec_decode_num_accepted_tokens_total": lambda st: st.accepted,
    "trtllm_spec_decode_drafted_tokens_total": lambda st: dict.fromkeys(range(st.k), st.drafts),
    "trtllm_spec_decode_accepted_tokens_total":
        lambda st: dict(enumerate(st.accepted_by_position)),
    "trtllm_spec_decode_acceptance_length": lambda st: 1 + st.recent_accept_length,
    "trtllm_spec_decode_draft_overhead": lambda st: st.draft_overhead,
    "trtllm_generation_tokens_total": _finished_generated,
    "trtllm_num_requests_running": lambda st: st.requests_running,
    "trtllm_num_requests_waiting": lambda st: st.requests_waiting,
    **_vllm_schema("llamacpp:"),
    "llamacpp:tokens_predicted_total": lambda st: st.generated,
    "llamacpp:requests_processing": lambda st: st.requests_running,
    "llamacpp:requests_deferred": lambda st: st.requests_waiting,
    **_vllm_schema("lmdeploy:"),
    "lmdeploy:spec_decode_mean_accept_rate": lambda st: st.recent_accept_length / st.k,
    "lmdeploy:spec_decode_mean_accept_length": lambda st: 1 + st.recent_accept_length,
    "lmdeploy:spec_decode_per_position_accept_rate":
        lambda st: dict(enumerate(st.recent_accepted_share)),
    "lmdeploy:generation_tokens_total": lambda st: st.generated,
    "lmdeploy:num_requests_running": lambda st: st.requests_running,
    "lmdeploy:num_requests_waiting": lambda st: st.requests_waiting,
}


def series_values(metric: _engines.EngineMetric, state: EngineState) -> Value:
    """One series family's value (a dict by draft position for a per-position family)."""
    fn = _VALUES.get(metric.name)
    if fn is None:
        raise KeyError(f"fleet-sim has no value for the engine series {metric.name} of the "
                       "rules' table: add it to specobs/tools/fleet/_engine_series.py")
    return fn(state)


def _label_values(engine: str, metric: _engines.EngineMetric, model: str) -> list[str]:
    values = {"model_name": model, **_LABEL_VALUES[engine]}
    missing = [lab for lab in metric.labels if lab not in values and lab not in _POSITION_LABELS]
    if missing:
        raise KeyError(f"fleet-sim gives no value to label(s) {missing} of {metric.name}")
    return [values.get(lab, "") for lab in metric.labels]


def target_labels(engine: str, model: str) -> dict[str, str]:
    """Labels the scrape target adds (as a Kubernetes pod label would): the model's name where
    the engine's own series carry none (llama.cpp), so its series join their model's cohort."""
    e = _engines.by_name()[engine]
    return {} if any("model_name" in m.labels for m in e.metrics) else {"model_name": model}


class EngineCollector:
    """A ``prometheus_client`` collector of one engine's series over a simulated server."""

    def __init__(self, engine: str, model: str, state: Callable[[], EngineState]) -> None:
        self.engine = _engines.by_name()[engine]
        self.model = model
        self.state = state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = self.state()
        for m in self.engine.metrics:
            values = _label_values(self.engine.name, m, self.model)
            position = next((lab for lab in m.labels if lab in _POSITION_LABELS), None)
            family: Any
            if m.type == _engines.COUNTER:
                # prometheus_client appends _total to a counter's name, as the engines' own
                # prometheus_client counters do.
                family = CounterMetricFamily(m.name.removesuffix("_total"), m.help,
                                             labels=m.labels)
            else:
                family = GaugeMetricFamily(m.name, m.help, labels=m.labels)
            value = series_values(m, state)
            if position is None:
                assert not isinstance(value, dict), m.name
                family.add_metric(values, float(value))
            else:
                assert isinstance(value, dict), m.name
                at = m.labels.index(position)
                for pos, v in sorted(value.items()):
                    values[at] = str(pos)
                    family.add_metric(list(values), float(v))
            yield family


def render(registry: Any, engine: str, accept: str) -> tuple[str, bytes]:
    """The exposition an engine's ``/metrics`` answers with: the Python engines negotiate
    OpenMetrics or text as ``prometheus_client`` does; llama.cpp's server writes text always."""
    from prometheus_client import exposition
    from prometheus_client.openmetrics import exposition as om

    if engine != "llamacpp":
        _, ctype = exposition.choose_encoder(accept)
        if ctype.startswith("application/openmetrics-text"):
            # Names kept as the engines write them: prometheus_client's default underscore
            # escaping turns the colons of sample names (not of their TYPE lines) into
            # underscores. Its OpenMetrics encoder has no annotations.
            body = om.generate_latest(registry, escaping=om.ALLOWUTF8)  # type: ignore[no-untyped-call]
            return om.CONTENT_TYPE_LATEST, body
    return exposition.CONTENT_TYPE_PLAIN_0_0_4, exposition.generate_latest(registry)
