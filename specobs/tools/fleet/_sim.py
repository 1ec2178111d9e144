"""The simulated fleet of ``specobs fleet-sim``: servers with their spread, faults applied on a
schedule, restarts and rollouts, served from one loopback port.

A server with specobs's plugin serves a real :class:`specobs.Snapshot` rendered by the
Prometheus sink's own collector (:class:`specobs.sinks.prometheus.SnapshotCollector`) and
``prometheus_client``'s encoders, with content negotiation as the real endpoint does. A server
without it (``--engines``, :mod:`._mix`) serves its engine's own series instead
(:mod:`._engine_series`) on the engine's port and job, over the same simulated cycles; a server
of kind ``vllm+plugin`` or ``sglang+plugin`` serves both. Every fault, restart and rollout is kept
in :attr:`Fleet.events` (and appended to the events file when one is given) for
:mod:`specobs.tools.fleet._score`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specobs import Settings, catalog
from specobs._model import CLOCKS
from specobs.tools.fleet import _engine_series as es
from specobs.tools.fleet._mix import DEFAULT_MIX, PLUGIN_ENGINES, ServerKind, layout
from specobs.tools.fleet._schedule import Fault
from specobs.tools.fleet._shapes import Hist, lognormal_fractions, request_fractions

__all__ = ["CLUSTERS", "ENDPOINT_ENGINE", "ENDPOINT_SPECOBS", "ENGINE_SPEEDS", "GPU_SAMPLE_EVERY",
           "MODELS", "NAMESPACE", "PHASES", "Fleet", "ModelProfile", "SimServer"]

#: The phases of a simulated cycle: specobs's default phases.
PHASES: tuple[str, ...] = Settings().phases
#: One cycle in this many is timed on the GPU clock (specobs's default sampling: adaptive, here
#: settled at this interval under specobs's default budget).
GPU_SAMPLE_EVERY = 16
SAMPLING_BUDGET: float = Settings().overhead_budget
NAMESPACE = "inference"
METRICS_PORT_LABEL = 9477


@dataclass(frozen=True)
class ModelProfile:
    """What a served model looks like to specobs: draft length, conditional acceptance per draft
    position, one draft step's and one verify pass's GPU time at batch 1, the usual batch."""

    name: str
    draft_length: int
    acceptance: tuple[float, ...]
    draft_step_seconds: float
    verify_seconds: float
    batch: float


MODELS: tuple[ModelProfile, ...] = (
    ModelProfile("llama-3.1-8b", 4, (0.82, 0.70, 0.61, 0.53), 0.0006, 0.011, 24),
    ModelProfile("llama-3.1-70b", 3, (0.78, 0.65, 0.55), 0.0012, 0.034, 16),
    ModelProfile("qwen2.5-32b", 5, (0.80, 0.68, 0.58, 0.50, 0.44), 0.0010, 0.022, 20),
    ModelProfile("mixtral-8x7b", 4, (0.74, 0.62, 0.52, 0.45), 0.0009, 0.019, 32),
)
#: Each engine's relative speed (the phases' time divides by it).
ENGINE_SPEEDS: dict[str, float] = {"vllm": 1.0, "sglang": 0.93, "trtllm": 1.08, "llamacpp": 0.6,
                                   "lmdeploy": 0.97}
#: A server's two endpoints: specobs's exposition and the engine's own.
ENDPOINT_SPECOBS = "specobs"
ENDPOINT_ENGINE = "engine"
CLUSTERS: tuple[str, ...] = ("us-east-1", "eu-west-1")


#: The engine's time between two cycles (its scheduler, Python between steps) as a share of the
#: host cycle, plus a fixed part: the simulated ``specobs_cycle_gap_seconds``.
GAP_SHARE = 0.04
GAP_FIXED_SECONDS = 0.00004

TOKENS_PER_REQUEST = 200
"""Sequence-cycles per finished request in the simulation (its per-request acceptance)."""


class _Aggregationish:
    """What ``SnapshotCollector`` needs of an aggregation besides the snapshot: the lock and the
    CPU counters its own rendering time is added to (exported as the exporter's CPU time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cpu_seconds: dict[str, float] = {"hot_path": 0.0, "resolver": 0.0}


@dataclass
class SimServer:
    """One simulated server: identity, its own spread of parameters, and cumulative state."""

    index: int
    model: ModelProfile
    engine: str
    #: What specobs_info names the plugin's integration ("" without the plugin).
    integration: str
    cluster: str
    rng: random.Random
    kind: ServerKind = DEFAULT_MIX[0][0]
    acceptance: tuple[float, ...] = ()
    batch: float = 1.0
    phase_gpu_seconds: dict[str, float] = field(default_factory=dict)
    generation: int = 0
    # fault state
    acceptance_factor: float = 1.0
    verify_factor: float = 1.0
    stalled: bool = False
    exporter_down: bool = False
    down_until: float = 0.0  # restarting: no answer until this monotonic time
    # cumulative state
    created: float = 0.0
    last_advance: float = 0.0
    last_cycle_timestamp: float | None = None
    cycles: float = 0.0
    sequences: float = 0.0
    hists: dict[str, Hist] = field(default_factory=dict)
    agg: _Aggregationish = field(default_factory=_Aggregationish)
    registry: Any = None
    engine_registry: Any = None
    _snapshot: Any = None

    # -- identity ---------------------------------------------------------------------------------
    @property
    def pod(self) -> str:
        return f"sim-{self.index:04d}-r{self.generation}"

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints this server serves: specobs's (the plugin), the engine's, or both."""
        return ((ENDPOINT_SPECOBS,) if self.kind.plugin else ()) + (
            (ENDPOINT_ENGINE,) if self.kind.engine_series else ())

    @property
    def primary(self) -> str:
        """The endpoint alerts name this server by: specobs's where the plugin is loaded."""
        return self.endpoints[0]

    def endpoint_instance(self, endpoint: str) -> str:
        port = METRICS_PORT_LABEL if endpoint == ENDPOINT_SPECOBS else es.ENGINE_PORTS[self.engine]
        return f"{self.pod}:{port}"

    def endpoint_path(self, endpoint: str) -> str:
        if endpoint == ENDPOINT_SPECOBS:
            return f"/s/{self.index}/r{self.generation}/metrics"
        return f"/s/{self.index}/r{self.generation}/{self.engine}/metrics"

    @property
    def instance(self) -> str:
        return self.endpoint_instance(self.primary)

    @property
    def path(self) -> str:
        return self.endpoint_path(self.primary)

    def target_labels(self, endpoint: str) -> dict[str, str]:
        """The file_sd labels of one endpoint's target. The engine's endpoint is scraped under
        the engine's own job, and gets the model's name where the engine's series carry none."""
        labels = {"__metrics_path__": self.endpoint_path(endpoint),
                  "instance": self.endpoint_instance(endpoint), "pod": self.pod,
                  "cluster": self.cluster, "namespace": NAMESPACE}
        if endpoint == ENDPOINT_ENGINE:
            labels |= {"job": es.engine_job(self.engine),
                       **es.target_labels(self.engine, self.model.name)}
        return labels

    def labels(self) -> dict[str, str]:
        """The labels every series of this server's primary endpoint carries in Prometheus (and
        the rules' engine label), with ``source``: plugin or engine (only its engine's series)."""
        labels = {"cluster": self.cluster, "namespace": NAMESPACE, "instance": self.instance,
                  "pod": self.pod, "host": self.pod, "model_name": self.model.name,
                  "serving_engine": self.engine, "source": self.kind.source}
        if not self.kind.plugin:
            labels["job"] = es.engine_job(self.engine)
        return labels

    # -- the model ---------------------------------------------------------------------------------
    def setup(self, now_wall: float, now_mono: float) -> None:
        r = self.rng
        self.acceptance = tuple(min(a * r.uniform(0.96, 1.04), 0.97)
                                for a in self.model.acceptance)
        self.batch = self.model.batch * r.uniform(0.85, 1.15)
        speed = ENGINE_SPEEDS[self.engine] * r.uniform(0.95, 1.05)
        self.phase_gpu_seconds = {
            "draft": self.model.draft_length * self.model.draft_step_seconds
            * (1 + 0.004 * self.batch) / speed,
            "verify": self.model.verify_seconds * (1 + 0.01 * self.batch) / speed,
            "bookkeeping": 0.00025 * r.uniform(0.85, 1.15),
        }
        self.restart(now_wall, now_mono)

    def restart(self, now_wall: float, now_mono: float) -> None:
        """Counters from zero, a new ``_created`` (a process restart)."""
        dur = catalog.DURATION_BUCKETS_SECONDS
        self.hists = {f"{p}/{c}": Hist(dur) for p in PHASES for c in CLOCKS}
        self.hists["cycle/gpu"] = Hist(dur)
        self.hists["cycle/host"] = Hist(dur)
        self.hists["gap"] = Hist(dur)
        self.hists["accept"] = Hist(catalog.accept_length_buckets(self.model.draft_length))
        self.hists["batch"] = Hist(catalog.BATCH_SIZE_BUCKETS)
        self.hists["requests"] = Hist(catalog.REQUEST_ACCEPTANCE_BUCKETS)
        self.cycles = self.sequences = 0.0
        self.agg = _Aggregationish()
        self.created = now_wall
        self.last_advance = now_mono
        self.last_cycle_timestamp = None
        self._shape()
        self._registry()

    def _registry(self) -> None:
        from prometheus_client import CollectorRegistry

        from specobs.sinks.prometheus import SnapshotCollector

        self.registry = self.engine_registry = None
        if self.kind.plugin:
            self.registry = CollectorRegistry(auto_describe=False)
            # The collector reads a MetricSource: this server is one, with a snapshot built
            # from the simulation.
            self.registry.register(SnapshotCollector(self, exemplars=False))
        if self.kind.engine_series:
            self.engine_registry = CollectorRegistry(auto_describe=False)
            self.engine_registry.register(
                es.EngineCollector(self.engine, self.model.name, self.engine_state))

    def _shape(self) -> None:
        sig = 0.18
        host = {}
        for p, g in self.phase_gpu_seconds.items():
            g = g * (self.verify_factor if p == "verify" else 1.0)
            h = g * 1.04 + 0.00003
            host[p] = h
            self.hists[f"{p}/gpu"].shape(lognormal_fractions(catalog.DURATION_BUCKETS_SECONDS,
                                                              g, sig), g)
            self.hists[f"{p}/host"].shape(lognormal_fractions(catalog.DURATION_BUCKETS_SECONDS,
                                                               h, sig), h)
        gpu_cycle = sum(self.phase_gpu_seconds.values()) + self.phase_gpu_seconds["verify"] * (
            self.verify_factor - 1)
        host_cycle = sum(host.values())
        self.hists["cycle/gpu"].shape(lognormal_fractions(catalog.DURATION_BUCKETS_SECONDS,
                                                           gpu_cycle, sig), gpu_cycle)
        self.hists["cycle/host"].shape(lognormal_fractions(catalog.DURATION_BUCKETS_SECONDS,
                                                            host_cycle, sig), host_cycle)
        self.cycle_seconds = host_cycle
        gap = host_cycle * GAP_SHARE + GAP_FIXED_SECONDS
        self.hists["gap"].shape(lognormal_fractions(catalog.DURATION_BUCKETS_SECONDS, gap, sig),
                                gap)
        self.gap_seconds = gap
        # accept length L per sequence: P(L >= j) = product of the first j conditional acceptances
        k = self.model.draft_length
        at_least = [1.0]
        for a in self.acceptance:
            at_least.append(at_least[-1] * min(a * self.acceptance_factor, 0.99))
        exactly = [at_least[j] - (at_least[j + 1] if j < k else 0.0) for j in range(k + 1)]
        mean_len = sum(at_least[1:])
        self.hists["accept"].shape([*exactly, 0.0, 0.0], mean_len)
        self.hists["batch"].shape(lognormal_fractions(catalog.BATCH_SIZE_BUCKETS,
                                                       self.batch, 0.35), self.batch)
        # Finished requests' acceptance: spread around the server's acceptance rate.
        rate = mean_len / k
        self.hists["requests"].shape(request_fractions(rate), rate)

    def set_fault(self, now_wall: float, now_mono: float, **state: Any) -> None:
        self.advance(now_wall, now_mono)
        for key, value in state.items():
            setattr(self, key, value)
        self._shape()

    def advance(self, now_wall: float, now_mono: float) -> None:
        dt = now_mono - self.last_advance
        self.last_advance = now_mono
        if dt <= 0 or self.stalled:
            return
        # Cycles and the gaps between them fill the time (a busy server never idles).
        n = dt / (self.cycle_seconds + self.gap_seconds) * self.rng.uniform(0.97, 1.03)
        self.cycles += n
        seqs = n * self.batch
        self.sequences += seqs
        for p in PHASES:
            self.hists[f"{p}/host"].add(n)
            self.hists[f"{p}/gpu"].add(n / GPU_SAMPLE_EVERY)
        self.hists["cycle/host"].add(n)
        self.hists["cycle/gpu"].add(n / GPU_SAMPLE_EVERY)
        self.hists["gap"].add(n)
        self.hists["accept"].add(seqs)
        self.hists["batch"].add(n)
        self.hists["requests"].add(seqs / TOKENS_PER_REQUEST)
        self.last_cycle_timestamp = now_wall

    # -- the MetricSource SnapshotCollector reads (``generation`` is the rollout's, above) -------
    def add_cpu(self, component: str, seconds: float) -> None:
        with self.agg.lock:
            self.agg.cpu_seconds[component] = self.agg.cpu_seconds.get(component, 0.0) + seconds

    def count_dropped(self, reason: str, n: int) -> None:
        pass  # a simulated server loses nothing of its own

    def snapshot(self) -> Any:
        from specobs import Snapshot

        k = self.model.draft_length
        accept = self.hists["accept"].data()
        seqs = accept.count
        accepted = sum(j * c for j, c in enumerate(accept.counts[: k + 1]))
        # The accept-length sum is the accepted tokens, exactly as the resolver aggregates it.
        accept = type(accept)(accept.bounds, accept.counts, float(accepted), seqs)
        batch = self.hists["batch"].data()
        batch = type(batch)(batch.bounds, batch.counts, float(seqs), batch.count)
        cycles = int(self.cycles)
        with self.agg.lock:
            cpu = dict(self.agg.cpu_seconds)
        busy = not self.exporter_down
        requests = self.hists["requests"].data()
        host_means = [self.hists[f"{p}/host"].mean for p in PHASES]
        return Snapshot(
            phases=PHASES,
            max_draft_length=k,
            labels={"model_name": self.model.name, "serving_engine": self.engine},
            info={"version": "fleet-sim", "phases": ",".join(PHASES), "gpu_clock": "cuda_event",
                  "sampling": "adaptive", "integration": self.integration, "core": "native"},
            cycles_total=cycles,
            draft_tokens_total=seqs * k,
            accepted_tokens_total=accepted,
            emitted_tokens_total=accepted + seqs,
            sampled_cycles_total=cycles // GPU_SAMPLE_EVERY,
            phase_histograms={(p, c): self.hists[f"{p}/{c}"].data() for p in PHASES
                              for c in CLOCKS},
            cycle_histograms={c: self.hists[f"cycle/{c}"].data() for c in CLOCKS},
            accept_length=accept,
            drafted_by_position=(seqs,) * k,
            batch_size=batch,
            last_cycle_timestamp_seconds=self.last_cycle_timestamp,
            # A configured per-sequence non-speculative rate: one verify-sized step per token.
            baseline_tokens_per_second=1.0 / (self.phase_gpu_seconds["verify"] * 1.04),
            requests_running=round(self.batch) if busy else None,
            requests_waiting=float(self.rng.randint(0, 3)),
            dropped=dict.fromkeys(catalog.DROP_REASONS, 0),
            errors=dict.fromkeys(catalog.ERROR_KINDS, 0),
            cpu_seconds=cpu,
            sampling_interval=GPU_SAMPLE_EVERY,
            sampling_budget_ratio=SAMPLING_BUDGET,
            overhead_ratio=0.002,
            created_unix_nano=int(self.created * 1e9),
            # The engine's thread on a CPU for most of each cycle, waiting for one a little.
            worker_thread_seconds={"running": self.cycles * self.cycle_seconds * 0.9,
                                   "waiting": self.cycles * self.cycle_seconds * 0.01},
            # A fixed k: every cycle at the model's draft length.
            cycles_by_draft_length={k: cycles},
            phase_seconds_by_draft_length={k: tuple(cycles * m for m in host_means)},
            emitted_by_draft_length={k: accepted + seqs},
            accepted_by_draft_length={k: accepted},
            sequences_by_draft_length={k: seqs},
            batch_by_draft_length={k: seqs},
            cycle_gap=self.hists["gap"].data(),
            idle_gaps_total=0,
            request_acceptance=requests,
            requests_finished_total=requests.count,
            draft_tokens_unverified=0,
        )

    def engine_state(self) -> es.EngineState:
        """The engine's own counters and gauges over the same cycles as :meth:`snapshot`."""
        k = self.model.draft_length
        accept = self.hists["accept"]
        counts = [int(c) for c in accept.counts]  # as exposed: each bucket floored
        by_position = tuple(sum(counts[j + 1: k + 1]) for j in range(k))
        drafts = sum(counts)
        shares = accept.fractions
        gpu = self.phase_gpu_seconds
        draft, verify = gpu["draft"], gpu["verify"] * self.verify_factor
        return es.EngineState(
            k=k,
            drafts=drafts,
            accepted_by_position=by_position,
            generated=sum(by_position) + drafts,
            steps_per_request=TOKENS_PER_REQUEST,
            recent_accept_length=accept.mean,
            recent_accepted_share=tuple(sum(shares[j + 1: k + 1]) for j in range(k)),
            draft_overhead=draft / (draft + verify + gpu["bookkeeping"]),
            requests_running=round(self.batch),
            requests_waiting=float(self.rng.randint(0, 3)),
        )

    def render(self, accept: str, endpoint: str | None = None) -> tuple[str, bytes]:
        """One endpoint's exposition (the primary one by default) for this Accept header."""
        from prometheus_client.exposition import choose_encoder

        if (endpoint or self.primary) == ENDPOINT_ENGINE:
            return es.render(self.engine_registry, self.engine, accept)
        encoder, ctype = choose_encoder(accept)
        return ctype, encoder(self.registry)


class Fleet:
    """N servers, a fault schedule, restarts and scrape failures, served over HTTP."""

    def __init__(self, n_servers: int, faults: list[Fault], *, seed: int = 0,
                 scrape_failure_ratio: float = 0.002, restarts_per_hour: float = 0.2,
                 restart_downtime_seconds: float = 10.0, clusters: int = 2,
                 events_path: Path | None = None, targets_path: Path | None = None,
                 mix: tuple[tuple[ServerKind, float], ...] = DEFAULT_MIX,
                 models: int = len(MODELS)) -> None:
        if not 1 <= models <= len(MODELS):
            raise ValueError(f"models must be in 1..{len(MODELS)}, got {models}")
        self.n = n_servers
        self.faults = faults
        self.rng = random.Random(seed)
        self.scrape_failure_ratio = scrape_failure_ratio
        self.restarts_per_hour = restarts_per_hour
        self.restart_downtime_seconds = restart_downtime_seconds
        self.events_path = events_path
        #: Every fault start and end, restart and rollout, as the events file has them.
        self.events: list[dict[str, Any]] = []
        self.targets_path = targets_path
        self.address = ""
        now_wall, now_mono = time.time(), time.monotonic()
        self.start_wall, self.start_mono = now_wall, now_mono
        self._last_tick_mono = now_mono
        self.models = MODELS[:models]
        #: Each server's kind and its index in its kind's block, in server order.
        self.layout = layout(n_servers, mix)
        self.servers: list[SimServer] = []
        for i, (kind, j) in enumerate(self.layout):
            # Within a kind's block: models vary fastest, then (plugin) the engine, then the
            # cluster, so every cohort (model x engine x cluster) gets servers early.
            model = self.models[j % models]
            if kind.engine is None:
                engine = PLUGIN_ENGINES[(j // models) % len(PLUGIN_ENGINES)][0]
                cluster = CLUSTERS[(j // (models * len(PLUGIN_ENGINES))) % clusters]
            else:
                engine = kind.engine
                cluster = CLUSTERS[(j // models) % clusters]
            s = SimServer(
                index=i, model=model, engine=engine,
                integration=kind.integration(engine) if kind.plugin else "",
                cluster=cluster, rng=random.Random(seed * 1_000_003 + i), kind=kind,
            )
            s.setup(now_wall, now_mono)
            self.servers.append(s)
        #: Each endpoint's path -> its server and which endpoint it is.
        self.by_path: dict[str, tuple[SimServer, str]] = {}
        for s in self.servers:
            self._route(s, add=True)
        self._applied: set[tuple[int, str]] = set()
        self.scrapes = 0
        self.failed_scrapes = 0

    # -- events ------------------------------------------------------------------------------------
    def event(self, kind: str, servers: list[SimServer], **extra: Any) -> None:
        record = {"t": time.time(), "kind": kind, "servers": [s.labels() for s in servers],
                  **extra}
        self.events.append(record)
        if self.events_path is None:
            return
        with open(self.events_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def _route(self, s: SimServer, *, add: bool) -> None:
        for endpoint in s.endpoints:
            if add:
                self.by_path[s.endpoint_path(endpoint)] = (s, endpoint)
            else:
                del self.by_path[s.endpoint_path(endpoint)]

    def write_targets(self) -> None:
        if self.targets_path is None:
            return
        groups = [{"targets": [self.address], "labels": s.target_labels(endpoint)}
                  for s in self.servers for endpoint in s.endpoints]
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1) + "\n")
        os.replace(tmp, self.targets_path)  # file_sd must never read half a file

    # -- time --------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Apply faults whose time came, end those whose time passed, restart a few servers."""
        now_wall, now_mono = time.time(), time.monotonic()
        elapsed = now_mono - self.start_mono
        for fi, fault in enumerate(self.faults):
            for phase in ("start", "end"):
                key = (fi, phase)
                due = fault.at_seconds if phase == "start" else (
                    None if fault.duration_seconds is None
                    else fault.at_seconds + fault.duration_seconds)
                if key in self._applied or due is None or elapsed < due:
                    continue
                self._applied.add(key)
                self._apply(fault, phase == "start", now_wall, now_mono)
        # A server restarts with probability 1 - exp(-rate * dt) in the dt since the last tick:
        # the rate holds however often ticks come (a loaded machine ticks late).
        dt, self._last_tick_mono = max(0.0, now_mono - self._last_tick_mono), now_mono
        p = -math.expm1(-self.restarts_per_hour / 3600.0 * dt)
        if p > 0:
            for s in self.servers:
                if self.rng.random() < p and now_mono >= s.down_until:
                    s.advance(now_wall, now_mono)
                    s.restart(now_wall, now_mono)
                    s.down_until = now_mono + self.restart_downtime_seconds
                    self.event("restart", [s])

    def _apply(self, fault: Fault, start: bool, now_wall: float, now_mono: float) -> None:
        if fault.kind == "bad_rollout":
            targets = [s for s in self.servers if s.model.name == fault.model]
        else:
            targets = [self.servers[i] for i in fault.servers]
        for s in targets:
            if fault.kind == "acceptance_collapse":
                s.set_fault(now_wall, now_mono,
                            acceptance_factor=(fault.factor or 1.0) if start else 1.0)
            elif fault.kind == "verify_slowdown":
                s.set_fault(now_wall, now_mono, verify_factor=(fault.factor or 1.0) if start
                            else 1.0)
            elif fault.kind == "stall":
                s.set_fault(now_wall, now_mono, stalled=start)
            elif fault.kind == "exporter_down":
                s.set_fault(now_wall, now_mono, exporter_down=start)
        if fault.kind == "bad_rollout":
            old = [dict(s.labels()) for s in targets]
            for s in targets:
                # The rollout replaces every pod of the model: new names, counters from zero,
                # and (a broken draft shipped with it) lower acceptance; undoing it rolls again.
                self._route(s, add=False)
                s.generation += 1
                s.acceptance_factor = (fault.factor or 1.0) if start else 1.0
                s.restart(now_wall, now_mono)
                self._route(s, add=True)
            self.write_targets()
            self.event(f"{fault.kind}:{'start' if start else 'end'}", targets,
                       fault=fault.describe(), replaced=old)
            return
        self.event(f"{fault.kind}:{'start' if start else 'end'}", targets, fault=fault.describe())

    # -- HTTP --------------------------------------------------------------------------------------
    def respond(self, path: str, accept: str) -> tuple[int, str, bytes]:
        found = self.by_path.get(path.split("?", 1)[0])
        if found is None:
            return 404, "text/plain", b"no such simulated server\n"
        s, endpoint = found
        now_mono = time.monotonic()
        self.scrapes += 1
        # exporter_down breaks the server's primary endpoint: specobs's where the plugin is
        # loaded (the engine's own endpoint beside it keeps answering), else the engine's.
        if (s.exporter_down and endpoint == s.primary) or now_mono < s.down_until or (
                self.rng.random() < self.scrape_failure_ratio):
            self.failed_scrapes += 1
            return 503, "text/plain", b"simulated failure\n"
        s.advance(time.time(), now_mono)
        ctype, body = s.render(accept, endpoint)
        return 200, ctype, body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                parts = line.decode("latin-1").split()
                path = parts[1] if len(parts) > 1 else "/"
                status, ctype, body = self.respond(path, headers.get("accept", ""))
                reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
                writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def serve(self, host: str, port: int, duration_seconds: float,
                    ready: Any = None) -> None:
        server = await asyncio.start_server(self._handle, host, port, backlog=2048)
        bound = server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"
        self.write_targets()
        self.event("start", self.servers, address=self.address)
        if ready is not None:
            ready(self)
        deadline = None if duration_seconds <= 0 else time.monotonic() + duration_seconds
        async with server:
            while deadline is None or time.monotonic() < deadline:
                self.tick()
                await asyncio.sleep(0.25)
