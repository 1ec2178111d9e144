"""``specobs demo``: a real speculative decoding engine, its HTTP server, load and a live summary.

    specobs demo                       # CPU, until Ctrl-C; completions on :8000, metrics on :9477
    specobs demo --duration 60 --plain
    specobs demo --device cuda --fault wrong-hidden-layers

Start-up: load the demo target and its EAGLE-3-style draft head from the weight cache. On the first
run, train the target, then serve at once while the draft head trains in the background (the engine
takes its weights every few steps, so acceptance climbs over the first minute; at shutdown an
unfinished training is completed and everything is cached). Configure specobs (Prometheus
endpoint on ``--metrics-port``, plus OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set or
``SPECOBS_EXPORTERS`` lists otlp; series labelled ``model_name`` and ``serving_engine``, as the
generated dashboards and rules expect); serve ``/v1/completions`` on ``--host:--port``; run
``--concurrency`` load workers against it. Then a live summary (rich on a terminal; a line every
few seconds otherwise) until Ctrl-C or ``--duration``, a clean shutdown and a final summary. Exit
status 0; 1 when start-up fails (a port taken, say); 2 for bad flags.

The realized speedup's baseline -- the non-speculative decode speed of one sequence -- is measured
while serving, unless ``--baseline-tokens-per-second`` or ``SPECOBS_BASELINE_TOKENS_PER_SECOND``
gives one: every 16th cycle the engine thread runs one plain decode step of the batch it serves
(:mod:`specobs.demo._baseline`), so the baseline has the batch size, the machine and the load of
the speculative cycles it is compared with. The Prometheus endpoint exports it with
``source="demo_measured"``; a given baseline has no ``source`` label (the rules call it
``configured``). The measured baseline is not sent by OTLP.

The completions server refuses bodies over ``--max-request-bytes`` (413), more than
``--max-requests`` completions in flight (429 with ``Retry-After``), and clients slower than
``--read-timeout`` to send their headers or body. ``POST /admin/fault`` (switching faults at run
time) is off unless an admin token is given, by ``--admin-token`` or, better, since a command line
is visible to every local user, by ``SPECOBS_DEMO_ADMIN_TOKEN``; callers then send
``Authorization: Bearer <token>``.

Only argparse and the standard library are imported until the command runs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from specobs.tools._load import non_negative_int, positive_float, positive_int

if TYPE_CHECKING:
    from specobs import Observer, PrometheusSink
    from specobs.tools._load import LoadSummary

    from ._baseline import BaselineProbe
    from ._engine import SpecDecodeEngine

__all__ = ["add_arguments", "run"]

_PROG = "specobs demo"

SPECOBS_DEMO_ADMIN_TOKEN = "SPECOBS_DEMO_ADMIN_TOKEN"
"""Turns the demo server's ``/admin/*`` endpoints on, behind this token (``Authorization: Bearer
<token>``; at least 16 characters). Unset or empty: the endpoints are off. ``--admin-token``
overrides it."""
_FAULTS = ("none", "wrong-hidden-layers", "slow-verify", "stall", "sync-between-phases")
_PLAIN_INTERVAL_SECONDS = 5.0
_LIVE_INTERVAL_SECONDS = 1.0
_BASELINE_EVERY_CYCLES = 16
_BASELINE_WINDOW_SECONDS = 60.0
#: Constant labels of the demo's series: the names the generated rules and dashboards group by
#: (``MixinConfig.model_label`` / ``engine_label``); vLLM's own ``engine`` label is an index.
DEMO_LABELS = {"model_name": "specobs-demo", "serving_engine": "specobs-demo"}
_ESTIMATE_WINDOW_SECONDS = 10.0
"""The training progress estimates what is left from the pace of this last stretch."""
_ESTIMATE_MIN_STEPS = 3
"""Steps timed in that stretch before there is an estimate."""
_FIRST_PLAIN_SECONDS = 2.0
"""Plain output shows the first cycle breakdown this soon after serving starts, then every
``_PLAIN_INTERVAL_SECONDS``."""


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {value}")
    return value


def _env_metrics_port() -> int | None:
    """``SPECOBS_PROMETHEUS_PORT`` if set; a bad value raises ``ConfigurationError`` naming the
    variable (it used to be ignored, and the demo bound 9477 without a word)."""
    raw = os.environ.get("SPECOBS_PROMETHEUS_PORT")
    if raw is None or not raw.strip():
        return None
    from specobs._config import prometheus_port

    return prometheus_port()


def _byte_size(raw: str) -> int:
    from specobs.tools._client import parse_byte_size

    try:
        return parse_byte_size(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _admin_token(args: argparse.Namespace) -> str | None:
    """The flag, else the environment variable; ``None`` (admin off) when both are empty."""
    raw = args.admin_token if args.admin_token is not None else os.environ.get(
        SPECOBS_DEMO_ADMIN_TOKEN, "")
    return raw.strip() or None


def _k(raw: str) -> int:
    value = positive_int(raw)
    if value > 16:
        raise argparse.ArgumentTypeError(f"expected a draft length 1..16, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs demo``."""
    parser.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                        help="stop after this many seconds (default: run until Ctrl-C)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of the completions server (default 127.0.0.1; 0.0.0.0 "
                             "to serve other machines)")
    parser.add_argument("--port", type=_port, default=8000,
                        help="port of the OpenAI-style completions server (default 8000)")
    parser.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                        help="port of the specobs Prometheus endpoint (default "
                             "$SPECOBS_PROMETHEUS_PORT or 9477; its address is "
                             "$SPECOBS_PROMETHEUS_ADDR or 127.0.0.1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run (default cpu; cuda needs a CUDA device)")
    parser.add_argument("--k", type=_k, default=4, metavar="K",
                        help="draft tokens proposed per cycle (default 4)")
    parser.add_argument("--max-batch", type=positive_int, default=8, metavar="N",
                        help="sequences decoded together at most (default 8)")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                        help="built-in load: requests in flight (default 4)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, metavar="N",
                        help="built-in load: max_tokens per request (default 64)")
    parser.add_argument("--no-load", action="store_true",
                        help="do not run the built-in load (send your own, e.g. specobs load)")
    parser.add_argument("--fault", choices=_FAULTS, default="none",
                        help="fault to start with (switch at run time with POST /admin/fault, "
                             "which needs an admin token)")
    parser.add_argument("--admin-token", default=None, metavar="TOKEN",
                        help="serve /admin/fault to callers sending 'Authorization: Bearer "
                             "TOKEN' (at least 16 characters; default "
                             f"${SPECOBS_DEMO_ADMIN_TOKEN}, which other local users cannot read "
                             "as they can a flag; unset: no admin endpoints)")
    parser.add_argument("--max-request-bytes", type=_byte_size, default=1024 * 1024,
                        metavar="SIZE",
                        help="largest request body the completions server reads; more is "
                             "answered 413 (default 1MiB)")
    parser.add_argument("--max-requests", type=positive_int, default=64, metavar="N",
                        help="completions in flight at most (running or waiting); more are "
                             "answered 429 with Retry-After (default 64)")
    parser.add_argument("--read-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                        help="seconds a client has to send a request's headers, and again its "
                             "body, before it is dropped (default 10)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="where trained weights are cached (default $SPECOBS_CACHE_DIR, "
                             "$XDG_CACHE_HOME/specobs or ~/.cache/specobs)")
    # _train.DEFAULT_SEED (not imported here: it needs torch); tests/test_demo_cli.py checks.
    parser.add_argument("--seed", type=non_negative_int, default=7,
                        help="seed of training and load (default 7, the models that ship with "
                             "specobs; another seed trains on the first run)")
    parser.add_argument("--quick-train", action="store_true",
                        help="train with fewer steps on the first run (faster, somewhat lower "
                             "acceptance; cached separately)")
    parser.add_argument("--baseline-tokens-per-second", type=positive_float, default=None,
                        metavar="TPS",
                        help="non-speculative decode speed of one sequence (default "
                             "$SPECOBS_BASELINE_TOKENS_PER_SECOND, else measured while serving: "
                             "a plain decode step of the served batch every 16th cycle)")
    parser.add_argument("--plain", action="store_true",
                        help="print a line every few seconds instead of the live view (the "
                             "default when stdout is not a terminal)")


class _Stop(Exception):
    pass


class _TrainingProgress:
    """Prints the target's training progress: steps, elapsed, and what is left (first at 5 s, then
    every ``_PLAIN_INTERVAL_SECONDS``, and at the end).

    What is left is estimated from the pace of the last ``_ESTIMATE_WINDOW_SECONDS``, and only
    once ``_ESTIMATE_MIN_STEPS`` steps were timed in it. The first steps pay torch's warm-up: on
    a loaded 2-core machine the first three took 19 s and the rest 0.35 s each, so an estimate
    from the start read "about 2218 s left" at step 1 of a run that took 332 s, and still twice
    the truth a minute in."""

    def __init__(self) -> None:
        self._next = 5.0
        self._recent: collections.deque[tuple[int, float]] = collections.deque()

    def __call__(self, step: int, total: int, elapsed: float) -> None:
        recent = self._recent
        recent.append((step, elapsed))
        while len(recent) > 1 and elapsed - recent[0][1] > _ESTIMATE_WINDOW_SECONDS:
            recent.popleft()
        if elapsed < self._next and step < total:
            return
        self._next = elapsed + _PLAIN_INTERVAL_SECONDS
        since_step, since = recent[0]
        more = ""
        if step < total and step - since_step >= _ESTIMATE_MIN_STEPS:
            pace = (elapsed - since) / (step - since_step)
            more = f", about {pace * (total - step):.0f} s left"
        _say(f"  training the target: step {step}/{total}, {elapsed:.0f} s elapsed{more}")


def _say(text: str) -> None:
    print(text, flush=True)


def _fail(text: str, code: int = 1) -> int:
    print(f"{_PROG}: {text}", file=sys.stderr, flush=True)
    return code


def _train_settings(quick: bool) -> Any:
    from specobs.demo import TrainSettings

    if not quick:
        return None
    return TrainSettings(target_steps=220, draft_steps=150, distill_sequences=128)


def _weights_found(cache_dir: str | None, seed: int, settings: Any) -> Any:
    """The file the models load from without training (the cache's or the shipped one), or
    ``None`` when they train."""
    from specobs.demo import DraftConfig, TargetConfig
    from specobs.demo._train import find_weights

    target = TargetConfig()
    return find_weights(cache_dir, target, DraftConfig.for_target(target), seed, settings)


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


def _training_text(engine: Any) -> str:
    """The draft head's training while it runs in the background (or how it ended badly);
    empty once it trained, or with the shipped weights."""
    pending = getattr(getattr(engine, "models", None), "pending", None)
    if pending is None or (pending.done.is_set() and pending.error is None):
        return ""
    return str(pending.status())


def _requests_text(engine: Any, load: Any) -> str:
    s = engine.stats()
    text = f"{s.active} running, {s.waiting} waiting, {s.requests_finished} finished"
    if load is not None:
        text += f"; load {load.requests_ok} ok, {load.requests_failed} failed"
        if load.errors:
            text += " (" + ", ".join(f"{k} {v}" for k, v in load.errors.most_common(3)) + ")"
    return text


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
        print(f"{_PROG}: threads still running at exit: {', '.join(left)}", file=sys.stderr,
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
    _say("the non-speculative baseline is measured while serving: a plain decode step "
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
            print(f"{_PROG}: built-in load stopped: {exc!r}", file=sys.stderr)

    thread = threading.Thread(target=load_main, name="specobs-demo-load", daemon=True)
    thread.start()
    return thread


class _Run:
    """One ``specobs demo`` run's parts, started stage by stage by :func:`run`;
    :func:`_shut_down` stops those that were started."""

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


def run(args: argparse.Namespace) -> int:
    """``specobs demo``: checks, models, serving, the live summary, shutdown, final summary."""
    checked = _preflight(args)
    if isinstance(checked, int):
        return checked
    admin_token, limits = checked

    # SIGTERM (docker stop, a supervisor) shuts down as cleanly as Ctrl-C.
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread (tests calling run())
        signal.signal(signal.SIGTERM, on_term)

    r = _Run(args)
    interrupted = False
    try:
        r.engine = _load_models(args)
        where = _start_serving(r, admin_token, limits)
        if isinstance(where, int):
            return where
        _summarize_live(r, where, live=sys.stdout.isatty() and not args.plain)
    except _Stop:
        pass
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _shut_down(r)
    return _final_summary(r, interrupted)


def _preflight(args: argparse.Namespace) -> tuple[str | None, Any] | int:
    """What is checked before minutes of loading or training: the demo's dependencies, the admin
    token, the device and the metrics port. (admin token, server limits), or an exit status."""
    try:
        import torch

        import specobs  # noqa: F401
        from specobs.demo import build_engine  # noqa: F401
        from specobs.tools._load import LoadSummary  # noqa: F401

        from . import _summary  # noqa: F401
        from ._server import ServerThread, create_app  # noqa: F401
    except ImportError as exc:
        return _fail(f"{exc}. Install the demo's dependencies: pip install 'specobs[demo]'")

    from ._server import ServerLimits, admin_token_problem

    admin_token = _admin_token(args)
    problem = None if admin_token is None else admin_token_problem(admin_token)
    if problem is not None:
        source = "--admin-token" if args.admin_token is not None else SPECOBS_DEMO_ADMIN_TOKEN
        return _fail(f"{source} {problem}", code=2)
    limits = ServerLimits(max_body_bytes=args.max_request_bytes, max_requests=args.max_requests,
                          read_timeout_seconds=args.read_timeout)
    if args.device == "cuda" and not torch.cuda.is_available():
        return _fail("--device cuda was asked for, but torch sees no CUDA device "
                     f"(torch {torch.__version__}); run with --device cpu", code=2)
    if args.metrics_port is None:
        from specobs import ConfigurationError

        try:
            _env_metrics_port()
        except ConfigurationError as exc:
            return _fail(f"cannot start the specobs exporter: {exc}", code=2)
    return admin_token, limits


def _load_models(args: argparse.Namespace) -> SpecDecodeEngine:
    """The engine with the demo's target and draft head: from the shipped weights or the cache,
    or, on a first run, the target trained now and the draft head left to train while serving."""
    from specobs.demo import build_engine

    from ._train import target_progress

    settings = _train_settings(args.quick_train)
    found = _weights_found(args.cache_dir, args.seed, settings)
    if found is not None:
        from ._train import SHIPPED_DIR

        _say("loading the demo target and draft head shipped with specobs"
             if found.parent == SHIPPED_DIR
             else "loading the demo target and draft head from the weight cache")
    else:
        # Measured on 2 vCPUs: target 30-48 s idle, 127-475 s with both cores busy; draft
        # head 28-33 s idle (benchmarks/RESULTS.md).
        _say("first run: training the demo target (30-45 s on 2 idle CPU cores, minutes on "
             "busy ones, 10 s on 16); the draft head then trains in the background while "
             "the demo serves, so acceptance climbs during the first minute (weights cached "
             "afterwards)")
    t0 = time.perf_counter()
    with target_progress(_TrainingProgress()):
        engine: SpecDecodeEngine = build_engine(
            device=args.device, k=args.k, seed=args.seed, cache_dir=args.cache_dir,
            max_batch=args.max_batch, train_settings=settings, draft_in_background=True,
        )  # fmt: skip
    pending = engine.models.pending
    took = time.perf_counter() - t0
    # What took the time, and only that: "models target trained, draft head to train in
    # 332.9 s" read as if the draft head would take 332.9 s.
    done = (f"models loaded in {took:.1f} s" if engine.models.from_cache
            else f"target trained in {took:.1f} s, the draft head trains next while the "
                 "demo serves" if pending is not None
            else f"models trained and cached in {took:.1f} s")  # fmt: skip
    _say(f"{done} (target {engine.config.n_layers} layers d_model {engine.config.d_model}, "
         f"vocab {engine.config.vocab_size}, draft reads layers {engine.layer_ids}, "
         f"k={args.k}, device {args.device})")
    return engine


def _start_serving(r: _Run, admin_token: str | None, limits: Any) -> list[str] | int:
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
            return _fail(f"cannot serve specobs metrics on port {args.metrics_port}: "
                         f"{bind.strerror or bind}; pick another --metrics-port (0: any "
                         "free port)")
        return _fail(f"cannot start the specobs exporter: {exc}")
    engine.observer = r.observer
    if args.fault != "none":
        engine.fault = args.fault
    engine.start()
    pending = engine.models.pending
    if pending is not None:
        pending.start(engine.load_draft_state)
        _say(f"draft head training in the background ({pending.total} steps; the engine "
             f"takes its weights every {pending.publish_every} steps)")

    app = create_app(engine, r.observer, admin_token=admin_token, limits=limits)
    try:
        r.server = ServerThread(app, args.host, args.port, limits=limits).start()
    except OSError as exc:
        return _fail(f"cannot serve completions on {args.host}:{args.port}: "
                     f"{exc.strerror or exc}; pick another --port")
    prom = r.prom
    metrics_url = prom.url if prom is not None else None
    target = None
    if prom is not None:
        host = "127.0.0.1" if prom.addr in ("0.0.0.0", "", "::") else prom.addr
        target = f"{host}:{prom.port}"
    where = _summary.where_lines(metrics_url, r.server.url, target,
                                 admin=admin_token is not None)
    _say(f"serving completions on {r.server.url}/v1/completions")
    _say(f"admin endpoints on {r.server.url}/admin/fault (Authorization: Bearer <token>)"
         if admin_token is not None else
         f"admin endpoints off (--admin-token or {SPECOBS_DEMO_ADMIN_TOKEN} turns them on)")
    if metrics_url:
        _say(f"specobs metrics on {metrics_url}")

    if not args.no_load:
        r.load_summary = LoadSummary(r.server.url)
        r.load_thread = _start_load(args, engine, r.server.url, r.load_summary, r.load_stop)
    return where


def _summarize_live(r: _Run, where: list[str], *, live: bool) -> None:
    """The summary while serving: a rich view on a terminal, a line every few seconds
    otherwise, of the rates over the last few seconds; until ``--duration`` has passed
    (:class:`_Stop`) or Ctrl-C (``KeyboardInterrupt``)."""
    from . import _summary

    args, engine, observer = r.args, r.engine, r.observer
    assert engine is not None and observer is not None
    # --duration counts from here: serving and load, not start-up.
    r.first = first = observer.snapshot()
    r.first_at = first_at = time.monotonic()
    deadline = None if args.duration is None else first_at + args.duration
    title = (f"specobs demo — {args.device}, k={args.k}, max batch {args.max_batch}"
             + ("" if args.duration is None else f", {args.duration:g} s")
             + " — Ctrl-C stops")
    if not live:
        for line in where:
            _say(line)

    def wait_until(t: float) -> None:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise _Stop
            if now >= t:
                return
            time.sleep(min(0.2, t - now))

    # Rates over the last few seconds: steady, yet current after a fault switch.
    history: collections.deque[tuple[float, Any]] = collections.deque([(first_at, first)])
    window = 5.0
    interval = _LIVE_INTERVAL_SECONDS if live else _PLAIN_INTERVAL_SECONDS

    def frame() -> tuple[Any, str, str]:
        snap, now = observer.snapshot(), time.monotonic()
        while len(history) > 1 and now - history[1][0] >= window:
            history.popleft()
        then, old = history[0]
        history.append((now, snap))
        view = _summary.compute_view(snap, old, now - then, r.baseline())
        return view, _requests_text(engine, r.load_summary), _training_text(engine)

    next_at = first_at
    if live:
        from rich.live import Live

        with Live(refresh_per_second=4, transient=False) as view_live:
            while True:
                next_at += interval
                wait_until(next_at)
                view, requests, training = frame()
                view_live.update(_summary.render_rich(
                    view, title=title, fault=engine.fault, requests=requests, where=where,
                    baseline_note=r.baseline_note, training=training,
                ))  # fmt: skip
    else:
        next_at += min(_FIRST_PLAIN_SECONDS, interval) - interval
        while True:
            next_at += interval
            wait_until(next_at)
            view, requests, training = frame()
            _say(f"[{time.monotonic() - r.started:6.1f} s] " + _summary.plain_line(
                view, fault=engine.fault, requests=requests, training=training))


def _shut_down(r: _Run) -> None:
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
            _say(f"draft head trained and cached in {pending.path}")
        else:
            _say(f"draft head training failed ({pending.error!r}); the next start retries")


def _finish_draft_head(pending: Any) -> None:
    """Nothing else runs now, so the rest is quick; without it the next start would train
    everything again. Ctrl-C skips it."""
    _say(f"finishing the draft head's training ({pending.step}/{pending.total} steps) so "
         "that the next start loads it; Ctrl-C skips")
    t_join, step0 = time.monotonic(), pending.step
    try:
        while not pending.join(_PLAIN_INTERVAL_SECONDS):
            spent = time.monotonic() - t_join
            rate = (pending.step - step0) / spent
            left = (f", about {(pending.total - pending.step) / rate:.0f} s left"
                    if rate > 0 else "")
            _say(f"  draft head: step {pending.step}/{pending.total}, {spent:.0f} s "
                 f"elapsed{left}")
    except KeyboardInterrupt:
        pending.stop()
        pending.join(30)
        _say("skipped: the next start trains afresh")


def _final_summary(r: _Run, interrupted: bool) -> int:
    """The whole serving window's summary, and the exit status."""
    from . import _summary

    if r.final is None or r.engine is None or r.first is None:
        return 130 if interrupted else 1
    seconds = r.final_at - r.first_at
    view = _summary.compute_view(r.final, r.first, seconds, r.baseline())
    _say("")
    for line in _summary.final_lines(
        view, seconds=seconds, fault=r.engine.fault, baseline_note=r.baseline_note,
        requests=_requests_text(r.engine, r.load_summary),
    ):  # fmt: skip
        _say(line)
    if interrupted:
        _say("stopped by Ctrl-C")
    return 0
