"""What does measuring a speculative decoding cycle cost, and how true are the phase times?

A synthetic EAGLE-style cycle in torch: ``k`` draft steps of a small model, one target forward over
``k + 1`` tokens per sequence, and bookkeeping with the host synchronisation real servers do
(accepted lengths copied to the host). Eager and CUDA-graph variants (draft and verify each one
graph), at a small size (cycle < 1 ms) and a large one (about 3 ms).

Modes, run side by side in rotating order so drifts in clocks and load hit every mode alike:

* ``none``       uninstrumented
* ``host``       perf_counter at each boundary (what most servers log)
* ``sync``       torch.cuda.synchronize() + perf_counter around each phase
* ``profiler``   torch.profiler with record_function per phase
* ``specobs``    specobs defaults (adaptive sampling under a 0.5% budget)
* ``every``      specobs timing every cycle on the GPU (sample_every=1)
* ``chunk32``    specobs defaults, but the resolver starting at 32 records per GIL hold and
                 polling every 50 ms instead of 100 ms
* ``slice200`` / ``slice80`` / ``slice50`` / ``slice20`` / ``every200`` / ``every50``  the
                 resolver's GIL holds sized for 200 / 80 / 50 / 20 µs of CPU (``every*``: every
                 cycle GPU-timed); 200 µs is the default
* ``torchcalls`` / ``everytorch``  defaults / every cycle, but the resolver reads CUDA events
                 through torch's ``Event.query`` / ``elapsed_time`` (as before the direct
                 runtime reads)
* ``stamps``     the floor: five bare ``perf_counter_ns`` stamps per cycle appended to a deque
* ``pycore``     defaults on the pure-Python ring (specobs/_ring.py), as where the native core
                 is not built
* ``budget2`` / ``budget1``  defaults with an overhead budget of 0.2 % / 0.1 %
* ``releasegil`` / ``everyrelease``  defaults / every cycle, with the CUDA runtime called as
                 before the GIL-held direct calls: torch's record and copy on the worker, reads
                 releasing the GIL around each call
* ``hostclock``  specobs with the host clock only (no CUDA events at all)
* ``pinned64`` / ``pinned512``  defaults, with 64 pinned acceptance buffers per dtype (4,096
                 sequences each: the default before 2026-12-03) / 512 (1,024 each) instead of 256
* ``fence1``     defaults, with every CUDA acceptance copy recording its event (as before the
                 native core fenced one copy in ``copy_fence_every``)
* ``reference``  defaults, with the resolver's bucketing in pure Python instead of compiled
* ``readonly`` / ``noresolve``  upper bounds for aggregating in another process (below)

Workloads: ``small|b32|large`` - ``eager|graph``, optionally ``-cudaacc`` (acceptance passed to
specobs as the CUDA tensor; the scheduler's host sync is a read of one number instead).

Prints cycles/s relative to ``none`` (median over rounds), and per-phase milliseconds from each
method next to a synchronize-isolated reference (each phase alone between synchronisations).

    PYTHONPATH=. python benchmarks/gpu_overhead.py --rounds 9 --seconds 0.8
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

import specobs
from specobs import _bucketing
from specobs._holds import HoldMeter, Tuning

PHASES = ("draft", "verify", "bookkeeping")
SPECOBS_MODES = (
    "specobs", "every", "chunk32", "slice200", "every200", "slice80", "slice50", "every50",
    "slice20",
    "torchcalls", "everytorch", "readonly", "noresolve", "releasegil", "everyrelease",
    "hostclock", "reference", "pycore", "budget2", "budget1", "fence1", "pinned64", "pinned512",
    "nopump",
)
#: ``reference``: the default observer with the resolver's bucketing in pure Python (the
#: reference in specobs/_bucketing.py) instead of the compiled speedups.
_COMPILED = (_bucketing.bucket, _bucketing.host_chunk, _bucketing.count_lengths)
_REFERENCE = (_bucketing.bucket_py, _bucketing.host_chunk_py, _bucketing.count_lengths_py)


def _use_bucketing(functions: tuple[Any, Any, Any]) -> None:
    _bucketing.bucket, _bucketing.host_chunk, _bucketing.count_lengths = functions


#: ``releasegil`` / ``everyrelease``: the clock as it was before the hot path and the resolver
#: called the CUDA runtime with the GIL held (torch's record and copy on the worker, reads
#: through ``ctypes.CDLL`` releasing the GIL around each call), at default sampling / every cycle.
RELEASE_GIL_MODES = ("releasegil", "everyrelease")
#: What moving the aggregation out of the worker's process could buy at best (a direction
#: weighed): ``readonly`` keeps in the worker only what cannot leave it -- taking records and
#: reading the sampled cycles' CUDA events (events cannot be timed across processes: an
#: interprocess CUDA event must be created without timing) -- and aggregates nothing, as if a
#: separate process did it at no cost; ``noresolve`` does not even read the events (a floor no
#: design reaches). Both sample at the rate the default observer settled to.
UPPER_BOUND_MODES = ("readonly", "noresolve")
#: The profiler's run is this many cycles at most: processing its trace afterwards takes far
#: longer than the loop, and its slowdown shows in a short run as well as in a long one.
PROFILER_CYCLES = 150


class Workload:
    """One synthetic EAGLE-style cycle."""

    def __init__(self, *, d: int, target_layers: int, batch: int, k: int, graphs: bool,
                 cuda_acceptance: bool = False) -> None:
        dev = torch.device("cuda")
        dt = torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)
        self.k = k
        self.batch = batch
        self.vocab = 4096
        self.draft_w1 = torch.randn(d, 2 * d, device=dev, dtype=dt, generator=g) / d**0.5
        self.draft_w2 = torch.randn(2 * d, d, device=dev, dtype=dt, generator=g) / d**0.5
        self.target_w = [
            (torch.randn(d, 4 * d, device=dev, dtype=dt, generator=g) / d**0.5,
             torch.randn(4 * d, d, device=dev, dtype=dt, generator=g) / (4 * d) ** 0.5)
            for _ in range(target_layers)
        ]
        self.lm_head = torch.randn(d, self.vocab, device=dev, dtype=dt, generator=g) / d**0.5
        self.embed = torch.randn(self.vocab, d, device=dev, dtype=dt, generator=g)
        self.h = torch.randn(batch, d, device=dev, dtype=dt, generator=g)
        self.draft_tokens = torch.zeros(batch, k, device=dev, dtype=torch.long)
        self.target_tokens = torch.zeros(batch, k + 1, device=dev, dtype=torch.long)
        self.graphs = graphs
        #: Acceptance handed to specobs as the CUDA tensor (specobs copies it asynchronously);
        #: the scheduler's host sync is then a separate read of one number.
        self.cuda_acceptance = cuda_acceptance
        self._draft_graph: torch.cuda.CUDAGraph | None = None
        self._verify_graph: torch.cuda.CUDAGraph | None = None
        if graphs:
            self._capture()

    def _draft_eager(self) -> None:
        h = self.h
        for i in range(self.k):
            h = torch.relu(h @ self.draft_w1) @ self.draft_w2
            self.draft_tokens[:, i] = (h @ self.lm_head).argmax(-1)
            h = h + self.embed[self.draft_tokens[:, i]]

    def _verify_eager(self) -> None:
        x = self.embed[self.draft_tokens].reshape(-1, self.h.shape[-1])
        x = torch.cat([self.h, x], 0)
        for w1, w2 in self.target_w:
            x = x + torch.relu(x @ w1) @ w2
        logits = x @ self.lm_head
        self.target_tokens.copy_(logits.argmax(-1).reshape(self.k + 1, self.batch).T)

    def _capture(self) -> None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self._draft_eager()
                self._verify_eager()
        torch.cuda.current_stream().wait_stream(s)
        self._draft_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._draft_graph):
            self._draft_eager()
        self._verify_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._verify_graph):
            self._verify_eager()
        torch.cuda.synchronize()

    def draft(self) -> None:
        if self._draft_graph is not None:
            self._draft_graph.replay()
        else:
            self._draft_eager()

    def verify(self) -> None:
        if self._verify_graph is not None:
            self._verify_graph.replay()
        else:
            self._verify_eager()

    def bookkeeping(self) -> list[int]:
        match = (self.draft_tokens == self.target_tokens[:, : self.k]).int()
        accept = match.cumprod(-1).sum(-1)
        if self.cuda_acceptance:
            int(accept.sum())  # the host sync a scheduler does, on one number
            return accept  # type: ignore[no-any-return]
        # The host sync real servers do: the scheduler needs accepted lengths on the CPU.
        return accept.to("cpu").tolist()  # type: ignore[no-any-return]


def run_mode(
    w: Workload, mode: str, cycles: int, obs: specobs.Observer | None = None
) -> tuple[float, dict[str, Any]]:
    """Run ``cycles`` cycles; return (seconds, per-phase info).

    ``specobs``/``every`` use ``obs``, one observer per mode that lives for the whole workload
    (as in a server: its adaptive sampling has settled, its event pool is warm), or a fresh one.
    """
    info: dict[str, Any] = {}
    draft, verify, book = w.draft, w.verify, w.bookkeeping
    torch.cuda.synchronize()
    if mode == "none":
        t0 = time.perf_counter()
        for _ in range(cycles):
            draft()
            verify()
            book()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, info
    if mode == "stamps":
        from collections import deque

        q: deque[int] = deque(maxlen=1 << 16)
        put = q.append
        pc = time.perf_counter_ns
        t0 = time.perf_counter()
        for _ in range(cycles):
            put(pc())
            draft()
            put(pc())
            verify()
            put(pc())
            put(pc())
            book()
            put(pc())
        torch.cuda.synchronize()
        return time.perf_counter() - t0, info
    if mode == "host":
        acc = dict.fromkeys(PHASES, 0)
        pc = time.perf_counter_ns
        t0 = time.perf_counter()
        for _ in range(cycles):
            a = pc()
            draft()
            b = pc()
            verify()
            c = pc()
            book()
            d = pc()
            acc["draft"] += b - a
            acc["verify"] += c - b
            acc["bookkeeping"] += d - c
        torch.cuda.synchronize()
        el = time.perf_counter() - t0
        info["phase_ms"] = {p: acc[p] / cycles / 1e6 for p in PHASES}
        return el, info
    if mode == "sync":
        acc = dict.fromkeys(PHASES, 0)
        pc = time.perf_counter_ns
        sync = torch.cuda.synchronize
        t0 = time.perf_counter()
        for _ in range(cycles):
            sync()
            a = pc()
            draft()
            sync()
            b = pc()
            verify()
            sync()
            c = pc()
            book()
            sync()
            d = pc()
            acc["draft"] += b - a
            acc["verify"] += c - b
            acc["bookkeeping"] += d - c
        el = time.perf_counter() - t0
        info["phase_ms"] = {p: acc[p] / cycles / 1e6 for p in PHASES}
        return el, info
    if mode == "profiler":
        from torch.profiler import ProfilerActivity, profile, record_function

        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(cycles):
                with record_function("draft"):
                    draft()
                with record_function("verify"):
                    verify()
                with record_function("bookkeeping"):
                    book()
            torch.cuda.synchronize()
        el = time.perf_counter() - t0
        # Only the loop is timed above; processing the trace comes after (not counted).
        try:
            ka = {e.key: e for e in prof.key_averages()}
            info["phase_ms"] = {
                p: getattr(ka[p], "device_time_total", getattr(ka[p], "cuda_time_total", 0.0))
                / 1e3 / cycles if p in ka else float("nan")
                for p in PHASES
            }
        except Exception as exc:  # profiler API drift: keep the throughput number
            info["error"] = repr(exc)
        return el, info
    if mode in SPECOBS_MODES:
        own = obs is None
        if obs is None:
            obs = make_observer(mode)
        k = w.k
        res = obs._resolver
        _use_bucketing(_REFERENCE if mode == "reference" else _COMPILED)
        meter = res.tune(meter=HoldMeter())
        gc0 = dict(GC_IN_THREAD)
        t0 = time.perf_counter()
        for _ in range(cycles):
            c = obs.begin(w.batch)
            draft()
            c.mark("verify")
            verify()
            c.mark("bookkeeping")
            c.accept(book(), draft_length=k)
            c.end()
        torch.cuda.synchronize()
        el = time.perf_counter() - t0
        obs.force_flush(timeout_seconds=30)
        _use_bucketing(_COMPILED)
        s = obs.snapshot()
        info["compiled"] = _bucketing.COMPILED and mode != "reference"
        info["phase_ms"] = {
            p: (s.phase_seconds_sum(p, "gpu") / s.phase_count(p, "gpu") * 1e3)
            if s.phase_count(p, "gpu") else float("nan")
            for p in PHASES
        }
        info["host_phase_ms"] = {
            p: s.phase_seconds_sum(p, "host") / s.phase_count(p, "host") * 1e3
            if s.phase_count(p, "host") else float("nan")
            for p in PHASES
        }
        info["sampled"] = s.sampled_cycles_total
        info["cycles"] = s.cycles_total
        info["interval"] = s.sampling_interval
        info["direct_hot_path"] = getattr(obs.clock, "direct_hot_path", None)
        info["direct_errors"] = getattr(obs.clock, "direct_errors", None)
        info["overhead_ratio"] = s.overhead_ratio
        info["resolver_us_per_cycle"] = s.cpu_seconds["resolver"] / max(s.cycles_total, 1) * 1e6
        info["acceptance_copy_us_per_cycle"] = (
            s.cpu_seconds.get("acceptance_copy", 0.0) / max(s.cycles_total, 1) * 1e6)
        # Where the resolver's holds went: slices of work, the longest, and garbage
        # collections that ran on its thread during this run (milliseconds).
        # The self-reported overhead's parts, in % of a cycle: event records (hot path, on
        # sampled cycles), host stamps (estimate), the resolver's CPU per record.
        model = res.model
        if model.cycle_ewma > 0:
            info["overhead_parts_pct"] = {
                "events": round(model.cost_ewma / max(s.sampling_interval, 1)
                                / model.cycle_ewma * 100, 3),
                "stamps": round(300 * 4 / model.cycle_ewma * 100, 3),
                "copies": round(model.copy_ewma / model.cycle_ewma * 100, 3),
                "resolver": round(model.record_ns / model.cycle_ewma * 100, 3),
            }
        info["slices"] = meter.slices
        info["max_hold_us"] = meter.max_hold_ns / 1e3
        info["long_holds"] = meter.long_holds
        info["pump_returns"] = dict(meter.pump_returns)  # why the pump came back, this run
        hs = sorted(meter.holds)
        info["hold_p50_us"] = hs[len(hs) // 2] / 1e3 if hs else 0.0
        info["hold_p90_us"] = hs[int(len(hs) * 0.9)] / 1e3 if hs else 0.0
        info["holds_over_20us"] = sum(h > 20_000 for h in hs)
        info["gc_ms"] = {t: round(GC_IN_THREAD.get(t, 0.0) - gc0.get(t, 0.0), 3)
                         for t in GC_IN_THREAD}
        if own:
            obs.shutdown(timeout_seconds=5)
        return el, info
    raise ValueError(mode)


#: Milliseconds of garbage collection per thread name, from gc.callbacks (diagnostics).
GC_IN_THREAD: dict[str, float] = {}
_gc_start = [0]


def _gc_probe(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter_ns()
        return
    name = threading.current_thread().name
    GC_IN_THREAD[name] = GC_IN_THREAD.get(name, 0.0) + (time.perf_counter_ns() - _gc_start[0]) / 1e6


def make_observer(mode: str) -> specobs.Observer:
    """specobs as a user configures it: defaults, or GPU timing on every cycle."""
    every = mode in ("every", "every200", "every50", "everytorch", "everyrelease")
    clock: Any = "host" if mode == "hostclock" else "cuda"
    if mode in RELEASE_GIL_MODES:
        from specobs.timing.cuda import CudaEventClock

        clock = CudaEventClock(release_gil=True)
    if mode == "fence1":
        from specobs.timing.cuda import CudaEventClock

        clock = CudaEventClock(copy_fence_every=1)
    if mode in ("pinned64", "pinned512"):
        # The resolver is woken whenever the free pinned buffers run low: with fewer buffers,
        # more often than for the ring's count (wake_at) or its poll.
        from specobs.timing.cuda import CudaEventClock

        clock = (CudaEventClock(pinned_buffers=64) if mode == "pinned64" else
                 CudaEventClock(pinned_buffers=512, pinned_capacity=1024))
    budget = {"budget2": 0.002, "budget1": 0.001}.get(mode)
    extra: dict[str, Any] = {} if budget is None else {"overhead_budget": budget}
    from specobs import _ring

    native = _ring.NATIVE
    _ring.NATIVE = native and mode != "pycore"
    try:
        obs = specobs.configure(clock=clock, sinks=[], sample_every=1 if every else None,
                                **extra)
    finally:
        _ring.NATIVE = native
    if mode in ("torchcalls", "everytorch"):
        obs.clock.bind_thread = lambda: False  # type: ignore[union-attr]
    if mode == "nopump":  # the resolver's loop of waits and drains, without the native pump
        obs._resolver.tune(Tuning(use_pump=False))
    if mode == "chunk32":
        obs._resolver.chunk = 32
        obs._resolver.poll = 0.05
    slice_us = {"slice200": 200, "every200": 200, "slice80": 80, "slice50": 50, "every50": 50,
                "slice20": 20}.get(mode)
    if slice_us is not None:
        obs._resolver.tune(Tuning(slice_ns=slice_us * 1000))
    if mode in UPPER_BOUND_MODES:
        _aggregate_nothing(obs, read_events=mode == "readonly")
    return obs


def _aggregate_nothing(obs: specobs.Observer, *, read_events: bool) -> None:
    """Make the resolver take cycles, read (or not) their CUDA events, and aggregate nothing."""
    res = obs._resolver

    def resolve(chunk: Any, clock: Any) -> list[Any]:
        for d in chunk[11]:
            ev, copy = d[3], d[8]
            if ev is not None and clock is not None:
                if read_events:
                    for i in range(len(ev) - 1):
                        clock.elapsed_ns(ev[i], ev[i + 1])
            res._release(ev, copy)
        return []

    res._resolve = resolve  # type: ignore[method-assign]


def reference(w: Workload, n: int, *, busy: bool = False) -> dict[str, float]:
    """Each phase alone between synchronisations, timed with CUDA events: the truth we compare to.

    ``busy=False``: the events bracket the phase as launched from an idle GPU, so launch latency
    is included (what a phase costs when nothing overlaps it). ``busy=True``: a spin kernel keeps
    the GPU busy while the phase is enqueued, so the events measure pure execution time.
    """
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    fns: dict[str, Callable[[], Any]] = {
        "draft": w.draft, "verify": w.verify, "bookkeeping": w.bookkeeping,
    }
    for _ in range(n):
        for p in PHASES:
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            if busy and p != "bookkeeping":  # bookkeeping syncs the host itself
                torch.cuda._sleep(2_000_000)  # about 1 ms
            s.record()
            fns[p]()
            e.record()
            torch.cuda.synchronize()
            out[p].append(s.elapsed_time(e))
    return {p: statistics.median(v) for p, v in out.items()}


def warm(w: Workload, seconds: float = 2.0) -> None:
    """Run the workload until the GPU clocks have ramped up."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        run_mode(w, "none", 20)


def cycle_ms(w: Workload, n: int = 200) -> float:
    el, _ = run_mode(w, "none", n)
    return el / n * 1e3


def build(name: str) -> Workload:
    """``small|b32|large`` - ``eager|graph`` [- ``cudaacc``: acceptance as a CUDA tensor]."""
    size, variant, *rest = name.split("-")
    graphs = variant == "graph"
    cuda_acc = "cudaacc" in rest
    if size == "small":
        return Workload(d=1024, target_layers=2, batch=8, k=4, graphs=graphs,
                        cuda_acceptance=cuda_acc)
    if size == "b32":  # batch 32, a mid-size model: a cycle between the small and large ones
        return Workload(d=2048, target_layers=4, batch=32, k=4, graphs=graphs,
                        cuda_acceptance=cuda_acc)
    if size == "b4":  # batch 4, a narrow model, k=3: shapes the project was not tuned on
        return Workload(d=1536, target_layers=3, batch=4, k=3, graphs=graphs,
                        cuda_acceptance=cuda_acc)
    if size == "b16":  # batch 16, k=6, a wider model
        return Workload(d=3072, target_layers=6, batch=16, k=6, graphs=graphs,
                        cuda_acceptance=cuda_acc)
    # Large: grow the target until an eager cycle takes about 3 ms.
    layers = 8
    w = Workload(d=4096, target_layers=layers, batch=64, k=4, graphs=False)
    for _ in range(3):
        ms = cycle_ms(w, 50)
        layers = max(1, round(layers * 3.0 / ms))
        w = Workload(d=4096, target_layers=layers, batch=64, k=4, graphs=False)
    return Workload(d=4096, target_layers=layers, batch=64, k=4, graphs=graphs,
                    cuda_acceptance=cuda_acc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.8,
                    help="length of one mode's run in a round (cycles = this / cycle time)")
    ap.add_argument("--cycles", type=int, default=None,
                    help="cycles per mode per round, instead of --seconds")
    ap.add_argument("--modes", default="none,host,sync,profiler,specobs,every")
    ap.add_argument("--workloads", default="small-eager,small-graph,large-eager,large-graph")
    ap.add_argument("--json", default=None, help="write full results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    torch.cuda.init()
    gc.callbacks.append(_gc_probe)
    modes = args.modes.split(",")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d"), "workloads": {},
    }
    for wl in args.workloads.split(","):
        w = build(wl)
        warm(w)
        base_ms = cycle_ms(w, 200)
        cycles = args.cycles or max(100, round(args.seconds * 1e3 / base_ms))
        ref = reference(w, 50)
        ref_busy = reference(w, 50, busy=True)
        times: dict[str, list[float]] = {m: [] for m in modes}
        infos: dict[str, dict[str, Any]] = {}
        observers = {m: make_observer(m) for m in modes if m in SPECOBS_MODES}
        for m in modes:  # warm every mode once (profiler start-up, specobs's sampling settles)
            run_mode(w, m, 50 if m == "profiler" else max(50, cycles // 4), observers.get(m))
        if "specobs" in observers:  # the upper-bound modes sample as the default settled to
            settled = observers["specobs"]._recorder.interval
            for m in UPPER_BOUND_MODES:
                if m in observers:
                    rec = observers[m]._recorder
                    rec.sample_every = rec.interval = settled
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            for m in order:
                n = min(cycles, PROFILER_CYCLES) if m == "profiler" else cycles
                el, info = run_mode(w, m, n, observers.get(m))
                times[m].append(el / n)  # seconds per cycle
                infos[m] = info
        for o in observers.values():
            o.shutdown(timeout_seconds=5)
        ratios = {}
        spread: dict[str, tuple[float, float]] = {}
        rounds: dict[str, list[float]] = {}
        for m in modes:
            # Ratio per round against the same round's uninstrumented run, then the median;
            # the quartiles of the per-round ratios say how far one run can be trusted.
            per_round = [times["none"][i] / times[m][i] for i in range(args.rounds)]
            ratios[m] = statistics.median(per_round)
            rounds[m] = per_round
            q = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
            spread[m] = (q[0], q[2])
        results["workloads"][wl] = {
            "cycle_ms": base_ms, "cycles_per_mode_round": cycles, "reference_ms": ref,
            "reference_busy_ms": ref_busy,
            "ratios": ratios, "ratio_quartiles": spread, "ratio_rounds": rounds,
            "infos": infos,
            "cycles_per_s": {m: 1 / statistics.median(times[m]) for m in modes},
        }
        print(f"\n== {wl}: uninstrumented cycle {base_ms:.3f} ms, {cycles} cycles x "
              f"{args.rounds} rounds")
        print(f"{'mode':<10} {'cyc/s':>9} {'ratio':>7} {'quartiles':>13}   " + "  ".join(
            f"{p:>12}" for p in PHASES) + "   (ms per phase; ref = sync-isolated events)")
        print(f"{'ref':<10} {'':>9} {'':>7} {'':>13}   " + "  ".join(
            f"{ref[p]:12.4f}" for p in PHASES))
        print(f"{'ref-busy':<10} {'':>9} {'':>7} {'':>13}   " + "  ".join(
            f"{ref_busy[p]:12.4f}" for p in PHASES) + "   (pure execution, no launch gaps)")
        for m in modes:
            ph = infos[m].get("phase_ms", {})
            cols = "  ".join(
                f"{ph[p]:8.4f}{'':1}{(ph[p] / ref[p] - 1) * 100:+3.0f}%" if p in ph else
                f"{'-':>12}" for p in PHASES
            )
            extra = ""
            if "interval" in infos[m]:
                extra = f"  sampled {infos[m]['sampled']}/{infos[m]['cycles']} " \
                        f"(now 1 in {infos[m]['interval']}), resolver " \
                        f"{infos[m]['resolver_us_per_cycle']:.1f} us/cycle, acceptance " \
                        f"copies {infos[m]['acceptance_copy_us_per_cycle']:.1f} us/cycle " \
                        f"(exported), self-reported " \
                        f"overhead {infos[m]['overhead_ratio'] * 100:.2f}% (measured " \
                        f"{(1 - ratios[m]) * 100:.2f}%); {infos[m]['slices']} slices, " \
                        f"longest {infos[m]['max_hold_us']:.0f} us, p50 " \
                        f"{infos[m]['hold_p50_us']:.0f} / p90 {infos[m]['hold_p90_us']:.0f} us, " \
                        f"{infos[m]['holds_over_20us']} over 20 us, " \
                        f"{infos[m]['long_holds']} over 100 us; GC ms {infos[m]['gc_ms']}; " \
                        f"parts % {infos[m].get('overhead_parts_pct')}; pump returns " \
                        f"{infos[m].get('pump_returns')}"
            q1, q3 = spread[m]
            print(f"{m:<10} {1 / statistics.median(times[m]):9.0f} {ratios[m]:7.4f} "
                  f"{q1:6.3f}-{q3:6.3f}   {cols}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
