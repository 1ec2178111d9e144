"""A server without specobs's plugin, read from a Prometheus server through its engine's own
speculative decoding series, for ``specobs doctor --prometheus`` and ``specobs top
--prometheus``.

The engines' series are normalised by the one table the recording rules use
(:mod:`specobs.mixin._engines`): :func:`engine_servers` evaluates each fleet quantity's union
over every engine (``_engines.union``) over the window, per server, and writes the result as the
counters specobs's own breakdown reads (drafted, accepted and emitted tokens, sequence-cycles,
the accept length, acceptance by draft position), so acceptance, its per-position profile, a
collapse and tokens/s are judged as for a plugin's server. What only the plugin measures (the
phases' time on the GPU and host clocks, cycles and batch sizes, the exact tokens a sequence
gains per cycle, the speedup against a baseline) is absent, never zero: :data:`NEEDS_PLUGIN`
names each, and the tools show it as needing the plugin.

As in the rules, an engine endpoint on a host where the plugin is scraped is left out: the
plugin's series of that server win. Every failure is a
:class:`~specobs.tools._client.ScrapeError` with one line for the user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specobs import catalog
from specobs.mixin import _engines
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools._client import Limits
from specobs.tools._scrape import Delta, Series

__all__ = ["ENGINE_LABEL", "NEEDS_PLUGIN", "NEEDS_PLUGIN_TEXT", "SOURCE", "EngineServer",
           "engine_servers", "host_of"]

#: The label the engine's name is given, as the recording rules give it.
ENGINE_LABEL = "serving_engine"
#: The ``source`` of a figure computed from an engine's own series.
SOURCE = "engine"
#: What only specobs's plugin measures: (name, what it is).
NEEDS_PLUGIN: tuple[tuple[str, str], ...] = (
    ("phase timing", "draft, verify and bookkeeping time per cycle on the GPU and host clocks"),
    ("cycle breakdown", "cycles, batch sizes, the k in effect and the time between cycles"),
    ("emitted tokens", "the exact tokens a sequence gains per cycle, where the engine counts "
                       "the tokens it generated"),
    ("speedup", "tokens/s per sequence against the non-speculative baseline"),
)
#: How a figure only the plugin measures is shown.
NEEDS_PLUGIN_TEXT = "needs the plugin"
#: The labels one server's figures are grouped by.
_BY = "job, instance, model_name"


@dataclass(frozen=True)
class EngineServer:
    """One engine-only server over a window: its labels and its figures as specobs's counters
    (:class:`~specobs.tools._scrape.Delta`; the request gauges among its gauges)."""

    instance: str
    #: The engine's key in the table (``vllm``, ``sglang``, ...).
    engine: str
    job: str
    model: str | None
    delta: Delta
    #: Drafts (verify steps of one sequence that drafted) in the window, ``None`` where the
    #: engine counts none.
    drafts: float | None

    @property
    def title(self) -> str:
        return _engines.by_name()[self.engine].title

    @property
    def per_position(self) -> bool:
        """The engine exports acceptance by draft position."""
        return self.delta.counters.has(catalog.DRAFTED_BY_POSITION.name)

    def window(self) -> dg.Window:
        """The diagnosis's window: the breakdown of the figures, the request gauges, and the
        drafts as the first position's drafted tokens (every draft drafts one there)."""
        w = dg.window(self.delta)
        return dg.Window(w.breakdown, w.requests_running, w.requests_waiting,
                         drafted_first=self.drafts)

    def findings(self, past: EngineServer | None) -> list[dg.Finding]:
        return dg.diagnose_engine(self.window(), past.window() if past is not None else None,
                                  self.title, self.per_position)


def host_of(instance: str) -> str:
    """``instance`` without its port, as the rules' ``host`` label is made."""
    head, sep, port = instance.rpartition(":")
    return head if sep and port.isdigit() else instance


def _query(client: Any, base_url: str, promql: str, at: float, limits: Limits
           ) -> list[tuple[dict[str, str], float]]:
    out = []
    for item in pa.prom_query(client, base_url, promql, at, limits):
        labels = {k: str(v) for k, v in (item.get("metric") or {}).items()}
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append((labels, value))
    return out


def engine_servers(
    client: Any, base_url: str, selector: str, window_seconds: float, *,
    limits: Limits = _client.DEFAULT_LIMITS, at: float, plugin_hosts: frozenset[str] = frozenset(),
) -> dict[str, EngineServer]:
    """Instance -> the engine-only server there, over the ``window_seconds`` ending at ``at``,
    for the servers ``selector`` (matchers inside braces) matches; hosts in ``plugin_hosts``
    (where specobs's plugin is scraped) are left out. Empty when no engine series match."""
    window = pa.window_text(window_seconds)
    figures: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = {}
    for q in _engines.QUANTITIES:
        promql = _engines.union(q.key, by=_BY, selector=selector, window=window,
                                engine_label=ENGINE_LABEL, source=SOURCE)
        if promql is None:
            continue
        for labels, value in _query(client, base_url, promql, at, limits):
            instance = labels.get("instance", "")
            if host_of(instance) in plugin_hosts:
                continue
            figures.setdefault(instance, {}).setdefault(q.key, []).append((labels, value))
    gauges = _request_gauges(client, base_url, selector, at, limits) if figures else {}
    out: dict[str, EngineServer] = {}
    for instance, by_quantity in sorted(figures.items()):
        first = next(iter(by_quantity.values()))[0][0]
        counters, drafts = _counters(by_quantity, window_seconds)
        out[instance] = EngineServer(
            instance, first.get(ENGINE_LABEL, ""), first.get("job", ""), first.get("model_name"),
            Delta(counters, gauges.get(instance, Series()), window_seconds), drafts,
        )
    return out


def _one(by_quantity: dict[str, list[tuple[dict[str, str], float]]], key: str) -> float | None:
    values = [v for _, v in by_quantity.get(key, [])]
    return math.fsum(values) if values else None


def _counters(by_quantity: dict[str, list[tuple[dict[str, str], float]]], seconds: float
              ) -> tuple[Series, float | None]:
    """The server's figures as the counters specobs's breakdown reads, over ``seconds``."""
    out = Series()
    for key, name in (("draft_tokens", catalog.DRAFT_TOKENS.name),
                      ("accepted_tokens", catalog.ACCEPTED_TOKENS.name),
                      ("emitted_tokens", catalog.EMITTED_TOKENS.name)):
        rate = _one(by_quantity, key)
        if rate is not None:
            out.add(name, {}, rate * seconds)
    drafts_rate = _one(by_quantity, "drafts")
    drafts = None if drafts_rate is None else drafts_rate * seconds
    if drafts is not None:
        # A draft is one sequence verified once: the sequence-cycles the plugin counts.
        out.add(f"{catalog.BATCH_SIZE.name}_sum", {}, drafts)
    length = _one(by_quantity, "accept_length_incl_bonus")
    if length is not None:
        # The mean as a histogram's sum over count: per draft where drafts are counted.
        count = drafts if drafts else 1.0
        out.add(f"{catalog.ACCEPT_LENGTH.name}_sum", {}, (length - 1.0) * count)
        out.add(f"{catalog.ACCEPT_LENGTH.name}_count", {}, count)
    if drafts:
        # Acceptance at each position over the drafts that reached it: as counts per draft, so
        # the breakdown's ratio and the first position's drafted tokens come out as measured.
        for labels, rate in by_quantity.get("acceptance_by_position", []):
            position = {"position": labels.get("position", "")}
            out.add(catalog.DRAFTED_BY_POSITION.name, position, drafts)
            out.add(catalog.ACCEPTED_BY_POSITION.name, position, rate * drafts)
    return out, drafts


def _request_gauges(client: Any, base_url: str, selector: str, at: float, limits: Limits
                    ) -> dict[str, Series]:
    """Instance -> the engine's requests running and waiting at ``at``, as specobs's request
    gauges: one query per engine gauge, every server at once."""
    out: dict[str, Series] = {}
    for engine in _engines.ENGINES:
        if len(engine.request_gauges) != 2:
            continue
        for name, ours in zip(engine.request_gauges,
                              (catalog.REQUESTS_RUNNING.name, catalog.REQUESTS_WAITING.name),
                              strict=True):
            promql = f"sum by (instance) ({name}{{{selector}}})"
            for labels, value in _query(client, base_url, promql, at, limits):
                out.setdefault(labels.get("instance", ""), Series()).add(ours, {}, value)
    return out
