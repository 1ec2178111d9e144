"""The ``specobs`` command.

    specobs demo      a real speculative decoding engine + load + exporter + live summary
    specobs load      load generator for any OpenAI-style completions endpoint
    specobs generate  dashboards, rules and docs from the metric catalog (--check: drift test)
    specobs top URL   live cycle breakdown from a specobs /metrics endpoint
    specobs doctor URL  one-shot health check of an endpoint
    specobs report    a self-contained HTML report of a run, or an A/B comparison of two
    specobs fleet-sim N simulated servers' /metrics with injected faults (monitoring load tests)

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) ->
int``; a module is imported only when its subcommand runs (or for ``--help``), so ``specobs
generate`` never imports torch. Bad flags print a clear message and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("specobs.demo._cli", "run a real speculative decoding engine with load and a live "
             "cycle breakdown"),
    "load": ("specobs.demo._load", "generate load against an OpenAI-style /v1/completions "
             "endpoint"),
    "generate": ("specobs.cli", "write (or --check) dashboards, Prometheus rules and docs from "
                 "the metric catalog"),
    "top": ("specobs.tools._top", "live cycle breakdown from a specobs /metrics endpoint or a "
            "Prometheus server"),
    "doctor": ("specobs.tools._doctor", "one-shot health check of a specobs /metrics endpoint"),
    "fleet-sim": ("specobs.tools._fleet", "serve N simulated servers' /metrics with injected "
                  "faults, to load-test monitoring (loopback only)"),
    "report": ("specobs.tools._report", "a self-contained HTML report of a run (live endpoint, "
               "snapshot file or Prometheus range), or --compare two"),
}


# -- generate -------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs generate``."""
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if any generated file differs from the "
                             "committed one")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="repository root to write into (default: current directory)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="override a MixinConfig field, e.g. --set rate_window=2m "
                             "--set trace_datasource_uid=tempo (repeatable)")


def _coerce(field: dataclasses.Field[Any], raw: str) -> Any:
    current = field.default
    if isinstance(current, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    if isinstance(current, int):
        return int(raw)
    if isinstance(current, float):
        return float(raw)
    if isinstance(current, tuple):
        return tuple(x.strip() for x in raw.split(",") if x.strip())
    if current is None and raw.lower() in ("", "none"):
        return None
    return raw


def run(args: argparse.Namespace) -> int:
    """``specobs generate``."""
    try:
        from specobs.mixin import MixinConfig, check_all, write_all
    except ImportError as exc:
        print(f"specobs generate: {exc}", file=sys.stderr)
        return 1
    fields = {f.name: f for f in dataclasses.fields(MixinConfig)}
    values: dict[str, Any] = {}
    for item in args.overrides:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            known = ", ".join(sorted(fields))
            print(f"specobs generate: --set expects FIELD=VALUE with FIELD one of: {known}; "
                  f"got {item!r}", file=sys.stderr)
            return 2
        try:
            values[name] = _coerce(fields[name], raw)
        except ValueError:
            print(f"specobs generate: --set {name}: cannot read {raw!r} as "
                  f"{type(fields[name].default).__name__}", file=sys.stderr)
            return 2
    try:
        config = MixinConfig(**values)
    except ValueError as exc:
        print(f"specobs generate: {exc}", file=sys.stderr)
        return 2
    if args.check:
        drifted = check_all(args.root, config)
        if drifted:
            print("These generated files are out of date:\n  " + "\n  ".join(drifted)
                  + "\nRegenerate them with: specobs generate", file=sys.stderr)
            return 1
        print("generated files are up to date")
        return 0
    changed = write_all(args.root, config)
    for path in changed:
        print(f"wrote {path}")
    if not changed:
        print("generated files were already up to date")
    return 0


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
