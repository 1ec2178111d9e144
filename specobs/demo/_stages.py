"""The stages of one ``specobs demo`` run once its checks passed and its models are loaded.

:func:`start_serving` starts, in order, the baseline probe, specobs, the engine, the completions
server and the built-in load; :func:`shut_down` stops them in the opposite order and then waits
for every thread the demo started. :class:`DemoRun` holds the parts, so that shutdown stops
exactly those that were started. Only the standard library is imported until a stage runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specobs import Observer, PrometheusSink
    from specobs.tools._load import LoadSummary

    from ._baseline import BaselineProbe
    from ._engine import SpecDecodeEngine

__all__ = ["PROG", "SPECOBS_DEMO_ADMIN_TOKEN", "DemoRun", "fail", "say", "shut_down",
           "start_serving"]

PROG = "specobs demo"

SPECOBS_DEMO_ADMIN_TOKEN = "SPECOBS_DEMO_ADMIN_TOKEN"
"""Turns the demo server's ``/admin/*`` endpoints on, behind this token (``Authorization: Bearer
<token>``; at least 16 characters). Unset or empty: the endpoints are off. ``--admin-token``
overrides it."""
PLAIN_INTERVAL_SECONDS = 5.0
"""Plain progress lines (training, the summary) come this often."""
_BASELINE_EVERY_CYCLES = 16
_BASELINE_WINDOW_SECONDS = 60.0
#: Constant labels of the demo's series: the names the generated rules and dashboards group by
#: (``MixinConfig.model_label`` / ``engine_label``); vLLM's own ``engine`` label is an index.
DEMO_LABELS = {"model_name": "specobs-demo", "serving_engine": "specobs-demo"}


def say(text: str) -> None:
    """One line of the demo's own output, flushed at once."""
    print(text, flush=True)


def fail(text: str, code: int = 1) -> int:
    """Say what went wrong on stderr, under the command's name; returns the exit status."""
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)
    return code


class DemoRun:
    """One ``specobs demo`` run's parts, started stage by stage by :func:`~specobs.demo._cli.run`;
    :func:`shut_down` stops those that were started."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.threads_before = set(threading.enumerate())
        self.engine: SpecDecodeEngine | None = None
        self.observer: Observer | None = None
        self.prom: PrometheusSink | None = None
        self.server: Any = None
        self.probe: BaselineProbe | None = None
        self.baseline_note = ""
        self.load_thread: threading.Thread | None = None
        self.load_stop = threading.Event()
        self.load_summary: LoadSummary | None = None
        #: The observer's snapshot where serving began and where it ended, and when.
        self.first: Any = None
        self.first_at = self.started
        self.final: Any = None
        self.final_at = self.started

    def baseline(self) -> float | None:
        return None if self.probe is None else self.probe.tokens_per_second()



def _observer_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment :func:`specobs.configure` reads for the demo: the user's, with the demo's
    defaults where it says nothing. The Prometheus exporter is on unless ``SPECOBS_EXPORTERS``
    says otherwise (``--metrics-port`` turns it on and sets its port), OTLP is added when an
    ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set, and :data:`DEMO_LABELS` come before the user's
    ``SPECOBS_LABELS`` (which win on a clash)."""
    env = dict(os.environ)
    names = [n.strip() for n in env.get("SPECOBS_EXPORTERS", "").split(",") if n.strip()]
    if not names:
        names = ["prometheus"]
    if args.metrics_port is not None:
        names.append("prometheus")
        env["SPECOBS_PROMETHEUS_PORT"] = str(args.metrics_port)
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        names.append("otlp")
    env["SPECOBS_EXPORTERS"] = ",".join(dict.fromkeys(names))
    labels = ",".join(f"{k}={v}" for k, v in DEMO_LABELS.items())
    user = env.get("SPECOBS_LABELS", "").strip()
    env["SPECOBS_LABELS"] = f"{labels},{user}" if user else labels
    return env


def _configure_observer(
    args: argparse.Namespace, baseline: float | None, probe: BaselineProbe | None = None
) -> tuple[Observer, PrometheusSink | None]:
    """(observer, its PrometheusSink or None), made by :func:`specobs.configure` from
    :func:`_observer_env`. ``probe``: the engine's baseline probe, exported on the Prometheus
    endpoint with ``source="demo_measured"`` (``baseline`` is then ``None``)."""
    import specobs

    kwargs: dict[str, Any] = {}
    if baseline is not None:
        kwargs["baseline_tokens_per_second"] = baseline
    observer = specobs.configure(env=_observer_env(args), max_draft_length=max(args.k, 1),
                                 **kwargs)
    prom = next((s for s in observer.sinks if isinstance(s, specobs.PrometheusSink)), None)
    if prom is not None and probe is not None:
        from ._baseline import BaselineCollector

        # The sink serves its own registry: the measured baseline goes next to the series.
        prom.registry.register(BaselineCollector(probe, observer.snapshot().labels))
    return observer, prom


def _join_demo_threads(
    device: str, *, before: set[threading.Thread], timeout_seconds: float = 10.0
) -> None:
    """Wait for the demo's own threads (engine, draft training, resolver, exporters, server,
    load) to end before the interpreter exits.

    A daemon thread still inside torch when the interpreter finalizes is stopped in the middle
    of C++ frames, and with CUDA up that ends the process with ``terminate called without an
    active exception`` (SIGABRT, status 134) after the summary. Everything was asked to stop
    before this; here we only wait, bounded. On CUDA the device is synchronized last.
    """
    deadline = time.monotonic() + timeout_seconds
    ours = [t for t in threading.enumerate()
            if t not in before and t is not threading.current_thread()]
    for t in ours:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in ours if t.is_alive()]
    if left:
        print(f"{PROG}: threads still running at exit: {', '.join(left)}", file=sys.stderr,
              flush=True)
    if device == "cuda":
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.synchronize()


def _choose_baseline(
    args: argparse.Namespace, engine: SpecDecodeEngine
) -> tuple[float | None, str, BaselineProbe | None]:
    """(configured baseline or None, how it was chosen, the probe measuring it or None)."""
    if args.baseline_tokens_per_second is not None:
        return args.baseline_tokens_per_second, "configured by flag", None
    if os.environ.get("SPECOBS_BASELINE_TOKENS_PER_SECOND"):
        return None, "configured by SPECOBS_BASELINE_TOKENS_PER_SECOND", None
    from ._baseline import BaselineProbe
    from ._cuda_graphs import batch_buckets

    probe = BaselineProbe(
        engine.target, engine.max_batch, every_cycles=_BASELINE_EVERY_CYCLES,
        window_seconds=_BASELINE_WINDOW_SECONDS, device=engine.device,
        cuda_graph_buckets=batch_buckets(engine.max_batch) if engine.cuda_graphs else (),
    )  # fmt: skip
    engine.baseline_probe = probe
    say("the non-speculative baseline is measured while serving: a plain decode step "
        f"of the served batch every {_BASELINE_EVERY_CYCLES}th cycle (source="
        f'"demo_measured", over the last {_BASELINE_WINDOW_SECONDS:g} s)')
    return None, "measured while serving, same batch", probe


def _start_load(
    args: argparse.Namespace, engine: SpecDecodeEngine, url: str, summary: LoadSummary,
    stop: threading.Event,
) -> threading.Thread:
    """The built-in closed-loop load on its own thread, with in-distribution prompts."""
    from specobs.tools._load import run_load

    language = engine.models.language
    seed = args.seed

    def prompt_source(rng: Any, n: int) -> list[int]:
        # In-distribution text: the draft is trained on this language.
        return list(language.stream(n + 8, seed=rng.randrange(1 << 30))[:n])

    room = engine.max_request_tokens() - 32
    max_tokens = max(1, min(args.max_tokens, room))

    def load_main() -> None:
        import asyncio

        try:
            asyncio.run(run_load(
                url, concurrency=args.concurrency, seed=seed,
                prompt_tokens=(4, 32), max_tokens=max_tokens,
                prompt_source=prompt_source, stop_event=stop,
                summary=summary, timeout_seconds=3600,
            ))  # fmt: skip
        except Exception as exc:  # the demo goes on without load
            print(f"{PROG}: built-in load stopped: {exc!r}", file=sys.stderr)

    thread = threading.Thread(target=load_main, name="specobs-demo-load", daemon=True)
    thread.start()
    return thread


def start_serving(r: DemoRun, admin_token: str | None, limits: Any) -> list[str] | int:
    """The baseline, specobs, the engine, the completions server and the built-in load, in that
    order: the lines that say where each is, or an exit status when one cannot start."""
    from specobs.tools._load import LoadSummary

    from . import _summary
    from ._server import ServerThread, create_app

    args, engine = r.args, r.engine
    assert engine is not None
    baseline, r.baseline_note, r.probe = _choose_baseline(args, engine)
    try:
        r.observer, r.prom = _configure_observer(args, baseline, r.probe)
    except Exception as exc:
        bind = exc.__cause__
        if args.metrics_port is not None and isinstance(bind, OSError):
            # The port came from the command line: say the flag, not the variable the
            # demo passed it on in.
            return fail(f"cannot serve specobs metrics on port {args.metrics_port}: "
                        f"{bind.strerror or bind}; pick another --metrics-port (0: any "
                        "free port)")
        return fail(f"cannot start the specobs exporter: {exc}")
    engine.observer = r.observer
    if args.fault != "none":
        engine.fault = args.fault
    engine.start()
    pending = engine.models.pending
    if pending is not None:
        pending.start(engine.load_draft_state)
        say(f"draft head training in the background ({pending.total} steps; the engine "
            f"takes its weights every {pending.publish_every} steps)")

    app = create_app(engine, r.observer, admin_token=admin_token, limits=limits)
    try:
        r.server = ServerThread(app, args.host, args.port, limits=limits).start()
    except OSError as exc:
        return fail(f"cannot serve completions on {args.host}:{args.port}: "
                    f"{exc.strerror or exc}; pick another --port")
    prom = r.prom
    metrics_url = prom.url if prom is not None else None
    target = None
    if prom is not None:
        host = "127.0.0.1" if prom.addr in ("0.0.0.0", "", "::") else prom.addr
        target = f"{host}:{prom.port}"
    where = _summary.where_lines(metrics_url, r.server.url, target,
                                 admin=admin_token is not None)
    say(f"serving completions on {r.server.url}/v1/completions")
    say(f"admin endpoints on {r.server.url}/admin/fault (Authorization: Bearer <token>)"
        if admin_token is not None else
        f"admin endpoints off (--admin-token or {SPECOBS_DEMO_ADMIN_TOKEN} turns them on)")
    if metrics_url:
        say(f"specobs metrics on {metrics_url}")

    if not args.no_load:
        r.load_summary = LoadSummary(r.server.url)
        r.load_thread = _start_load(args, engine, r.server.url, r.load_summary, r.load_stop)
    return where


def shut_down(r: DemoRun) -> None:
    """Load first (no new requests), then the server, the engine and specobs (its last
    snapshot kept for the final summary); an unfinished draft head's training is completed."""
    r.load_stop.set()
    engine = r.engine
    if r.server is not None:
        # Requests in flight get a moment to finish; then the engine ends the rest (a stalled
        # engine never would), so each gets its answer and uvicorn cancels nothing.
        r.server.stop(grace_seconds=1.0, on_grace_end=engine.close if engine else None)
    if engine is not None:
        engine.close()
    if r.load_thread is not None:
        r.load_thread.join(10)
    pending = None if engine is None else engine.models.pending
    if pending is not None:
        # The engine is closed: the training must not copy weights into it any more
        # (on a GPU that is a CUDA call from the training thread during teardown).
        pending.detach()
    if r.observer is not None:
        with contextlib.suppress(Exception):
            r.observer.force_flush(5)
        r.final = r.observer.snapshot()
        r.final_at = time.monotonic()
        r.observer.shutdown(5)
    if pending is not None and pending.error is None and not pending.done.is_set():
        _finish_draft_head(pending)
    _join_demo_threads(r.args.device, before=r.threads_before)
    if pending is not None and pending.done.is_set() and not pending.stopped:
        if pending.error is None:
            say(f"draft head trained and cached in {pending.path}")
        else:
            say(f"draft head training failed ({pending.error!r}); the next start retries")


def _finish_draft_head(pending: Any) -> None:
    """Nothing else runs now, so the rest is quick; without it the next start would train
    everything again. Ctrl-C skips it."""
    say(f"finishing the draft head's training ({pending.step}/{pending.total} steps) so "
        "that the next start loads it; Ctrl-C skips")
    t_join, step0 = time.monotonic(), pending.step
    try:
        while not pending.join(PLAIN_INTERVAL_SECONDS):
            spent = time.monotonic() - t_join
            rate = (pending.step - step0) / spent
            left = (f", about {(pending.total - pending.step) / rate:.0f} s left"
                    if rate > 0 else "")
            say(f"  draft head: step {pending.step}/{pending.total}, {spent:.0f} s "
                f"elapsed{left}")
    except KeyboardInterrupt:
        pending.stop()
        pending.join(30)
        say("skipped: the next start trains afresh")
