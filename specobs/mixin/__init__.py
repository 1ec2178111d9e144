"""The specobs monitoring mixin: dashboards, recording and alert rules, runbook and metric docs,
all generated from the metric catalog by one pure function.

``render_all(config)`` maps repository-relative paths to file contents; ``write_all`` writes them
(and removes derived dashboard copies in deploy/k8s/base/dashboards/ whose source is gone) and
``check_all`` lists the paths whose committed contents differ or are stale (``specobs generate
[--check]``). ``render_regions()`` renders the generated regions of hand-written files (the
support table of docs/integrations.md, between its markers); ``write_all`` splices them in and
``check_all`` reports them too.
Needs the ``gen`` extra (grafanalib, pyyaml).
"""

from __future__ import annotations

import os
from pathlib import Path

from specobs.mixin._config import MixinConfig

__all__ = ["OUTPUT_PATHS", "REGION_PATHS", "MixinConfig", "check_all", "render_all",
           "render_regions", "write_all"]

#: Every path :func:`render_all` may produce, relative to the repository root.
OUTPUT_PATHS: tuple[str, ...] = (
    "dashboards/cycle-breakdown.json",
    "dashboards/fleet.json",
    "deploy/prometheus/rules/specobs-rules.yml",
    "deploy/prometheus/rules/specobs-rules.test.yml",
    "docs/runbook.md",
    "docs/metrics.md",
    "docs/configuration.md",
    "deploy/k8s/base/prometheusrule.yaml",
    "deploy/k8s/base/dashboards/kustomization.yaml",
    "deploy/k8s/base/dashboards/cycle-breakdown.json",
    "deploy/k8s/base/dashboards/fleet.json",
)


#: Hand-written files with a generated region :func:`render_regions` renders.
REGION_PATHS: tuple[str, ...] = ("docs/integrations.md", "docs/otel-genai.md")


def render_regions() -> dict[str, str]:
    """Generated regions of hand-written files: relative path (``#`` and a name after it for a
    file's second region) -> the region, its begin and end markers included. Pure, like
    :func:`render_all`."""
    from specobs.mixin import _genai_proposal, _integrations

    return {
        _integrations.PATH: _integrations.render(),
        f"{_integrations.PATH}#engine-series": _integrations.render_engine_series(),
        _genai_proposal.PATH: _genai_proposal.render(),
    }


def _splice(current: str, region: str) -> str | None:
    """``current`` with the region between its markers replaced by ``region``; ``None`` when
    the markers are not there (once each, in order)."""
    begin, end = region.split("\n", 1)[0], region.rstrip("\n").rsplit("\n", 1)[-1]
    if current.count(begin) != 1 or current.count(end) != 1:
        return None
    head, _, rest = current.partition(begin)
    old, _, tail = rest.partition(end)
    if old.count("\n") == 0 and not tail.startswith("\n"):
        return None
    return head + region.rstrip("\n") + tail


def render_all(config: MixinConfig = MixinConfig()) -> dict[str, str]:  # noqa: B008 - frozen
    """Every generated file: relative path -> contents. Pure: no I/O, no clock.

    The promtool test file is included only when ``config`` keeps the default rule thresholds
    and windows its cases are written for.
    """
    try:
        from specobs.mixin import (
            _config_doc,
            _dashboards,
            _deploy,
            _metrics_doc,
            _rule_tests,
            _rules,
            _runbook,
        )
    except ImportError as exc:  # grafanalib or pyyaml missing
        raise ImportError(
            f"specobs generate needs grafanalib and pyyaml ({exc}); "
            "install them with: pip install 'specobs[gen]'"
        ) from exc
    files = {
        "dashboards/cycle-breakdown.json": _dashboards.render_cycle_breakdown(config),
        "dashboards/fleet.json": _dashboards.render_fleet(config),
        "deploy/prometheus/rules/specobs-rules.yml": _rules.render(config),
        "docs/runbook.md": _runbook.render(config),
        "docs/metrics.md": _metrics_doc.render(config),
        _config_doc.PATH: _config_doc.render(),
    }
    tests = _rule_tests.render(config)
    if tests is not None:
        files["deploy/prometheus/rules/specobs-rules.test.yml"] = tests
    files.update(_deploy.render_deploy(files))
    return dict(sorted(files.items()))


def _stale(root: Path, rendered: dict[str, str]) -> list[str]:
    """Derived dashboard copies under deploy/k8s/base/dashboards/ that nothing renders any more
    (a dashboard was renamed or removed): kustomize would still ship them."""
    from specobs.mixin._deploy import K8S_DIR

    return sorted(
        f"{K8S_DIR}/dashboards/{path.name}"
        for path in (root / K8S_DIR / "dashboards").glob("*.json")
        if f"{K8S_DIR}/dashboards/{path.name}" not in rendered
    )


def write_all(
    root: str | os.PathLike[str],
    config: MixinConfig = MixinConfig(),  # noqa: B008 - frozen
) -> list[str]:
    """Write every generated file under ``root`` and remove stale derived dashboard copies;
    returns the paths changed or removed."""
    rendered = render_all(config)
    changed = []
    for relative, text in rendered.items():
        path = Path(root) / relative
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(relative)
    for relative in _stale(Path(root), rendered):
        (Path(root) / relative).unlink()
        changed.append(relative)
    for key, region in render_regions().items():
        relative = key.partition("#")[0]
        path = Path(root) / relative
        if not path.exists():
            continue  # the hand-written file is not under this root: nothing to splice into
        current = path.read_text(encoding="utf-8")
        spliced = _splice(current, region)
        if spliced is None:  # no markers yet: the region goes at the end
            spliced = current.rstrip("\n") + "\n\n" + region
        if spliced != current:
            path.write_text(spliced, encoding="utf-8")
            if relative not in changed:
                changed.append(relative)
    return changed


def check_all(
    root: str | os.PathLike[str],
    config: MixinConfig = MixinConfig(),  # noqa: B008 - frozen
) -> list[str]:
    """Paths under ``root`` that are missing, differ from :func:`render_all`, or are stale derived
    dashboard copies (empty: in sync)."""
    rendered = render_all(config)
    drifted = []
    for relative, text in rendered.items():
        path = Path(root) / relative
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            drifted.append(relative)
            continue
        if current != text:
            drifted.append(relative)
    for key, region in render_regions().items():
        relative = key.partition("#")[0]
        path = Path(root) / relative
        if path.exists():
            current = path.read_text(encoding="utf-8")
            if _splice(current, region) != current and relative not in drifted:
                drifted.append(relative)
    return sorted(drifted + _stale(Path(root), rendered))
