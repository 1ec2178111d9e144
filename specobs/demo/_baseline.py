"""The demo's non-speculative baseline: plain decode steps measured inside the serving engine.

Realized speedup is "tokens/s one sequence gets with speculation" over "tokens/s it would get
without". The second figure is only worth comparing when it was measured like the first: at the
same batch size, on the same machine, under the same load. A baseline measured once at start-up,
at batch 1, on an idle process, is none of these: it varies from start to start, and against a
larger served batch it made a healthy CPU demo read as slower than plain decoding.

So :class:`BaselineProbe` measures the baseline *while serving*: every ``every_cycles``-th step
the engine thread, right after a speculative cycle, runs one plain (non-speculative) decode step
of the target for the very sequences it is serving (same batch size, positions and attention
length): one token per sequence, the argmax and the copy of the tokens to the host that any
decoder needs. It writes into a scratch KV cache, so the served sequences are untouched, and it
runs outside the observer's cycle, so specobs's cycle times do not include it. The probe shares
the thread, the cores and the GIL with the cycles around it, so a busy machine slows both alike.

An engine that replays CUDA graphs gets its plain step replayed as a CUDA graph too, per batch
bucket, as the engine replays its draft and verify: a plain step with eager launches is
launch-bound at this model size, and would make speculation look several times better than it
is.

The baseline is ``1 / mean step time`` over the probes of the last ``window_seconds`` (tokens/s
per sequence), the same ratio of sums the recording rules use for the speculative side
(``instance:specobs_sequence_tokens_per_second``). It leaves out what a plain decoder would also
pay per token -- handing tokens to requests, specobs's own hooks -- so it flatters
non-speculative decoding slightly: realized speedup errs low.

:class:`BaselineCollector` exports it as ``specobs_baseline_sequence_tokens_per_second`` with
``source="demo_measured"`` on the demo's Prometheus endpoint. A configured baseline
(``SPECOBS_BASELINE_TOKENS_PER_SECOND``, ``--baseline-tokens-per-second``) is exported by the
sinks without the label, which the recording rules read as ``source="configured"``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from specobs import catalog
from specobs.demo._cuda_graphs import capture_cuda_graph

__all__ = ["DEMO_MEASURED", "BaselineCollector", "BaselineProbe", "BaselineReading"]

#: The ``source`` label of a baseline the demo engine measured itself.
DEMO_MEASURED = "demo_measured"


class BaselineReading:
    """One look at the probe: the baseline, how many probes and at which mean batch size."""

    __slots__ = ("batch_size_mean", "samples", "tokens_per_second")

    def __init__(self, tokens_per_second: float, samples: int, batch_size_mean: float) -> None:
        self.tokens_per_second = tokens_per_second
        self.samples = samples
        self.batch_size_mean = batch_size_mean


class BaselineProbe:
    """Plain decode steps timed inside the engine; see the module docstring.

    ``every_cycles``: probe after every this many speculative cycles (16: about 2 % of the CPU
    demo's time). ``window_seconds``: the baseline covers the probes of this recent past, so it
    follows a change of load or batch size. ``min_samples``: fewer probes give no baseline yet.
    """

    def __init__(
        self,
        target: Any,
        max_batch: int,
        *,
        every_cycles: int = 16,
        window_seconds: float = 60.0,
        min_samples: int = 8,
        device: torch.device | str | None = None,
        cuda_graph_buckets: Sequence[int] = (),
        clock: Any = time.perf_counter,
    ) -> None:
        if every_cycles < 1:
            raise ValueError(f"every_cycles must be >= 1, got {every_cycles}")
        self.target = target
        self.every_cycles = every_cycles
        self.window_seconds = window_seconds
        self.min_samples = min_samples
        self._clock = clock
        self._cache = target.new_cache(max_batch, device=device)
        self._slots = torch.arange(max_batch, device=self._cache.k.device)
        self._cycles = 0
        self._lock = threading.Lock()
        # (when, batch size, seconds of the step)
        self._samples: collections.deque[tuple[float, int, float]] = collections.deque()
        # An engine that replays CUDA graphs is compared with a plain step replayed the same way
        # (eager launches would make the baseline launch-bound and flatter speculation).
        self._graphs = {b: _PlainStepGraph(target, self._cache, b) for b in cuda_graph_buckets}

    def after_cycle(self, tokens: torch.Tensor, positions: Sequence[int]) -> None:
        """Called by the engine thread after each speculative cycle, with each served sequence's
        last token ``[B]`` and its next position; probes every ``every_cycles``-th call."""
        self._cycles += 1
        if self._cycles % self.every_cycles:
            return
        self.measure(tokens, positions)

    @torch.inference_mode()
    def measure(self, tokens: torch.Tensor, positions: Sequence[int]) -> float:
        """One plain decode step of ``len(positions)`` sequences; returns its seconds."""
        b = len(positions)
        max_pos = self.target.config.max_seq_len - 1
        pos = [min(p, max_pos) for p in positions]
        dev = self._cache.k.device
        bucket = min((x for x in self._graphs if x >= b), default=None)
        if bucket is not None:
            graph = self._graphs[bucket]
            t0 = self._clock()
            graph.replay(tokens, pos)
            seconds = self._clock() - t0
            self.record(b, seconds)
            return seconds
        t0 = self._clock()
        pos_t = torch.tensor(pos, device=dev).unsqueeze(1)
        logits, _ = self.target(
            tokens.reshape(b, 1).to(dev), pos_t, cache=self._cache, slots=self._slots[:b],
            attend_len=max(pos) + 1,
        )
        logits[:, -1].argmax(-1).tolist()  # the host copy every decoder makes per token
        seconds = self._clock() - t0
        self.record(b, seconds)
        return seconds

    def record(self, batch_size: int, seconds: float, now: float | None = None) -> None:
        """Add one measured step (tests feed it directly)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._samples.append((now, batch_size, seconds))
            self._trim(now)

    def _trim(self, now: float) -> None:
        horizon = now - self.window_seconds
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def reading(self, now: float | None = None) -> BaselineReading | None:
        """The baseline over the window, or ``None`` while there are too few probes."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            samples = list(self._samples)
        if len(samples) < self.min_samples:
            return None
        seconds = sum(s for _, _, s in samples)
        if seconds <= 0:
            return None
        return BaselineReading(
            len(samples) / seconds, len(samples), sum(b for _, b, _ in samples) / len(samples)
        )

    def tokens_per_second(self) -> float | None:
        r = self.reading()
        return None if r is None else r.tokens_per_second


class _PlainStepGraph:
    """One plain decode step for a batch bucket, captured as a CUDA graph (as the engine captures
    its draft and verify). Padding rows decode position 0 of their own scratch slots."""

    def __init__(self, target: Any, cache: Any, bucket: int) -> None:
        dev = cache.k.device
        max_len = target.config.max_seq_len
        self.tokens = torch.zeros(bucket, 1, dtype=torch.long, device=dev)
        self.positions = torch.zeros(bucket, 1, dtype=torch.long, device=dev)
        # Kept on the instance: the graph reads these addresses on every replay, and a tensor
        # left to a local would be freed and its memory reused (index out of bounds on the GPU).
        self.slots = torch.arange(bucket, device=dev)

        def run() -> torch.Tensor:
            logits, _ = target(self.tokens, self.positions, cache=cache, slots=self.slots,
                               attend_len=max_len)  # fmt: skip
            return logits[:, -1].argmax(-1)

        self.graph, self.out = capture_cuda_graph(run, dev)

    def replay(self, tokens: torch.Tensor, positions: Sequence[int]) -> list[int]:
        b = len(positions)
        self.tokens[:b, 0].copy_(tokens.reshape(b), non_blocking=True)
        self.tokens[b:].zero_()
        self.positions[:b, 0].copy_(torch.tensor(positions), non_blocking=True)
        self.positions[b:].zero_()
        self.graph.replay()
        out: list[int] = self.out[:b].tolist()  # the host copy every decoder makes per token
        return out


class BaselineCollector:
    """A ``prometheus_client`` collector: the probe's baseline with ``source="demo_measured"``
    and the observer's constant labels (absent until the probe has enough samples)."""

    def __init__(self, probe: BaselineProbe, labels: Mapping[str, str]) -> None:
        self._probe = probe
        self._labels = dict(labels)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        value = self._probe.tokens_per_second()
        if value is None:
            return
        m = catalog.BASELINE_SEQUENCE_TOKENS
        keys = list(self._labels)
        g = GaugeMetricFamily(m.name, m.help, labels=["source", *keys])
        g.add_metric([DEMO_MEASURED, *(self._labels[k] for k in keys)], value)
        yield g
