"""The generated regions of docs/integrations.md: the support table, rendered from the engines'
declared hook tables, and the engines' own series table, rendered from
:mod:`specobs.mixin._engines`.

Per engine: the floor and the tested range, each variant of hook points with when it is required,
and each speculative method or worker class with what specobs does with it (timed through which
variants, or why not). The table is a region of a hand-written file, between :data:`BEGIN` and
:data:`END`; :func:`specobs.mixin.write_all` splices it in and ``specobs generate --check`` fails
when it drifts.
"""

from __future__ import annotations

from specobs.instrument import _contract, _support
from specobs.mixin import _engines
from specobs.mixin._config import MixinConfig

__all__ = ["BEGIN", "END", "ENGINE_SERIES_BEGIN", "ENGINE_SERIES_END", "PATH", "render",
           "render_engine_series"]

PATH = "docs/integrations.md"
BEGIN = ("<!-- BEGIN GENERATED: support table, from specobs/instrument/_package_*.py "
         "(specobs generate; do not edit by hand) -->")
END = "<!-- END GENERATED: support table -->"
ENGINE_SERIES_BEGIN = ("<!-- BEGIN GENERATED: engine series, from specobs/mixin/_engines.py "
                       "(specobs generate; do not edit by hand) -->")
ENGINE_SERIES_END = "<!-- END GENERATED: engine series -->"

_REQUIREMENT = {
    _contract.REQUIRED: "always",
    _contract.WHERE_PRESENT: "where its module exists",
    _contract.INFORMATIONAL: "never (reported only)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _engine(contract: _contract.Contract) -> list[str]:
    package = contract.package
    names = " or ".join(f"`{n}`" for n in (package.distribution, *package.aliases))
    lines = [
        f"### {contract.engine}",
        "",
        f"Distribution {names}; floor **{package.minimum}** (older releases are refused); "
        f"tested **{package.tested_range}** (a newer release is instrumented when every "
        "required hook point is there, with one warning that it is untested).",
        "",
        "| variant | required | hook points | what it is |",
        "| --- | --- | --- | --- |",
    ]
    for variant in contract.variants:
        points = ", ".join(
            (f"`{p.owner}.{p.method}`" if p.owner else f"`{p.method}()`") if p.method
            else f"`{p.owner}` fields"
            for p in variant.points)
        lines.append(f"| {variant.name} | {_REQUIREMENT[variant.requirement]} "
                     f"| {points} | {_cell(variant.description)} |")
    if contract.one_of:
        lines += ["", "At least one of " + ", ".join(contract.one_of) + " must be present."]
    unsupported = _support.unsupported(contract)
    lines += [
        "",
        f"Methods ({_cell(contract.methods_source)}):",
        "",
        "| method or worker | specobs | through |",
        "| --- | --- | --- |",
    ]
    for method in contract.methods:
        reason = unsupported.get(method.name, method.unsupported)
        status = f"not timed: {_cell(reason)}" if reason else "timed"
        lines.append(f"| {method.name} ({_cell(method.description)}) | {status} "
                     f"| {' or '.join(method.variants)} |")
    return lines


def render() -> str:
    """The region, markers included, ending with a newline."""
    lines = [BEGIN, "",
             "Generated from the hook tables `specobs engines` checks an installation against "
             "(`specobs engines --path DIR` checks an unpacked image).", ""]
    for contract in _support.CONTRACTS:
        lines += [*_engine(contract), ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def render_engine_series(config: MixinConfig = MixinConfig()) -> str:  # noqa: B008 - frozen
    """The engines' own series table, markers included, ending with a newline: for each engine
    and fleet quantity, the series the normalising rule reads and what the figure means there,
    and the release (or commit) and file each name was read from."""
    from specobs.mixin._rule_names import ENGINE_SOURCE, RuleNames

    rules = RuleNames(config).engine
    titles = {q.key: q.title for q in _engines.QUANTITIES}
    lines = [
        ENGINE_SERIES_BEGIN, "",
        "Generated from the table the normalising rules are built from. Each fleet quantity is "
        f"one rule (its name below), labelled `{config.engine_label}` (the engine) and "
        f'`source="{ENGINE_SOURCE}"`, with the job, instance and model labels of the server.',
        "",
        "| quantity | rule |",
        "| --- | --- |",
    ]
    lines += [f"| {titles[key]} | `{name}` |" for key, name in rules.items()]
    for engine in _engines.ENGINES:
        lines += [
            "",
            f"**{engine.title}**, read from {_cell(engine.source)}.",
            "",
            "| quantity | the engine's series | what the figure means there |",
            "| --- | --- | --- |",
        ]
        for q in _engines.QUANTITIES:
            t = engine.transform(q.key)
            if t is None:
                lines.append(f"| {q.title} | none | not exported: absent, never 0 |")
                continue
            series = ", ".join(f"`{n}`" for n in _engines.template_series(t.template))
            lines.append(f"| {q.title} | {series} | {_cell(t.caveat) or 'as specobs counts it'} |")
        if engine.request_gauges:
            gauges = ", ".join(f"`{n}`" for n in engine.request_gauges)
            lines.append(f"| requests running, waiting (the stall alert) | {gauges} | gauges |")
    lines += ["", ENGINE_SERIES_END]
    return "\n".join(lines) + "\n"
