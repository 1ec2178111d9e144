"""The ``specobs`` command.

    specobs demo      a real speculative decoding engine + load + exporter + live summary
    specobs load      load generator for any OpenAI-style completions endpoint
    specobs generate  dashboards, rules and docs from the metric catalog (--check: drift test)
    specobs top URL   live cycle breakdown from a specobs /metrics endpoint
    specobs doctor URL  one-shot health check of an endpoint
    specobs advise URL  a k for each band of batch sizes, in the engine's configuration
    specobs report    a self-contained HTML report of a run, or an A/B comparison of two
    specobs fleet-sim N simulated servers' /metrics with injected faults (monitoring load tests)
    specobs engines   would specobs attach to the installed vLLM, SGLang, transformers

This module is only the dispatcher. Each subcommand lives in its own module exposing
``add_arguments(parser)`` and ``run(args) -> int`` (:mod:`specobs.demo._cli` for ``demo``, the
rest in :mod:`specobs.tools`); a module is imported only when its subcommand runs (or for
``--help``), so ``specobs generate`` never imports torch. Bad flags print a clear message and
exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("specobs.demo._cli", "run a real speculative decoding engine with load and a live "
             "cycle breakdown"),
    "load": ("specobs.tools._load", "generate load against an OpenAI-style /v1/completions "
             "endpoint"),
    "generate": ("specobs.tools._generate", "write (or --check) dashboards, Prometheus rules "
                 "and docs from the metric catalog"),
    "top": ("specobs.tools._top", "live cycle breakdown from a specobs /metrics endpoint or a "
            "Prometheus server"),
    "doctor": ("specobs.tools._doctor", "one-shot health check of a specobs /metrics endpoint"),
    "advise": ("specobs.tools._advise", "the speculation length for each band of batch sizes, "
               "as the engine's own configuration, from what a server measured"),
    "fleet-sim": ("specobs.tools.fleet", "serve N simulated servers' /metrics with injected "
                  "faults, to load-test monitoring (loopback only)"),
    "report": ("specobs.tools.report", "a self-contained HTML report of a run (live endpoint, "
               "snapshot file or Prometheus range), or --compare two"),
    "engines": ("specobs.tools._engines", "check the installed vLLM, SGLang and transformers "
                "against specobs's hook tables: would it attach, what would it time"),
}


# -- entry point ---------------------------------------------------------------------------------

def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    from specobs import __version__

    parser = argparse.ArgumentParser(
        prog="specobs",
        description="Observability for speculative decoding: GPU-true draft/verify/bookkeeping "
                    "timing, acceptance, Prometheus and OTLP export.",
    )
    parser.add_argument("--version", action="version", version=f"specobs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name != only:
            continue
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module (first non-option argument).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    only = chosen if chosen in _SUBCOMMANDS else None
    try:
        parser = build_parser(only)
    except ImportError as exc:
        print(f"specobs {only}: {exc}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
