"""The package's shape: a table of which layer may import which, an explicit public surface, one
settings table.

The import graph is read from the source (every ``import`` and ``from ... import``, including the
ones inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency), with each
name resolved to the most specific module it names. :func:`violations` checks a graph against
:data:`LAYERS` and :data:`ALLOWED`; the tests below feed it the package's own graph, synthetic
graphs with one planted violation of each kind, and the graph of a temporary copy of the package
with forbidden imports written into its files. docs/architecture.md ("Layout") states the same
table.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import specobs
from specobs import _config

PACKAGE = Path(specobs.__file__).parent


class Layer(NamedTuple):
    """One row of the table: its modules (prefixes) and what they may import besides their own
    layer: other layers by name (only layers above it in the table, that is below it in the
    house), or single public modules by their full name."""

    name: str
    modules: tuple[str, ...]
    may_import: tuple[str, ...]


#: The public modules (docs/architecture.md): what the wings may import besides their own layer.
PUBLIC: tuple[str, ...] = (
    "specobs", "specobs.catalog", "specobs.sampling", "specobs.sinks", "specobs.sinks.memory",
    "specobs.sinks.prometheus", "specobs.sinks.otlp", "specobs.timing", "specobs.timing.cuda",
    "specobs.timing.fake",
)

#: The package face, ``specobs/__init__.py``: no module below it may import it (it imports them).
FACE = "specobs"

#: The layers, bottom to top. A module may import its own layer (without a circle) and what its
#: row names; nothing else. A module's layer is the row with the longest matching prefix.
LAYERS: tuple[Layer, ...] = (
    Layer("foundations", ("specobs._errors", "specobs._version", "specobs._model",
                          "specobs.catalog", "specobs.sampling", "specobs.timing",
                          "specobs._speedups", "specobs._bucketing", "specobs._deadline",
                          "specobs._ring", "specobs._ring_slots", "specobs._ring_state",
                          "specobs._ring_worker", "specobs._ring_drain", "specobs._ring_results",
                          "specobs._core", "specobs._threadtime", "specobs._signalsafe",
                          "specobs._labels"), ()),
    Layer("settings", ("specobs._config", "specobs._config_reference"), ("foundations",)),
    Layer("recorder", ("specobs._recorder",), ("foundations",)),
    Layer("aggregation", ("specobs._aggregation",), ("foundations",)),
    Layer("series", ("specobs._series",), ("foundations",)),
    Layer("sinks", ("specobs.sinks",), ("foundations", "settings", "series")),
    Layer("acceptance", ("specobs._acceptance",), ("foundations", "settings", "recorder")),
    # The resolver and the parts it owns: stages, the sampler's model, folding, holds, the ring
    # it needs, and calls into sinks.
    Layer("resolver", ("specobs._resolver", "specobs._stages", "specobs._overhead",
                       "specobs._fold", "specobs._holds", "specobs._ring_protocol",
                       "specobs._sinkcalls"),
          ("foundations", "recorder", "aggregation", "acceptance", "sinks")),
    Layer("observer", ("specobs._observer", "specobs._lifetime"),
          ("foundations", "settings", "recorder", "aggregation", "acceptance", "sinks",
           "resolver")),
    Layer("facade", ("specobs",),
          ("foundations", "settings", "recorder", "sinks", "observer")),
    # The wings: the facade and the public modules, plus the named exceptions in ALLOWED.
    Layer("instrument", ("specobs.instrument",), PUBLIC),
    # The mixin renders the catalog, the configuration reference and the engines' declared hook
    # tables (the support table of docs/integrations.md); it knows nothing of a running observer.
    Layer("mixin", ("specobs.mixin",), ("specobs.catalog", "settings", "instrument")),
    # The diagnosis's thresholds: one table read from a data file, stdlib only.
    Layer("thresholds", ("specobs.tools._diagnosis._thresholds",), ()),
    Layer("tools", ("specobs.tools",), (*PUBLIC, "instrument", "mixin", "thresholds")),
    Layer("demo", ("specobs.demo",), (*PUBLIC, "tools")),
    # The dispatcher loads each subcommand's module by name (``cli._SUBCOMMANDS``).
    Layer("cli", ("specobs.cli", "specobs.__main__"), ("specobs", "tools", "demo")),
)

#: The wings' named reaches into private modules: (importer prefix, imported module) → why.
ALLOWED: Mapping[tuple[str, str], str] = {
    ("specobs.instrument", "specobs._config"):
        "env_flag and the default phases: the engines' switches are read as the SPECOBS_* "
        "settings are",
    ("specobs.demo._cli", "specobs._config"):
        "prometheus_port: the demo serves on the port SPECOBS_PROMETHEUS_PORT names",
    ("specobs.tools", "specobs._model"):
        "CLOCKS, the clock label values of the data's home",
    ("specobs.tools._breakdown", "specobs._series"):
        "the one series walk, which the demo's live summary reads without a scrape",
    ("specobs.tools._client", "specobs._deadline"):
        "the socket deadline the tools' HTTP client shares with the OTLP session",
}


def _modules(package: Path) -> dict[str, Path]:
    mods = {}
    # A compiled module is known by its stub (specobs/_speedups.pyi).
    for path in [*package.rglob("*.py"), *package.rglob("*.pyi")]:
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports, read from the source under ``package``.

    ``from specobs import _ring`` is two edges: to ``specobs._ring``, and to the package face
    (``specobs``, its ``__init__.py``), whose namespace the name is looked up in first; a
    module imported by its own path (``from specobs._ring import Ring``, ``import
    specobs._core as _core``) is one edge, to that module."""
    mods = _modules(package)
    face = package.name

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names if a.name.startswith("specobs"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                if base.split(".")[0] != "specobs":
                    continue
                if base == face:
                    targets.add(face)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in mods else resolve(base))
        targets.update(_imported_by_name(path, pkg, mods, resolve))
        targets.discard(None)
        targets.discard(module)
        graph[module] = {t for t in targets if t is not None}
    return graph


def _imported_by_name(path: Path, pkg: str, mods: Mapping[str, Path],
                      resolve: Any) -> set[str | None]:
    """What a module that calls ``import_module`` may load: each string constant in it that
    names one of the package's modules (``"specobs.tools._top"``, or ``"._engine"`` against its
    package). The CLI's subcommand table and the demo's lazy names load modules this way, which
    no import statement shows."""
    text = path.read_text()
    if "import_module" not in text:
        return set()
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        name = node.value
        if name.startswith(".") and len(name) > 1 and name[1:].isidentifier():
            name = f"{pkg}{name}"
        if name.startswith("specobs.") and name in mods:
            found.add(resolve(name))
    return found


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
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
        for w in sorted(graph.get(v, ())):
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


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> Layer:
    """The row whose longest prefix matches ``module``."""
    best: tuple[int, Layer | None] = (-1, None)
    for row in LAYERS:
        for prefix in row.modules:
            if _matches(module, prefix) and len(prefix) > best[0]:
                best = (len(prefix), row)
    assert best[1] is not None, f"{module} is in no layer; add it to LAYERS"
    return best[1]


def _permission(module: str, target: str) -> str | None:
    """What lets ``module`` import ``target`` (a layer's name, a public module, an ALLOWED key),
    or ``None``."""
    own, theirs = layer_of(module), layer_of(target)
    if own is theirs:
        return own.name
    if theirs.name in own.may_import:
        return theirs.name
    if target in own.may_import:
        return target
    for (importer, imported), _why in ALLOWED.items():
        if _matches(module, importer) and target == imported:
            return f"{importer} -> {imported}"
    return None


def violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import circle and every import the table does not permit, one line each."""
    found = [f"import circle: {' -> '.join(c)}" for c in circles(graph)]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _permission(module, target) is None:
                own, theirs = layer_of(module), layer_of(target)
                where = "an upward import" if LAYERS.index(theirs) > LAYERS.index(own) else (
                    "not in its row of LAYERS nor in ALLOWED")
                if target == FACE:
                    where += (": an arrow back up to the package face; import the module by "
                              "its own path (from specobs._ring import ..., import "
                              "specobs._core as _core)")
                found.append(f"{module} ({own.name}) imports {target} ({theirs.name}): {where}")
    return found


def unused_permissions(graph: Mapping[str, set[str]]) -> list[str]:
    """Layer permissions and ALLOWED entries that no import uses (the table would be looser than
    the code)."""
    used = {(layer_of(m).name, _permission(m, t)) for m, ts in graph.items() for t in ts}
    layer_names = {row.name for row in LAYERS}
    unused = [f"{row.name} may import {p}" for row in LAYERS for p in row.may_import
              if p in layer_names and (row.name, p) not in used]
    unused += [f"ALLOWED {a} -> {b}" for a, b in ALLOWED
               if (layer_of(a).name, f"{a} -> {b}") not in used]
    return unused


# -- the package against the table ------------------------------------------------------------

def test_the_package_follows_the_layer_table():
    graph = import_graph()
    assert len(graph) > 60  # the walk found the package
    assert violations(graph) == []


def test_no_module_below_the_face_imports_it():
    """``specobs/__init__.py`` imports the core; the core imports its modules by their own paths
    (``import specobs._ring as _ring``), never through the face (``from specobs import _ring``),
    so the import graph has no arrow back up to it. The wings that are not given the face (the
    mixin) do not import it either."""
    graph = import_graph()
    facade = next(i for i, row in enumerate(LAYERS) if row.name == "facade")
    below = [m for m, targets in graph.items()
             if FACE in targets and LAYERS.index(layer_of(m)) < facade]
    assert below == []
    assert [m for m, targets in graph.items()
            if FACE in targets and m.startswith("specobs.mixin")] == []
    # The face itself imports the layers below it (the check above has something to find).
    assert {"specobs._observer", "specobs._config", "specobs.sinks"} <= graph[FACE]


def test_the_reader_tells_an_import_through_the_face_from_one_by_path(tmp_path: Path):
    package = tmp_path / "specobs"
    package.mkdir()
    (package / "__init__.py").write_text("from specobs._b import B\n")
    (package / "_a.py").write_text("A = 1\n")
    (package / "_b.py").write_text("import specobs._a as _a\nfrom specobs._a import A\nB = A\n")
    (package / "_c.py").write_text("from specobs import _a\n")
    (package / "_d.py").write_text("def f():\n    from . import _a\n")
    graph = import_graph(package)
    assert graph["specobs"] == {"specobs._b"}
    assert graph["specobs._b"] == {"specobs._a"}
    assert graph["specobs._c"] == {FACE, "specobs._a"}
    assert graph["specobs._d"] == {FACE, "specobs._a"}


def test_modules_loaded_by_name_are_edges_of_the_graph():
    """The CLI's subcommand table and the demo's lazy names load modules through
    ``import_module``, which no import statement shows: the checker reads them too, so a name
    pointing into a forbidden layer fails like an import would."""
    graph = import_graph()
    by_name = {"specobs.tools._top", "specobs.demo._cli", "specobs.tools.report"}
    assert by_name <= graph["specobs.cli"]
    assert {"specobs.demo._engine", "specobs.demo._factory"} <= graph["specobs.demo"]
    planted = {k: set(v) for k, v in graph.items()}
    planted["specobs.cli"].add("specobs._resolver")  # as a name in _SUBCOMMANDS would add it
    assert any("specobs.cli (cli) imports specobs._resolver" in v for v in violations(planted))


def test_the_table_points_down_and_every_permission_is_used():
    order = {row.name: i for i, row in enumerate(LAYERS)}
    for i, row in enumerate(LAYERS):
        for p in row.may_import:
            if p in order:
                assert order[p] < i, f"{row.name} may import {p}, a layer above it"
            else:
                assert p in PUBLIC and order[layer_of(p).name] < i, (row.name, p)
    assert len(ALLOWED) <= 6, "the allow-list is short by design: use the facade"
    for importer, imported in ALLOWED:
        assert layer_of(importer).name in ("instrument", "tools", "demo"), importer
        assert imported.rpartition(".")[2].startswith("_"), f"{imported} is public: no entry"
    assert unused_permissions(import_graph()) == []


def _doc_tables() -> list[list[list[str]]]:
    """The Markdown tables of docs/architecture.md's "Layout" section, rows of cells."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    tables: list[list[list[str]]] = []
    previous = ""
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append([c.strip() for c in line.strip("|").split("|")])
        previous = line
    return [t[1:] for t in tables]  # without the header rows


def _names(cell: str) -> tuple[str, ...]:
    """``a``, ``b`` as full module names (the facade stays ``specobs``); words stay words."""
    out: list[str] = []
    for part in cell.split(", "):
        if part == "—":
            continue
        if part == "public modules":
            out.extend(PUBLIC)
        elif part.startswith("`"):
            name = part.strip("`")
            out.append(name if name == "specobs" else f"specobs.{name}")
        else:
            out.append(part)
    return tuple(out)


def test_the_architecture_doc_states_the_same_table():
    layers, allowed = _doc_tables()
    assert [Layer(row[0], _names(row[1]), _names(row[2])) for row in layers] == list(LAYERS)
    assert {(_names(a)[0], _names(b)[0]) for a, b, _ in allowed} == set(ALLOWED)
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    public = ", ".join(f"`{m.removeprefix('specobs.')}`" for m in PUBLIC)
    assert f"({public})" in " ".join(doc.split())


# -- planted violations: each kind must fail the checker ---------------------------------------

@functools.cache
def _read_package_graph() -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((m, frozenset(ts)) for m, ts in import_graph().items())


def _package_graph() -> dict[str, set[str]]:
    """A fresh, mutable copy of the package's graph (read once per session)."""
    return {m: set(ts) for m, ts in _read_package_graph()}


#: One forbidden import of each kind, and the words the checker must say about it.
PLANTED: tuple[tuple[str, str, str], ...] = (
    ("specobs.sinks._base", "specobs._aggregation", "not in its row"),  # a sink knows a source
    ("specobs.mixin._rules", "specobs._observer", "not in its row"),
    ("specobs.mixin._rules", "specobs._resolver", "not in its row"),
    ("specobs.tools._scrape", "specobs._resolver", "not in its row"),
    ("specobs.tools._breakdown", "specobs._aggregation", "not in its row"),
    ("specobs.instrument.vllm", "specobs._recorder", "not in its row"),
    ("specobs.instrument.vllm", "specobs.tools._load", "an upward import"),  # a wing beside
    ("specobs.demo._cli", "specobs._series", "not in its row"),  # allowed for one tool only
    ("specobs._model", "specobs._observer", "an upward import"),
    ("specobs._config", "specobs.sinks.prometheus", "an upward import"),
    ("specobs.sinks.prometheus", "specobs.tools._scrape", "an upward import"),
    ("specobs._series", "specobs._aggregation", "not in its row"),  # beside, not below
    # ``from specobs import _core`` below the face: the face imports these modules.
    ("specobs.timing.fake", FACE, "an arrow back up to the package face"),
    ("specobs._recorder", FACE, "an arrow back up to the package face"),
    ("specobs.mixin._rules", FACE, "an arrow back up to the package face"),
)


@pytest.mark.parametrize(("module", "target", "says"), PLANTED,
                         ids=[f"{m}->{t}" for m, t, _ in PLANTED])
def test_a_planted_import_fails_the_checker(module: str, target: str, says: str):
    graph = _package_graph()
    graph[module].add(target)
    edges = [line for line in violations(graph) if not line.startswith("import circle:")]
    assert len(edges) == 1 and edges[0].startswith(f"{module} ({layer_of(module).name}) imports "
                                                   f"{target} ")
    assert says in edges[0]


def test_a_planted_circle_fails_the_checker():
    graph = _package_graph()
    # Within one layer (each import alone is permitted) and across layers.
    graph["specobs.tools._client"].add("specobs.tools._scrape")
    assert "import circle: specobs.tools._client -> specobs.tools._scrape" in violations(graph)
    synthetic = {"specobs._model": {"specobs._errors"}, "specobs._errors": {"specobs._model"}}
    assert violations(synthetic) == ["import circle: specobs._errors -> specobs._model"]


def test_an_unused_permission_is_reported():
    graph = _package_graph()
    for module, targets in graph.items():
        if module.startswith("specobs.tools"):
            targets.difference_update({t for t in targets if t.startswith("specobs.mixin")})
    assert unused_permissions(graph) == ["tools may import mixin"]


def test_planted_imports_in_a_copy_of_the_package_fail(tmp_path: Path):
    """The graph reader sees imports in files the way they are written: at the top, inside a
    function, under ``TYPE_CHECKING``."""
    copy = tmp_path / "specobs"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c"))
    plants = {
        "sinks/_base.py": "from specobs._aggregation import Aggregation\n",
        "mixin/_rules.py": "def _planted():\n    from specobs._observer import Observer\n"
                           "    from specobs._resolver import Resolver\n",
        "tools/_scrape.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from specobs._resolver import Resolver\n",
        "_model.py": "def _planted():\n    from . import _observer\n",
        # Through the face, by name and relatively: each is the face plus the module.
        "_recorder.py": "from specobs import _ring as _planted_ring\n",
        "timing/fake.py": "def _planted():\n    from .. import _core\n",
    }
    for name, text in plants.items():
        path = copy / name
        path.write_text(path.read_text() + "\n\n" + text)
    found = violations(import_graph(copy))
    assert sorted(line.split(" (")[0] + " -> " + line.split(" imports ")[1].split(" (")[0]
                  for line in found if "circle" not in line) == [
        "specobs._model -> specobs",
        "specobs._model -> specobs._observer",
        "specobs._recorder -> specobs",
        "specobs.mixin._rules -> specobs._observer",
        "specobs.mixin._rules -> specobs._resolver",
        "specobs.sinks._base -> specobs._aggregation",
        "specobs.timing.fake -> specobs",
        "specobs.tools._scrape -> specobs._resolver",
    ]
    # The upward import closes a circle through the observer, and the checker says so too.
    assert any(line.startswith("import circle:") for line in found)


# -- the public surface and the settings table ---------------------------------------------

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


def test_the_handles_class_is_deprecated_for_the_protocol():
    """``specobs.Cycle`` (one core's concrete class) still resolves, with a warning that names
    ``CycleHandle``, the protocol to annotate with; it is no longer part of ``__all__``."""
    assert "Cycle" not in specobs.__all__ and "CycleHandle" in specobs.__all__
    obs = specobs.Observer(specobs.Settings())
    try:
        with pytest.warns(DeprecationWarning, match="annotate with specobs.CycleHandle"):
            cls = specobs.Cycle
        assert isinstance(obs.begin(), cls)
    finally:
        obs.shutdown(5)


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


def test_the_facade_gives_type_checkers_the_real_sink_classes(tmp_path: Path):
    """``specobs.PrometheusSink`` and ``specobs.sinks.OtlpSink`` are the real classes to mypy
    (a ``TYPE_CHECKING`` import), while importing specobs loads neither SDK; the open cycle is
    typed as the handle ``begin()`` returns."""
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "uses_the_facade.py"
    snippet.write_text(
        "import specobs\nimport specobs.sinks\n"
        "reveal_type(specobs.PrometheusSink)\nreveal_type(specobs.sinks.OtlpSink)\n"
        "reveal_type(specobs.OtlpSink)\n"
        "sink: specobs.PrometheusSink = specobs.PrometheusSink(port='9477')\n"
        "obs = specobs.configure(sinks=[])\n"
        "reveal_type(obs.begin())\nreveal_type(obs.current)\n"
    )
    out, _err, _status = api.run([
        "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
        "--ignore-missing-imports", "--no-error-summary", str(snippet)])
    lines = out.splitlines()
    assert "-> specobs.sinks.prometheus.PrometheusSink" in lines[0]
    assert "-> specobs.sinks.otlp.OtlpSink" in lines[1]
    assert "-> specobs.sinks.otlp.OtlpSink" in lines[2]
    # A wrong argument is an error now, not Any.
    assert 'Argument "port" to "PrometheusSink" has incompatible type "str"' in lines[3]
    # One name for the handle: what begin() returns is what current holds.
    assert lines[4].endswith('Revealed type is "specobs._model.CycleHandle"'), lines[4]
    assert lines[5].endswith('Revealed type is "specobs._model.CycleHandle | None"'), lines[5]

    import subprocess
    import sys

    code = ("import sys, specobs, specobs.sinks\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('prometheus_client', 'opentelemetry')]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
