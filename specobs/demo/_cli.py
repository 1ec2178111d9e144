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
import time
from typing import TYPE_CHECKING, Any

from specobs.tools._load import non_negative_int, positive_float, positive_int

from ._live import Stop, final_summary, summarize_live
from ._stages import (
    PLAIN_INTERVAL_SECONDS,
    SPECOBS_DEMO_ADMIN_TOKEN,
    DemoRun,
    fail,
    say,
    shut_down,
    start_serving,
)

if TYPE_CHECKING:
    from ._engine import SpecDecodeEngine

__all__ = ["add_arguments", "run"]

_FAULTS = ("none", "wrong-hidden-layers", "slow-verify", "stall", "sync-between-phases")
_ESTIMATE_WINDOW_SECONDS = 10.0
"""The training progress estimates what is left from the pace of this last stretch."""
_ESTIMATE_MIN_STEPS = 3
"""Steps timed in that stretch before there is an estimate."""


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


class _TrainingProgress:
    """Prints the target's training progress: steps, elapsed, and what is left (first at 5 s, then
    every ``PLAIN_INTERVAL_SECONDS``, and at the end).

    What is left is estimated from the pace of the last ``_ESTIMATE_WINDOW_SECONDS``, and only
    once ``_ESTIMATE_MIN_STEPS`` steps were timed in it. The first steps pay torch's warm-up and
    are many times slower than the rest, so an estimate from the start would overstate what is
    left several times over, and still a minute in."""

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
        self._next = elapsed + PLAIN_INTERVAL_SECONDS
        since_step, since = recent[0]
        more = ""
        if step < total and step - since_step >= _ESTIMATE_MIN_STEPS:
            pace = (elapsed - since) / (step - since_step)
            more = f", about {pace * (total - step):.0f} s left"
        say(f"  training the target: step {step}/{total}, {elapsed:.0f} s elapsed{more}")


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

    r = DemoRun(args)
    interrupted = False
    try:
        r.engine = _load_models(args)
        where = start_serving(r, admin_token, limits)
        if isinstance(where, int):
            return where
        summarize_live(r, where, live=sys.stdout.isatty() and not args.plain)
    except Stop:
        pass
    except KeyboardInterrupt:
        interrupted = True
    finally:
        shut_down(r)
    return final_summary(r, interrupted)


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
        return fail(f"{exc}. Install the demo's dependencies: pip install 'specobs[demo]'")

    from ._server import ServerLimits, admin_token_problem

    admin_token = _admin_token(args)
    problem = None if admin_token is None else admin_token_problem(admin_token)
    if problem is not None:
        source = "--admin-token" if args.admin_token is not None else SPECOBS_DEMO_ADMIN_TOKEN
        return fail(f"{source} {problem}", code=2)
    limits = ServerLimits(max_body_bytes=args.max_request_bytes, max_requests=args.max_requests,
                          read_timeout_seconds=args.read_timeout)
    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda was asked for, but torch sees no CUDA device "
                    f"(torch {torch.__version__}); run with --device cpu", code=2)
    if args.metrics_port is None:
        from specobs import ConfigurationError

        try:
            _env_metrics_port()
        except ConfigurationError as exc:
            return fail(f"cannot start the specobs exporter: {exc}", code=2)
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

        say("loading the demo target and draft head shipped with specobs"
            if found.parent == SHIPPED_DIR
            else "loading the demo target and draft head from the weight cache")
    else:
        # The times said here are the measured ones of benchmarks/RESULTS.md.
        say("first run: training the demo target (30-45 s on 2 idle CPU cores, minutes on "
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
    # Name what took the time, and only that: a line that named the draft head beside the time
    # read as if the draft head would take it.
    done = (f"models loaded in {took:.1f} s" if engine.models.from_cache
            else f"target trained in {took:.1f} s, the draft head trains next while the "
                 "demo serves" if pending is not None
            else f"models trained and cached in {took:.1f} s")  # fmt: skip
    say(f"{done} (target {engine.config.n_layers} layers d_model {engine.config.d_model}, "
        f"vocab {engine.config.vocab_size}, draft reads layers {engine.layer_ids}, "
        f"k={args.k}, device {args.device})")
    return engine
