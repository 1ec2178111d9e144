"""docs/configuration.md, from the configuration reference (:mod:`specobs._config_reference`)."""

from __future__ import annotations

from specobs._config_reference import GROUPS, Entry, entries
from specobs.mixin._config import markdown_heading

__all__ = ["PATH", "render"]

PATH = "docs/configuration.md"


def _title(entry: Entry) -> str:
    return f"`{entry.variable}`" if entry.variable else f"`{entry.argument}` (argument only)"


def _anchor(entry: Entry) -> str:
    """GitHub's anchor of the entry's heading: lower case, punctuation dropped, spaces to -."""
    text = _title(entry).lower()
    return "".join(c for c in text if c.isalnum() or c in " _-").replace(" ", "-")


def render() -> str:
    """The whole page. Pure: the same text for the same reference."""
    rows = sorted(entries(), key=lambda e: GROUPS.index(e.group) if e.group in GROUPS else -1)
    unknown = sorted({e.group for e in rows} - set(GROUPS))
    if unknown:
        raise ValueError(f"configuration entries name groups not in GROUPS: {unknown}")
    lines = [
        *markdown_heading("specobs/_config_reference.py", "specobs configuration"),
        "Every `SPECOBS_*` environment variable and every `specobs.configure()` argument. An "
        "argument wins over its variable, which wins over the default. A bad value raises "
        "`specobs.ConfigurationError` when it is read, naming the variable, what was expected "
        "and what was got. OTLP export is configured by the standard `OTEL_EXPORTER_OTLP_*`, "
        "`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` variables, which are not repeated "
        "here.",
        "",
        "| Variable | `configure()` argument | Default | Unit |",
        "| --- | --- | --- | --- |",
    ]
    for e in rows:
        name = f"[`{e.variable}`](#{_anchor(e)})" if e.variable else "-"
        arg = f"[`{e.argument}`](#{_anchor(e)})" if e.argument and not e.variable else (
            f"`{e.argument}`" if e.argument else "-")
        lines.append(f"| {name} | {arg} | {e.default} | {e.unit} |")
    for group in GROUPS:
        members = [e for e in rows if e.group == group]
        if not members:
            continue
        lines += ["", f"## {group}"]
        for e in members:
            lines += ["", f"### {_title(e)}", "", e.summary, ""]
            if e.argument:
                lines.append(f"- `configure()` argument: `{e.argument}`")
            lines.append(f"- Default: {e.default}")
            if e.unit != "-":
                lines.append(f"- Unit: {e.unit}")
            lines += [
                f"- Accepts: {e.accepts}",
                f"- Read: {e.read}",
                f"- When to change it: {e.change}",
            ]
    return "\n".join(lines) + "\n"
