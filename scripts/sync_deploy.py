#!/usr/bin/env python3
"""Derive the Kubernetes manifests in deploy/k8s/base/ from the files ``specobs generate`` writes.

    python scripts/sync_deploy.py            rewrite deploy/k8s/base/ from the generated files
    python scripts/sync_deploy.py --check    exit 1 and list what is out of date

kustomize cannot read files outside its root, so deploy/k8s/base/ carries its own derived copies:

* ``deploy/k8s/base/prometheusrule.yaml``: a PrometheusRule whose ``spec`` is
  deploy/prometheus/rules/specobs-rules.yml, indented verbatim (comments and block scalars kept);
* ``deploy/k8s/base/dashboards/*.json``: byte-for-byte copies of dashboards/*.json, and
  ``deploy/k8s/base/dashboards/kustomization.yaml``, whose configMapGenerator turns each into a
  ConfigMap labelled ``grafana_dashboard: "1"`` for the Grafana sidecar.

:func:`render_deploy` is pure (generated contents in, derived contents out) and uses the standard
library only; ``specobs generate`` calls it on the output of ``render_all()``, so one drift check
covers everything. This script remains for checking or rewriting deploy/k8s/base alone, and also
removes dashboard copies whose source is gone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["K8S_DIR", "RULES_PATH", "check_deploy", "main", "render_deploy", "write_deploy"]

from specobs.mixin._deploy import (
    DASHBOARDS_DIR,
    K8S_DIR,
    RULES_PATH,
    render_deploy,
)

_ROOT = Path(__file__).resolve().parent.parent

def _read_generated(root: Path) -> dict[str, str]:
    files = {RULES_PATH: (root / RULES_PATH).read_text(encoding="utf-8")}
    for path in sorted((root / DASHBOARDS_DIR).glob("*.json")):
        files[f"{DASHBOARDS_DIR}/{path.name}"] = path.read_text(encoding="utf-8")
    return files


def _stale(root: Path, rendered: Mapping[str, str]) -> list[str]:
    """Derived dashboard copies that no longer have a source."""
    wanted = set(rendered)
    return sorted(
        f"{K8S_DIR}/dashboards/{p.name}"
        for p in (root / K8S_DIR / "dashboards").glob("*.json")
        if f"{K8S_DIR}/dashboards/{p.name}" not in wanted
    )


def check_deploy(root: str | Path = _ROOT) -> list[str]:
    """Paths under ``root`` that are missing, differ from :func:`render_deploy`, or are stale."""
    root = Path(root)
    rendered = render_deploy(_read_generated(root))
    drifted = []
    for relative, text in rendered.items():
        path = root / relative
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            drifted.append(relative)
    return sorted(drifted + _stale(root, rendered))


def write_deploy(root: str | Path = _ROOT) -> list[str]:
    """Write the derived files under ``root``; returns the paths changed or removed."""
    root = Path(root)
    rendered = render_deploy(_read_generated(root))
    changed = []
    for relative, text in rendered.items():
        path = root / relative
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(relative)
    for relative in _stale(root, rendered):
        (root / relative).unlink()
        changed.append(relative)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/sync_deploy.py",
        description="Derive deploy/k8s/base/ (PrometheusRule, dashboard ConfigMaps) from the files "
        "`specobs generate` writes.",
    )
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if deploy/k8s/base/ is out of date")
    parser.add_argument("--root", type=Path, default=_ROOT,
                        help="repository root (default: the one holding this script)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            drifted = check_deploy(args.root)
            if drifted:
                print("These derived files are out of date:\n  " + "\n  ".join(drifted)
                      + "\nRegenerate them with: python scripts/sync_deploy.py", file=sys.stderr)
                return 1
            print("deploy/k8s/base is in sync with the generated files")
            return 0
        changed = write_deploy(args.root)
    except (OSError, KeyError, ValueError) as exc:
        print(f"sync_deploy: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {p}" for p in changed) or "deploy/k8s/base was already in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
