"""Prometheus exposition of the observer's aggregation.

A custom ``prometheus_client`` collector reads :meth:`Aggregation.snapshot` at scrape time — the
one aggregation, not a second copy kept in ``prometheus_client`` metric objects — so a scrape
costs O(series) and the hot path pays nothing for Prometheus.

Three ways to expose it:

* its own HTTP endpoint (default ``127.0.0.1:9477``, ``SPECOBS_PROMETHEUS_ADDR`` /
  ``SPECOBS_PROMETHEUS_PORT``), OpenMetrics by content negotiation (``Accept:
  application/openmetrics-text``), with exemplars on the phase and cycle histograms and on the
  lowest buckets of the per-request acceptance histogram;
* mounted into a registry the inference server already serves: ``PrometheusSink(registry=r)``;
* as an app to mount in the server's own web framework: :meth:`wsgi_app` / :meth:`asgi_app`.

The own endpoint is :class:`~specobs.sinks._endpoint.MetricsServer`: one thread with a bounded
number of connections and a deadline per request (slow or idle clients cannot pile up threads inside
the inference process). What it serves is cached per format until the resolver next changes the
aggregation (or ``cache_max_age_seconds`` passed), so back-to-back scrapes cost one encode per
resolver update. ``specobs_exporter_cpu_time_seconds_total{component="prometheus"}`` counts the
endpoint thread's whole CPU time (parsing, encoding, compressing, sending), and for the WSGI app
the whole call; mounted into a foreign registry only ``collect()`` can be timed.

**`_created`**: Prometheus without ``created-timestamp-zero-ingestion`` stores each counter's
``_created`` sample as a series of its own (about a fifth of a scrape here) that no rule or
dashboard reads (``rate`` finds resets by themselves). So only ``specobs_cycles_total`` carries
it, by default: the observer's start, which ``specobs doctor`` reads as the lifetime and a
restart or a forked child shows as a new value. ``created_series="all"`` puts it on every
counter again; ``"none"`` on none.

A sink serves one observer: attaching it to a second raises ``ConfigurationError`` (create one
sink per observer). After ``fork()`` the child closes its copies of the endpoint's sockets; with
``port=0`` it serves its own numbers on a new free port, with a fixed port (the parent keeps it) it
logs one line saying that its metrics are not served.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import specobs._series as _series
import specobs.catalog as catalog
from specobs._config import prometheus_addr, prometheus_port
from specobs._errors import ConfigurationError, require
from specobs._model import HistogramData, Snapshot
from specobs.sinks._base import MetricSource, Sink

require("prometheus_client", feature="The Prometheus sink", extra="prometheus")

from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted  # noqa: E402
from prometheus_client.samples import Exemplar as PromExemplar  # noqa: E402

from specobs.sinks._endpoint import MetricsServer  # noqa: E402
from specobs.sinks._exposition import CachedExposition  # noqa: E402

__all__ = ["PrometheusSink", "SnapshotCollector"]

_log = logging.getLogger("specobs")


def _buckets(h: HistogramData, with_exemplars: bool) -> list[Any]:
    out: list[Any] = []
    exemplars = h.exemplars if with_exemplars else ()
    for i, (bound, acc) in enumerate(h.cumulative()):
        ex = exemplars[i] if i < len(exemplars) else None
        if ex is not None:
            # W3C trace-context hex, the text Tempo and Jaeger look traces up by; a request's
            # exemplar (specobs_request_acceptance) has a trace id only.
            ids = {catalog.EXEMPLAR_TRACE_ID_LABEL: f"{ex.trace_id:032x}"}
            if ex.span_id is not None:
                ids[catalog.EXEMPLAR_SPAN_ID_LABEL] = f"{ex.span_id:016x}"
            out.append((
                _series.le_text(bound), acc, PromExemplar(ids, ex.value, ex.timestamp_seconds),
            ))
        else:
            out.append((_series.le_text(bound), acc))
    return out


#: Which counters carry ``_created`` (see the module docstring): the cycle counter only, every
#: counter, or none.
CREATED_SERIES = ("cycles", "all", "none")


def _created_series(value: str) -> str:
    """``value`` if it is one of :data:`CREATED_SERIES`; a clear error otherwise."""
    if value not in CREATED_SERIES:
        raise ConfigurationError(
            f"created_series must be one of {', '.join(CREATED_SERIES)}, got {value!r}")
    return value


class _SinkRegistry(CollectorRegistry):
    """The registry a sink makes for itself, keeping its own list of what is registered.

    The cached encoder may answer for a registry only while it holds nothing but the sink's
    collector. prometheus_client (0.26, ``registry.py``) has no public way to list a registry's
    collectors: ``CollectorRegistry`` keeps them in the private ``_collector_to_names`` and its
    public surface is ``register``, ``unregister``, ``collect``, ``restricted_registry``,
    ``get_sample_value`` and the target info. ``collect()`` would tell, but only by running every
    collector (the cost the cache saves). So the sink's own registry overrides the two public
    registration methods to keep the list; a registry the user passes in is always encoded by
    prometheus_client itself.
    """

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.collectors: list[Any] = []

    def register(self, collector: Any) -> None:
        super().register(collector)
        self.collectors.append(collector)

    def unregister(self, collector: Any) -> None:
        super().unregister(collector)
        self.collectors.remove(collector)


class SnapshotCollector:
    """A ``prometheus_client`` collector over one :class:`MetricSource` (an observer's
    aggregation): each ``collect()`` renders one snapshot through :func:`specobs._series.families`.
    """

    def __init__(self, source: MetricSource, *, exemplars: bool = True,
                 created_series: str = "cycles") -> None:
        self._source = source
        self._exemplars = exemplars
        self._created_on = _created_series(created_series)
        # Set on a thread whose whole CPU time is already being counted (the endpoint thread,
        # the WSGI app): collect() then does not count its part a second time.
        self.outer = threading.local()

    def describe(self) -> list[Metric]:
        # An empty describe() makes the registry accept us without calling collect() at
        # registration time (which would cost a snapshot before any cycle ran).
        return []

    def collect(self) -> Iterator[Metric]:
        t0 = time.thread_time_ns()
        families = list(self._families(self._source.snapshot()))
        if not getattr(self.outer, "counting", False):
            self._source.add_cpu("prometheus", (time.thread_time_ns() - t0) / 1e9)
        yield from families

    def _families(self, s: Snapshot) -> Iterator[Metric]:
        const_keys = list(s.labels)
        const_vals = list(s.labels.values())
        # The observer's start as OpenMetrics ``_created``, on the counters ``created_series``
        # names (by default ``specobs_cycles_total`` only), so a reset -- a restart, or a forked
        # child starting from zero -- shows as a new value.
        created = s.created_unix_seconds or None
        created_on = self._created_on
        ex = self._exemplars
        for fam in _series.families(s):
            m = fam.metric
            names = [*fam.labels, *const_keys]
            if m.kind == "histogram":
                hf = HistogramMetricFamily(m.name, m.help, labels=names, unit="")
                for values, h in fam.points:
                    assert isinstance(h, HistogramData)
                    hf.add_metric([*values, *const_vals], _buckets(h, ex), h.sum)
                yield hf
            elif m.kind == "counter":
                cf = CounterMetricFamily(m.base_name, m.help, labels=names)
                at = created if created_on == "all" or (
                    created_on == "cycles" and m is catalog.CYCLES) else None
                for values, v in fam.points:
                    cf.add_metric([*values, *const_vals], v, created=at)  # type: ignore[arg-type]
                yield cf
            elif m.kind == "gauge":
                gf = GaugeMetricFamily(m.name, m.help, labels=names)
                for values, v in fam.points:
                    gf.add_metric([*values, *const_vals], v)  # type: ignore[arg-type]
                yield gf
            else:  # info: the info labels follow the constant labels
                inf = InfoMetricFamily("specobs", m.help, labels=const_keys)
                for values, _ in fam.points:
                    inf.add_metric(const_vals, dict(zip(fam.labels, values, strict=True)))
                yield inf


class PrometheusSink(Sink):
    """Expose the aggregation to Prometheus.

    ``PrometheusSink()``: serve ``/metrics`` on ``SPECOBS_PROMETHEUS_ADDR:SPECOBS_PROMETHEUS_PORT``
    (default ``127.0.0.1:9477``; ``port=0`` picks a free port, read it from :attr:`port`).
    ``PrometheusSink(registry=r)``: register into ``r`` and serve nothing (the server already
    exposes ``r``); pass ``port=`` as well to also serve it.

    Args:
        port: the port to serve on (0: a free one); default ``SPECOBS_PROMETHEUS_PORT``.
        addr: the address to bind; default ``SPECOBS_PROMETHEUS_ADDR``.
        registry: a prometheus_client registry to register into instead of serving one.
        exemplars: whether histograms carry trace exemplars (OpenMetrics only).
        created_series: which counters carry ``_created``: ``"cycles"`` (the default:
            ``specobs_cycles_total`` only), ``"all"`` or ``"none"`` (see the module docstring).

    Raises:
        ConfigurationError: a port outside 0..65535 or an unknown ``created_series``.
    """

    def __init__(
        self,
        port: int | None = None,
        addr: str | None = None,
        *,
        registry: CollectorRegistry | None = None,
        exemplars: bool = True,
        created_series: str = "cycles",
    ) -> None:
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigurationError(f"port must be an integer in 0..65535, got {port!r}")
        self._serve = registry is None or port is not None
        self._port_arg = port
        self._addr_arg = addr
        self.registry = registry if registry is not None else _SinkRegistry()
        self._exemplars = exemplars
        self._created_series = _created_series(created_series)
        self._server: MetricsServer | None = None
        self._attached = False
        self._bound_port: int | None = None
        self.port: int | None = None
        self.addr: str | None = None
        self.collector: SnapshotCollector | None = None
        #: How long a rendering is served to repeated scrapes when the aggregation has not
        #: changed (the exporter's own CPU counter moves only when it is re-rendered).
        self.cache_max_age_seconds = 1.0
        #: Renderings made and scrapes answered from the cache (for tests and diagnostics).
        self.renders = 0
        self.cache_hits = 0
        self._cache: dict[tuple[str, bool], tuple[int, float, bytes]] = {}
        self._exposition = CachedExposition()
        self._cache_lock = threading.Lock()

    def attach(self, source: MetricSource) -> None:
        if self._attached:
            raise ConfigurationError(
                "this PrometheusSink is already attached to an observer; create one sink per "
                "observer (a second attach would orphan the first endpoint)"
            )
        super().attach(source)
        self._attached = True
        self.collector = SnapshotCollector(source, exemplars=self._exemplars,
                                           created_series=self._created_series)
        self.registry.register(self.collector)
        if self._serve:
            port = prometheus_port() if self._port_arg is None else self._port_arg
            addr = prometheus_addr() if self._addr_arg is None else self._addr_arg
            try:
                self._start_server(addr, port)
            except OSError as exc:
                self.registry.unregister(self.collector)
                self.collector = None
                raise ConfigurationError(
                    f"cannot serve Prometheus metrics on {addr}:{port}: {exc.strerror or exc}. "
                    f"Set SPECOBS_PROMETHEUS_PORT to a free port (or 0 for any)."
                ) from exc
            self._bound_port = port

    def _start_server(self, addr: str, port: int) -> None:
        server = MetricsServer(addr, port, self._render, self._count_cpu)
        self._server = server
        self.port = server.port
        self.addr = addr

    @property
    def server(self) -> MetricsServer | None:
        """The endpoint, when this sink serves one."""
        return self._server

    # -- the endpoint's work ---------------------------------------------------------------------
    def _count_cpu(self, seconds: float) -> None:
        self.source.add_cpu("prometheus", seconds)

    def _render(self, accept: str, accept_encoding: str) -> tuple[int, str, bytes, str]:
        """The exposition for this scrape, from the cache while the aggregation is unchanged."""
        encoder, ctype = choose_encoder(accept)
        zipped = gzip_accepted(accept_encoding)
        key = (ctype, zipped)
        generation = self.source.generation
        now = time.monotonic()
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == generation and now - hit[1] < (
                self.cache_max_age_seconds
            ):
                self.cache_hits += 1
                return 200, ctype, hit[2], "gzip" if zipped else ""
            collector = self.collector
            if collector is not None:
                collector.outer.counting = True
            try:
                body = self._encode(encoder, ctype, collector)
            finally:
                if collector is not None:
                    collector.outer.counting = False
            if zipped:
                body = gzip.compress(body, compresslevel=6)
            self.renders += 1
            self._cache[key] = (generation, now, body)
        return 200, ctype, body, "gzip" if zipped else ""

    def _encode(self, encoder: Any, ctype: str, collector: SnapshotCollector | None) -> bytes:
        # The sink's own registry holding only our collector (see _SinkRegistry) is encoded
        # from the cached prefixes; anything else (more collectors, a target info, the user's
        # registry, a sample the cached encoder does not handle) by prometheus_client itself.
        reg = self.registry
        if (collector is not None and isinstance(reg, _SinkRegistry)
                and reg.collectors == [collector] and not reg.get_target_info()):
            try:
                return self._exposition.encode(list(collector.collect()), encoder, ctype)
            except ValueError as exc:
                _log.debug("specobs: cached exposition not used: %s", exc)
        return encoder(self.registry)  # type: ignore[no-any-return]

    @property
    def url(self) -> str | None:
        """``http://addr:port/metrics`` when serving, else ``None``."""
        if self.port is None:
            return None
        return f"http://{self.addr}:{self.port}/metrics"

    def wsgi_app(self) -> Any:
        """A WSGI app serving this sink's registry (mount it at ``/metrics``).

        Its whole call (collect, encode, compress) counts as the exporter's CPU time."""
        from prometheus_client import make_wsgi_app

        inner = make_wsgi_app(self.registry)

        def app(environ: Any, start_response: Any) -> Any:
            collector = self.collector
            t0 = time.thread_time()
            if collector is not None:
                collector.outer.counting = True
            try:
                return list(inner(environ, start_response))
            finally:
                if collector is not None:
                    collector.outer.counting = False
                    self.source.add_cpu("prometheus", time.thread_time() - t0)

        return app

    def asgi_app(self) -> Any:
        """An ASGI app serving this sink's registry (mount it at ``/metrics``)."""
        from prometheus_client import make_asgi_app

        return make_asgi_app(self.registry)

    def after_fork_in_child(self) -> None:
        """In a forked child: drop the parent's endpoint here; serve anew if the port was free."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.abandon_in_child()
        with self._cache_lock:
            self._cache.clear()
        import os

        old_url = self.url
        if self._bound_port == 0:
            try:
                self._start_server(server.addr, 0)
            except OSError as exc:
                self.port = None
                _log.warning("specobs: forked child (pid %d) could not serve its metrics: %s",
                             os.getpid(), exc)
                return
            _log.warning("specobs: forked child (pid %d) serves its own metrics on %s (the "
                         "parent keeps %s)", os.getpid(), self.url, old_url)
        else:
            self.port = None
            _log.warning(
                "specobs: forked child (pid %d) does not serve Prometheus metrics: the parent "
                "keeps %s. Export the child by OTLP, or call specobs.configure() in the child "
                "with another port.", os.getpid(), old_url,
            )

    def shutdown(self, timeout_seconds: float) -> None:
        server = self._server
        if server is not None:
            self._server = None
            server.shutdown(timeout_seconds)
        if self.collector is not None:
            try:
                self.registry.unregister(self.collector)
            except KeyError:
                pass
            self.collector = None
