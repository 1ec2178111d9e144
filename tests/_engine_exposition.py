"""HTTP servers that serve a serving engine's own /metrics as the engine writes it, for tests of
the rules that normalise the engines' series (specobs/mixin/_engines.py).

:class:`EngineExposition` serves one engine of ``_engines.ENGINES``: every series family the
table lists for it, with the table's name, type, label names and HELP text, and nothing else
but the request-latency histograms the dashboards read (vLLM and SGLang only). The values come
from a :class:`Workload`: counters advance at the workload's rates between scrapes (whole
tokens, as the engines count them), gauges hold the workload's figures. Assigning
``server.workload`` changes the rates from that moment on; the counters never go back.

How each engine writes its exposition:

* vLLM, SGLang, TensorRT-LLM and LMDeploy use prometheus_client: the text here is
  ``prometheus_client.generate_latest`` over a collector of metric families, so the ``_total``
  suffix, the HELP and TYPE lines and the escaping are the library's.
* llama.cpp's server writes the text itself (``tools/server/server-task.cpp``): one HELP and one
  TYPE line per name, the name with its ``_total``, values through a C++ stream (six
  significant digits, ``1.23457e+06``), the per-position counter with its ``position`` label.

``workload_figures(engine, workload)`` gives what the fleet rules must compute from the
server, for assertions.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from specobs.mixin import _engines

__all__ = ["EngineExposition", "Workload", "engine_hosts", "workload_figures"]


@dataclass(frozen=True)
class Workload:
    """What an engine does, in the terms every engine's counters derive from.

    ``drafts_per_second``: verify steps of one sequence that carried a draft, per second (vLLM's
    num_drafts). Each drafts ``k`` tokens; ``position_acceptance[i]`` is the fraction of drafts
    whose token at position ``i`` is accepted (unconditional, non-increasing). Every step emits
    its accepted tokens and the target's bonus token.
    """

    drafts_per_second: float = 50.0
    k: int = 3
    position_acceptance: tuple[float, ...] = (0.8, 0.6, 0.4)
    running: float = 4.0
    waiting: float = 1.0
    model: str = "llama-3-8b"
    #: TensorRT-LLM's share of an iteration spent drafting (its draft_overhead gauge).
    draft_overhead: float = 0.2
    #: Mean request latencies in seconds for the latency histograms.
    latency_seconds: dict[str, float] = field(
        default_factory=lambda: {"inter_token": 0.02, "time_to_first_token": 0.1, "e2e": 2.0})

    def __post_init__(self) -> None:
        if len(self.position_acceptance) != self.k:
            raise ValueError(f"position_acceptance needs k={self.k} figures, got "
                             f"{len(self.position_acceptance)}")

    @property
    def accepted_per_draft(self) -> float:
        return math.fsum(self.position_acceptance)

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens."""
        return self.accepted_per_draft / self.k

    @property
    def emitted_per_second(self) -> float:
        return self.drafts_per_second * (1.0 + self.accepted_per_draft)


def workload_figures(engine: str, w: Workload) -> dict[str, Any]:
    """What the fleet rules must give for a server of ``engine`` under ``w``: acceptance,
    tokens/s, accept length (bonus included), acceptance by position (``None``: the engine
    exports none)."""
    per_position = None if engine == "sglang" else dict(enumerate(w.position_acceptance))
    return {
        "acceptance": w.acceptance,
        "emitted_per_second": w.emitted_per_second,
        "accept_length_incl_bonus": 1.0 + w.accepted_per_draft,
        "acceptance_by_position": per_position,
    }


#: Label values the engines put on their series besides the model's name and the position.
_LABEL_VALUES = {"engine": "0", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0",
                 "is_streaming": "false"}
_ENGINE_TYPE = {"sglang": "unified", "trtllm": "trtllm"}


def _rates_and_values(engine: str, w: Workload) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Per series name of ``engine``: (labels besides the constant ones, the counter's rate
    per second or the gauge's value)."""
    d, k = w.drafts_per_second, w.k
    accepted = d * w.accepted_per_draft
    emitted = w.emitted_per_second
    positions = list(enumerate(w.position_acceptance))
    if engine in ("vllm", "llamacpp", "lmdeploy"):
        p = f"{engine}:spec_decode_num"
        out = {
            f"{p}_drafts_total": [({}, d)],
            f"{p}_draft_tokens_total": [({}, d * k)],
            f"{p}_accepted_tokens_total": [({}, accepted)],
            f"{p}_accepted_tokens_per_pos_total": [({"position": str(i)}, d * a)
                                                   for i, a in positions],
        }
        if engine == "vllm":
            out |= {"vllm:generation_tokens_total": [({}, emitted)],
                    "vllm:num_requests_running": [({}, w.running)],
                    "vllm:num_requests_waiting": [({}, w.waiting)]}
        elif engine == "llamacpp":
            out |= {"llamacpp:tokens_predicted_total": [({}, emitted)],
                    "llamacpp:requests_processing": [({}, w.running)],
                    "llamacpp:requests_deferred": [({}, w.waiting)]}
        else:
            out |= {"lmdeploy:spec_decode_mean_accept_rate": [({}, w.acceptance)],
                    "lmdeploy:spec_decode_mean_accept_length": [({}, 1 + w.accepted_per_draft)],
                    "lmdeploy:spec_decode_per_position_accept_rate": [
                        ({"position": str(i)}, a) for i, a in positions],
                    "lmdeploy:generation_tokens_total": [({}, emitted)],
                    "lmdeploy:num_requests_running": [({}, w.running)],
                    "lmdeploy:num_requests_waiting": [({}, w.waiting)]}
        return out
    if engine == "sglang":
        return {
            "sglang:spec_accept_length": [({}, 1 + w.accepted_per_draft)],
            # accepted drafts / (verify steps x configured draft tokens per step)
            "sglang:spec_accept_rate": [({}, w.acceptance)],
            "sglang:spec_num_steps": [({}, float(k))],
            # topk = 1: the draft tokens per verify are the steps plus the verified token.
            "sglang:spec_num_draft_tokens": [({}, float(k + 1))],
            "sglang:spec_verify_calls_total": [({}, d)],
            "sglang:generation_tokens_total": [({}, emitted)],
            "sglang:num_running_reqs": [({}, w.running)],
            "sglang:num_queue_reqs": [({}, w.waiting)],
        }
    if engine == "trtllm":
        return {
            "trtllm_spec_decode_num_draft_tokens_total": [({}, d * k)],
            "trtllm_spec_decode_num_accepted_tokens_total": [({}, accepted)],
            "trtllm_spec_decode_drafted_tokens_total": [({"token_position": str(i)}, d)
                                                        for i, _ in positions],
            "trtllm_spec_decode_accepted_tokens_total": [({"token_position": str(i)}, d * a)
                                                         for i, a in positions],
            "trtllm_spec_decode_acceptance_length": [({}, 1 + w.accepted_per_draft)],
            "trtllm_spec_decode_draft_overhead": [({}, w.draft_overhead)],
            "trtllm_generation_tokens_total": [({}, emitted)],
            "trtllm_num_requests_running": [({}, w.running)],
            "trtllm_num_requests_waiting": [({}, w.waiting)],
        }
    raise ValueError(f"no exposition for engine {engine!r}; expected one of "
                     f"{sorted(_engines.by_name())}")


#: The request-latency histograms the dashboards read (their ENGINE_LATENCY), per engine: the
#: name without ``_bucket`` and the workload's latency it observes.
_LATENCY = {
    "vllm": (("vllm:inter_token_latency_seconds", "inter_token"),
             ("vllm:time_to_first_token_seconds", "time_to_first_token"),
             ("vllm:e2e_request_latency_seconds", "e2e")),
    "sglang": (("sglang:inter_token_latency_seconds", "inter_token"),
               ("sglang:time_to_first_token_seconds", "time_to_first_token"),
               ("sglang:e2e_request_latency_seconds", "e2e")),
}
#: One series family as served: the table's entry and its (labels, value) samples.
_Family = tuple[_engines.EngineMetric, list[tuple[dict[str, str], float]]]
#: A latency histogram: name, HELP, labels, cumulative (le, count) buckets, sum.
_Histogram = tuple[str, str, dict[str, str], list[tuple[str, float]], float]
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def engine_hosts(count: int) -> list[str]:
    """``count`` loopback addresses other than 127.0.0.1 (Linux routes all of 127/8 to lo): an
    engine endpoint on its own host, as on a pod without the plugin."""
    return [f"127.0.0.{i}" for i in range(2, 2 + count)]


class EngineExposition:
    """One engine's /metrics on ``host`` (a free port); see the module docstring."""

    def __init__(self, engine: str, workload: Workload | None = None, host: str = "127.0.0.2",
                 latency: bool = True) -> None:
        table = _engines.by_name()
        if engine not in table:
            raise ValueError(f"unknown engine {engine!r}; expected one of {sorted(table)}")
        self.engine = table[engine]
        self.latency = latency
        self._lock = threading.Lock()
        self._workload = workload or Workload()
        self._check_covers_table(self._workload)
        self._started = time.time()
        self._last = self._started
        # Counters start from a lifetime before the test (as a server that ran a while), so
        # Prometheus never extrapolates a window back to zero.
        self._totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._advance_to(self._started, lifetime_seconds=600.0)
        self._http = ThreadingHTTPServer((host, 0), self._handler())
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        name=f"engine-{engine}", daemon=True)
        self._thread.start()

    def _check_covers_table(self, w: Workload) -> None:
        served = set(_rates_and_values(self.engine.name, w))
        listed = {m.name for m in self.engine.metrics}
        if served != listed:
            raise AssertionError(
                f"the {self.engine.name} fixture serves {sorted(served - listed)} beyond the "
                f"table and misses {sorted(listed - served)}: keep it in step with _engines.py")

    # -- the workload ----------------------------------------------------------------------

    @property
    def workload(self) -> Workload:
        return self._workload

    @workload.setter
    def workload(self, w: Workload) -> None:
        with self._lock:
            self._advance_to(time.time())
            self._workload = w

    @property
    def target(self) -> str:
        host, port = self._http.server_address[:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}/metrics"

    def _labels(self, names: tuple[str, ...], extra: dict[str, str]) -> tuple[tuple[str, str], ...]:
        values = {**_LABEL_VALUES, "model_name": self._workload.model,
                  "engine_type": _ENGINE_TYPE.get(self.engine.name, ""), **extra}
        return tuple((n, values[n]) for n in names)

    def _advance_to(self, now: float, lifetime_seconds: float = 0.0) -> None:
        """Add what the counters gained since the last call at the current rates."""
        dt = max(0.0, now - self._last) + lifetime_seconds
        self._last = now
        kinds = {m.name: m for m in self.engine.metrics}
        for name, points in _rates_and_values(self.engine.name, self._workload).items():
            metric = kinds[name]
            if metric.type != _engines.COUNTER:
                continue
            for extra, rate in points:
                key = (name, self._labels(metric.labels, extra))
                self._totals[key] = self._totals.get(key, 0.0) + rate * dt
        if self.latency:
            per_second = self._workload.drafts_per_second
            for name, which in _LATENCY.get(self.engine.name, ()):
                mean = self._workload.latency_seconds[which]
                key = (name, ())
                self._totals[key] = self._totals.get(key, 0.0) + per_second * dt
                self._totals[(name + "_sum", ())] = (self._totals.get((name + "_sum", ()), 0.0)
                                                     + per_second * dt * mean)

    # -- the exposition --------------------------------------------------------------------

    def exposition(self) -> str:
        """The /metrics body now."""
        with self._lock:
            self._advance_to(time.time())
            families = list(self._families())
            histograms = list(self._histograms())
        if self.engine.name == "llamacpp":
            return _llamacpp_text(families)
        return _prometheus_client_text(families, histograms)

    def _families(self) -> Iterator[_Family]:
        points = _rates_and_values(self.engine.name, self._workload)
        for metric in self.engine.metrics:
            samples = []
            for extra, figure in points[metric.name]:
                labels = dict(self._labels(metric.labels, extra))
                if metric.type == _engines.COUNTER:
                    # Whole tokens and steps, as the engines count them.
                    figure = float(math.floor(self._totals[(metric.name, tuple(labels.items()))]))
                samples.append((labels, figure))
            yield metric, samples

    def _histograms(self) -> Iterator[_Histogram]:
        """The latency histograms: every request observed at the workload's mean."""
        if not self.latency:
            return
        for name, which in _LATENCY.get(self.engine.name, ()):
            mean = self._workload.latency_seconds[which]
            count = float(math.floor(self._totals[(name, ())]))
            buckets = [(f"{b}", count if b >= mean else 0.0) for b in _LATENCY_BUCKETS]
            yield (name, f"Histogram of {which.replace('_', ' ')} latency in seconds.",
                   {"model_name": self._workload.model}, [*buckets, ("+Inf", count)],
                   self._totals[(name + "_sum", ())])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = server.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


def _prometheus_client_text(families: list[_Family], histograms: list[_Histogram]) -> str:
    """The text prometheus_client writes for these families (what vLLM, SGLang, TensorRT-LLM
    and LMDeploy serve)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    built: list[Any] = []
    for metric, samples in families:
        family_type = CounterMetricFamily if metric.type == _engines.COUNTER else GaugeMetricFamily
        fam = family_type(metric.name, metric.help, labels=list(metric.labels))
        for labels, value in samples:
            fam.add_metric([labels[n] for n in metric.labels], value)
        built.append(fam)
    for name, help_text, labels, buckets, total in histograms:
        h = HistogramMetricFamily(name, help_text, labels=list(labels))
        h.add_metric(list(labels.values()), buckets, total)
        built.append(h)

    class Collector:
        def collect(self) -> Iterator[Any]:
            yield from built

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry).decode()


def _llamacpp_text(families: list[_Family]) -> str:
    """The text llama.cpp's server writes: its own HELP/TYPE lines and C++ stream numbers."""
    lines = []
    for metric, samples in families:
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}"]
        for labels, value in samples:
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{metric.name}{{{inner}}} {value:g}" if inner
                         else f"{metric.name} {value:g}")
    return "\n".join(lines) + "\n"
