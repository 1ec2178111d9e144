"""``specobs generate``: write (or ``--check``) the generated files from the metric catalog.

    specobs generate [--root DIR] [--set FIELD=VALUE ...]
    specobs generate --check      # exit 1 if a committed file differs (scripts/check runs it)
    specobs generate --check --json   # the same, as {"check": true, "drifted": [...]}

Dashboards, Prometheus recording and alert rules, their promtool tests, docs/metrics.md, the
runbook and deploy/ all come from :func:`specobs.mixin.render_all` with a
:class:`specobs.mixin.MixinConfig`, whose fields ``--set`` overrides. The diagnosis's thresholds
table is a generated region of docs/diagnosis.md (:func:`_tools_regions`). grafanalib and pyyaml are
imported only when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs generate``."""
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if any generated file differs from the "
                             "committed one")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object: {"check": bool, "drifted": [...]} with '
                             '--check, else {"written": [...], "removed": [...]}')
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
        return _needs_extra(exc)
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
    try:
        return _render(args, config, check_all, write_all)
    except ImportError as exc:  # grafanalib and pyyaml are imported as rendering needs them
        return _needs_extra(exc)


def _needs_extra(exc: ImportError) -> int:
    """One line naming the extra, not a traceback (the rest of specobs runs without it)."""
    text = str(exc)
    if "specobs[gen]" not in text:  # the mixin's own message names it already
        text = (f"specobs generate needs the 'gen' extra (grafanalib, pyyaml): "
                f"pip install 'specobs[gen]'  (missing: {exc.name or text})")
    print(text, file=sys.stderr)
    return 1


def _tools_regions() -> dict[str, str]:
    """The regions the tools own in hand-written docs: path -> region, markers included. The
    mixin may not import the tools, so they are spliced here."""
    from specobs.tools._diagnosis import _thresholds

    return {_thresholds.DOC_PATH: _thresholds.doc_region()}


def _regions(root: Path, write: bool) -> list[str]:
    """The paths under ``root`` whose tools' region differs; rewritten when ``write``. A file
    that is not under ``root`` is skipped, as the mixin's regions are."""
    from specobs.mixin import _splice

    changed = []
    for relative, region in _tools_regions().items():
        path = root / relative
        if not path.exists():
            continue
        current = path.read_text(encoding="utf-8")
        spliced = _splice(current, region)
        if spliced is None:  # no markers yet: the region goes at the end
            spliced = current.rstrip("\n") + "\n\n" + region
        if spliced != current:
            changed.append(relative)
            if write:
                path.write_text(spliced, encoding="utf-8")
    return changed


def _render(args: argparse.Namespace, config: Any, check_all: Any, write_all: Any) -> int:
    if args.check:
        drifted = sorted({*check_all(args.root, config), *_regions(args.root, write=False)})
        if args.json:
            print(json.dumps({"check": True, "drifted": sorted(drifted)}))
            return 1 if drifted else 0
        if drifted:
            missing = {p for p in drifted if not (args.root / p).exists()}
            print("These generated files are out of date:\n  " + "\n  ".join(
                f"{p} (missing)" if p in missing else p for p in drifted)
                + "\nRegenerate them with: specobs generate", file=sys.stderr)
            if len(missing) == len(drifted):
                # Nothing generated under the root at all: most likely not a checkout's root.
                print(f"None of them is under {args.root.resolve()}: run it from the "
                      "checkout's root, or pass --root DIR.", file=sys.stderr)
            return 1
        print("generated files are up to date")
        return 0
    changed = write_all(args.root, config)
    changed += [p for p in _regions(args.root, write=True) if p not in changed]
    if args.json:
        print(json.dumps({"written": [p for p in changed if (args.root / p).exists()],
                          "removed": [p for p in changed if not (args.root / p).exists()]}))
        return 0
    for path in changed:  # a stale derived copy is removed, everything else written
        print(f"{'wrote' if (args.root / path).exists() else 'removed'} {path}")
    if not changed:
        print("generated files were already up to date")
    return 0
