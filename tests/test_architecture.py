"""The package's shape: one-way imports, an explicit public surface, one settings table.

The import graph is read from the source (every ``import`` and ``from ... import``, including the
ones inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency), with each
name resolved to the most specific module it names.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import specobs
from specobs import _config

PACKAGE = Path(specobs.__file__).parent

#: Layers, bottom to top. A module may import only from its own layer (without a circle) or
#: from a layer below. The first matching prefix decides a module's layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specobs._errors", "specobs._version", "specobs._model", "specobs.catalog",
     "specobs.sampling", "specobs.timing", "specobs._speedups", "specobs._bucketing",
     "specobs._deadline", "specobs._ring", "specobs._core", "specobs._threadtime"),
    ("specobs._config",),
    ("specobs._recorder", "specobs._aggregation", "specobs._series", "specobs._acceptance",
     "specobs.sinks"),
    ("specobs._resolver",),
    ("specobs._observer",),
    ("specobs",),  # the facade: specobs/__init__.py
    ("specobs.instrument", "specobs.mixin"),
    ("specobs.tools",),
    ("specobs.demo",),
    ("specobs.cli", "specobs.__main__"),
)


def _modules() -> dict[str, Path]:
    mods = {}
    # A compiled module is known by its stub (specobs/_speedups.pyi).
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]:
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names if a.name.startswith("specobs"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                if base.split(".")[0] != "specobs":
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in mods else resolve(base))
        targets.discard(None)
        targets.discard(module)
        graph[module] = {t for t in targets if t is not None}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    best = (-1, -1)  # (prefix length, layer): the longest matching prefix wins
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), i)
    assert best[1] >= 0, f"{module} is in no layer; add it to LAYERS"
    return best[1]


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert len(graph) > 60  # the walk found the package
    assert circles(graph) == []


def test_every_import_points_down():
    upward = [
        f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
        for m, targets in import_graph().items()
        for t in sorted(targets)
        if layer(t) > layer(m)
    ]
    assert upward == []


def test_the_checks_catch_a_circle_and_an_upward_import():
    graph = {"specobs._model": {"specobs._observer"}, "specobs._observer": {"specobs._model"}}
    assert circles(graph) == [["specobs._model", "specobs._observer"]]
    assert layer("specobs._observer") > layer("specobs._model")
    assert layer("specobs.sinks.otlp") == layer("specobs._aggregation")
    assert layer("specobs.tools._top") > layer("specobs")


def test_public_surface_is_exactly_all():
    """Every public name ``import specobs`` binds is in ``__all__`` and the reverse (the lazy
    sinks resolve on access); submodules are not names."""
    import types

    public = {
        name for name, value in vars(specobs).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
        and name not in ("annotations", "TYPE_CHECKING", "Any")
    }
    assert public | {"OtlpSink", "PrometheusSink", "__version__"} == set(specobs.__all__)
    assert list(specobs.__all__) == sorted(specobs.__all__)
    for name in specobs.__all__:
        assert getattr(specobs, name) is not None


def test_the_package_ships_its_types():
    assert (PACKAGE / "py.typed").exists()
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["specobs"]
    # The marker, and the stub of the compiled module (its only type information).
    assert "py.typed" in shipped and "*.pyi" in shipped
    assert (PACKAGE / "_speedups.pyi").exists()


def test_the_settings_table_has_one_row_per_settings_field():
    fields = [f.name for f in dataclasses.fields(specobs.Settings)]
    assert [s.field for s in _config.SETTINGS] == fields
    variables = [s.variable for s in _config.SETTINGS if s.variable is not None]
    assert len(variables) == len(set(variables))
    for variable in variables:
        assert getattr(_config, variable) == variable  # each is a documented constant


def test_configure_rejects_an_unknown_setting_and_takes_a_settings_object():
    import pytest

    with pytest.raises(specobs.ConfigurationError, match=r"unknown setting 'keep_cycles'"):
        specobs.configure(keep_cycles=3)
    base = specobs.Settings(max_draft_length=3, phases=("draft", "verify"))
    obs = specobs.configure(base, sinks=[], clock="host", env={"SPECOBS_MAX_DRAFT_LENGTH": "9"},
                            labels={"model": "m"})
    # The object is the base (the variable is not read); the argument still wins.
    assert obs.settings.max_draft_length == 3 and obs.settings.phases == ("draft", "verify")
    assert dict(obs.settings.labels) == {"model": "m"}
    obs.shutdown()
    with pytest.raises(specobs.ConfigurationError, match="replica must be"):
        specobs.configure(replica=2, replicas=2, sinks=[], clock="host")
    with pytest.raises(specobs.ConfigurationError, match="SPECOBS_QUEUE_SIZE"):
        specobs.configure(sinks=[], clock="host", env={"SPECOBS_QUEUE_SIZE": "3"})
