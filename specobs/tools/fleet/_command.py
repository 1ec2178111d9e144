"""``specobs fleet-sim``: the command (its flags, serving the fleet, the ``--score`` step)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
import time
from pathlib import Path

from specobs import MissingDependencyError
from specobs.tools import _client
from specobs.tools import _promapi as pa
from specobs.tools.fleet._mix import DEFAULT_MIX, MixError, describe_layout, kinds, parse_mix
from specobs.tools.fleet._schedule import ScheduleError, load_schedule
from specobs.tools.fleet._score import (
    fault_events,
    firing_from_vector,
    first_firing_query,
    score,
    score_table,
)
from specobs.tools.fleet._sim import MODELS, Fleet

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs fleet-sim``."""
    parser.add_argument("--servers", type=int, default=100, help="simulated servers (default 100)")
    parser.add_argument("--addr", default="127.0.0.1",
                        help="loopback address to serve on (default 127.0.0.1; only 127.0.0.0/8 "
                             "and ::1 are accepted)")
    parser.add_argument("--port", type=int, default=9470, help="port (default 9470; 0: any free)")
    parser.add_argument("--targets-file", type=Path, default=Path("fleet-sim-targets.json"),
                        help="Prometheus file_sd target file to write (default "
                             "fleet-sim-targets.json)")
    parser.add_argument("--events-file", type=Path, default=None,
                        help="append faults, restarts and rollouts here as JSON lines (for "
                             "scoring alerts)")
    parser.add_argument("--schedule", type=Path, default=None,
                        help="fault schedule, YAML or JSON (see docs/deploy.md#sizing)")
    parser.add_argument("--fault", action="append", default=[], metavar="'KIND key=value ...'",
                        help="a fault, e.g. 'stall servers=3 at=90s' or 'bad_rollout "
                             "model=llama-3.1-8b at=3m factor=0.3' (repeatable)")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="seconds to run (default 0: until interrupted)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--clusters", type=int, default=2, choices=(1, 2),
                        help="clusters the fleet spans (default 2)")
    parser.add_argument("--models", type=int, default=len(MODELS),
                        choices=range(1, len(MODELS) + 1),
                        help=f"models the fleet serves, of {', '.join(m.name for m in MODELS)} "
                             f"(default {len(MODELS)}); fewer models, larger cohorts")
    parser.add_argument("--engines", default="plugin", metavar="KIND[:WEIGHT],...",
                        help="the fleet's mix of servers (default plugin): 'plugin' runs "
                             "specobs's plugin in vLLM or SGLang; 'vllm+plugin' and "
                             "'sglang+plugin' serve the plugin's endpoint and the engine's own "
                             "beside it; an engine name (" + ", ".join(
                                 k.name for k in kinds().values() if not k.plugin)
                             + ") serves only that engine's own series, on its own port and job "
                             "(the job is the engine's name). WEIGHT sets the ratio, e.g. "
                             "'vllm:2,sglang,plugin:3'; each kind's servers form one block of "
                             "indexes, in the order given. --score judges an engine-only "
                             "server's acceptance_collapse and bad_rollout only: its series "
                             "cannot show the other faults (docs/deploy.md, 'A fleet of mixed "
                             "engines')")
    parser.add_argument("--scrape-failure-ratio", type=float, default=0.002,
                        help="fraction of scrapes answered 503 at random (default 0.002)")
    parser.add_argument("--restarts-per-hour", type=float, default=0.2,
                        help="restarts per server per hour: counters reset (default 0.2)")
    parser.add_argument("--restart-downtime", type=float, default=10.0,
                        help="seconds a restarting server does not answer (default 10)")
    parser.add_argument("--score", metavar="PROMETHEUS_URL", default=None,
                        help="at the end of --duration, ask this Prometheus (which scrapes the "
                             "fleet and evaluates specobs's rules) when each alert fired, and "
                             "print every alert's precision and recall against the injected "
                             "faults")
    _client.add_limit_arguments(parser)


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def run(args: argparse.Namespace) -> int:
    """``specobs fleet-sim``."""
    if not 1 <= args.servers <= 100_000:
        print(f"specobs fleet-sim: --servers must be in 1..100000, got {args.servers}",
              file=sys.stderr)
        return 2
    if not _loopback(args.addr):
        print(f"specobs fleet-sim: --addr must be a loopback address (127.0.0.0/8 or ::1), got "
              f"{args.addr!r}: the simulator is for load-testing monitoring on one machine",
              file=sys.stderr)
        return 2
    for name in ("scrape_failure_ratio",):
        if not 0 <= getattr(args, name) < 1:
            print(f"specobs fleet-sim: --{name.replace('_', '-')} must be in [0, 1)",
                  file=sys.stderr)
            return 2
    if args.score is not None and not args.duration > 0:
        print("specobs fleet-sim: --score needs a --duration (the run it scores ends)",
              file=sys.stderr)
        return 2
    if args.restarts_per_hour < 0 or args.restart_downtime < 0:
        print("specobs fleet-sim: --restarts-per-hour and --restart-downtime must be >= 0",
              file=sys.stderr)
        return 2
    try:
        # The sink's module needs prometheus_client and says which extra installs it.
        import specobs.sinks.prometheus  # noqa: F401
    except MissingDependencyError as exc:
        print(f"specobs fleet-sim: {exc}", file=sys.stderr)
        return 1
    try:
        mix = parse_mix(args.engines)
        faults = load_schedule(args.schedule, args.fault, args.servers,
                               tuple(m.name for m in MODELS[: args.models]))
    except (MixError, ScheduleError) as exc:
        print(f"specobs fleet-sim: {exc}", file=sys.stderr)
        return 2
    fleet = Fleet(args.servers, faults, seed=args.seed,
                  scrape_failure_ratio=args.scrape_failure_ratio,
                  restarts_per_hour=args.restarts_per_hour,
                  restart_downtime_seconds=args.restart_downtime, clusters=args.clusters,
                  events_path=args.events_file, targets_path=args.targets_file, mix=mix,
                  models=args.models)

    def ready(f: Fleet) -> None:
        mixed = "" if mix == DEFAULT_MIX else (
            f" (servers {describe_layout(f.layout)}; an engine's own series at "
            "/s/<i>/r<gen>/<engine>/metrics)")
        print(f"specobs fleet-sim: {f.n} servers on http://{f.address}/s/<i>/r<gen>/metrics"
              f"{mixed}; targets in {args.targets_file} (file_sd); faults: "
              + ("; ".join(x.describe() for x in faults) or "none"), flush=True)

    try:
        asyncio.run(fleet.serve(args.addr, args.port, args.duration, ready))
    except OSError as exc:
        print(f"specobs fleet-sim: cannot serve on {args.addr}:{args.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    print(f"specobs fleet-sim: {fleet.scrapes} scrapes answered, {fleet.failed_scrapes} failed on "
          "purpose", flush=True)
    if args.score is not None:
        return _score(args, fleet)
    return 0


def _score(args: argparse.Namespace, fleet: Fleet) -> int:
    """The scoring step: alerts from Prometheus against the faults this run injected."""
    faults = fault_events(fleet.events)
    end = time.time()
    step = max(1.0, min(15.0, args.duration / 60))
    try:
        with _client.http_client(args) as client:
            result = pa.prom_query(client, args.score,
                                   first_firing_query(end - fleet.start_wall, step), at=end,
                                   limits=_client.limits_from(args))
    except _client.ScrapeError as exc:
        print(f"specobs fleet-sim: --score: {exc}", file=sys.stderr)
        return 1
    print(score_table(score(firing_from_vector(result), faults), faults), flush=True)
    return 0
