"""``specobs engines``: would specobs attach to the engines installed here, and what would it time?

    specobs engines                 # this environment: vLLM, SGLang, transformers
    specobs engines --path DIR      # a directory of unpacked packages (pip install --target DIR)
    specobs engines --points        # every hook point, not only the missing ones
    specobs engines --json          # machine-readable (schema below)

For each engine: the installed distribution and version, the floor and the tested range, each
declared hook point found or missing (read from the files with ``ast``; nothing is imported),
each speculative method or worker class supported or why not, and the verdict the instrumentor
would reach before patching. Exit status: 0 when every installed engine is attachable (an engine
that is not installed does not fail), 1 when one would be refused or is below its floor.

``--json`` prints one object; keys are stable (new keys may be added, none renamed)::

    {"schema": 1, "path": "DIR" | null, "ok": bool,
     "engines": [{
        "engine": "vLLM", "distribution": "vllm" | null, "version": "0.34.0" | null,
        "floor": "0.11", "tested_below": "0.35", "tested": ">= 0.11, < 0.35",
        "verdict": "not_installed" | "below_floor" | "attachable" | "attachable_untested"
                   | "refused",
        "attachable": bool, "message": str, "problems": [str],
        "variants": [{"name": str, "requirement": "required" | "where present"
                      | "informational", "present": bool, "complete": bool,
                      "required": bool, "description": str}],
        "hook_points": [{"name": "module.Class.method", "variant": str,
                         "status": "found" | "missing" | "missing_optional" | "absent",
                         "required": bool, "missing": [str], "where": "file:line" | ""}],
        "methods": [{"name": str, "status": "supported" | "unsupported" | "absent",
                     "reason": str, "variants": [str], "description": str}]}]}
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specobs.instrument._contract import EngineReport

__all__ = ["add_arguments", "run"]

SCHEMA = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs engines``."""
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (schema in specobs/tools/_engines.py)")
    parser.add_argument("--path", type=Path, default=None, metavar="DIR",
                        help="read the engines from DIR (unpacked packages, e.g. pip install "
                             "--no-deps --target DIR) instead of this environment")
    parser.add_argument("--points", action="store_true",
                        help="list every hook point, not only those missing")


def run(args: argparse.Namespace) -> int:
    """``specobs engines``."""
    from specobs.instrument import _support

    if args.path is not None and not args.path.is_dir():
        print(f"specobs engines: --path {args.path} is not a directory", file=sys.stderr)
        return 2
    reports = _support.reports(None if args.path is None else [args.path])
    ok = all(r.attachable for r in reports if r.installed is not None)
    if args.json:
        print(json.dumps({
            "schema": SCHEMA, "path": None if args.path is None else str(args.path), "ok": ok,
            "engines": [as_json(r) for r in reports],
        }, indent=2, sort_keys=True))
    else:
        print(render(reports, points=args.points))
    return 0 if ok else 1


def as_json(report: EngineReport) -> dict[str, Any]:
    """One engine's report as the ``engines[]`` entry of ``--json``."""
    package = report.contract.package
    installed = report.installed
    return {
        "engine": report.contract.engine,
        "distribution": None if installed is None else installed.distribution,
        "version": None if installed is None else installed.version,
        "floor": package.minimum,
        "tested_below": package.tested_below,
        "tested": package.tested_range,
        "verdict": report.verdict,
        "attachable": report.attachable,
        "message": report.message(),
        "problems": list(report.problems),
        "variants": [{
            "name": v.variant.name, "requirement": v.variant.requirement,
            "present": v.present, "complete": v.complete, "required": v.required,
            "description": v.variant.description,
        } for v in report.variants],
        "hook_points": [{
            "name": p.point.name, "variant": p.variant, "status": p.status,
            "required": p.required, "missing": list(p.missing), "where": p.where,
        } for p in report.points],
        "methods": [{
            "name": m.method.name, "status": m.status, "reason": m.reason,
            "variants": list(m.method.variants), "description": m.method.description,
        } for m in report.methods],
    }


_VERDICTS = {
    "not_installed": "not installed",
    "below_floor": "REFUSED: below the floor",
    "attachable": "attachable",
    "attachable_untested": "attachable (newer than tested: one warning)",
    "refused": "REFUSED: hook points missing",
}


def _table(rows: Sequence[tuple[str, ...]], indent: str = "") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def render(reports: list[EngineReport], *, points: bool = False) -> str:
    """The terminal view: one summary table, then per installed engine its variants, missing
    points (every point with ``points``) and methods."""
    rows: list[tuple[str, ...]] = [("engine", "installed", "floor", "tested", "verdict")]
    for r in reports:
        installed = ("-" if r.installed is None
                     else f"{r.installed.distribution} {r.installed.version}")
        rows.append((r.contract.engine, installed, r.contract.package.minimum,
                     r.contract.package.tested_range, _VERDICTS[r.verdict]))
    lines = _table(rows)
    for r in reports:
        if r.installed is None:
            continue
        lines += ["", f"{r.contract.engine} {r.installed.version}"]
        if r.variants:
            variant_rows: list[tuple[str, ...]] = [("variant", "points", "state")]
            for v in r.variants:
                mine = [p for p in r.points if p.variant == v.variant.name]
                found = sum(p.found for p in mine)
                state = ("complete" if v.complete else "not in this release" if not v.present
                         else "INCOMPLETE" if v.required else "incomplete (not required)")
                variant_rows.append((v.variant.name, f"{found}/{len(mine)}", state))
            lines += _table(variant_rows, "  ")
        shown = r.points if points else [p for p in r.points if p.status.startswith("missing")]
        if shown:
            lines.append("  hook points:" if points else "  missing hook points:")
            lines += _table([(p.status, p.point.name, "; ".join(p.missing) or p.where)
                             for p in shown], "    ")
        supported = [m.method.name for m in r.methods if m.status == "supported"]
        if supported:
            lines.append(f"  supported: {', '.join(supported)}")
        for m in r.methods:
            if m.status == "unsupported":
                lines.append(f"  not timed: {m.method.name}: {m.reason}")
        if r.verdict not in ("attachable",):
            lines.append(f"  {r.message()}")
    return "\n".join(lines)
