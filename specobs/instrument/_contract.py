"""Hook-point contracts: what specobs patches in an engine, declared as data and checked against
the engine's installed files with :mod:`ast` -- the engine is never imported.

specobs attaches to an engine release when every hook point it needs is there, not when the
release number falls under a ceiling. Each engine's tiny ``_package_*.py`` declares a
:class:`Contract`: the distribution and its version floor (:class:`PackageRange`), the hook points
grouped in :class:`Variant` s (vLLM's model runner V1 and V2, its worker and scheduler; one group
per SGLang worker class; transformers' assisted generation), and the speculative methods or
worker classes the engine offers, each with the variants it runs through.

:func:`check` finds the installed distribution with :mod:`importlib.metadata` (or in a directory of
unpacked packages), parses the modules the points name, resolves classes through ``from X import
Y`` and base classes (an inherited method counts), and compares method parameters and fields.
The :class:`EngineReport` it returns carries one :class:`PointResult` per point and a verdict:

- ``not_installed``;
- ``below_floor``: older than :attr:`PackageRange.minimum`, known not to work;
- ``attachable``: every required point found, inside the tested range;
- ``attachable_untested``: the same, above the tested range (one warning names the version);
- ``refused``: a required point is missing (each one named); the engine is left untouched.

A variant's requirement is one of :data:`REQUIRED` (always), :data:`WHERE_PRESENT` (only where the
module of its first point exists: vLLM's runner V1 was deleted in 0.34) and :data:`INFORMATIONAL`
(reported, never refusing: a worker specobs does not time yet). A contract's ``one_of`` asks
that at least one of the named variants be present.

This module is stdlib only: instrumentors check before they patch, in every process an engine
starts, and :func:`check` caches its result per process (the files are read once).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from specobs.instrument._source_tree import SourceTree as SourceTree
from specobs.instrument._source_tree import params, spec_root

__all__ = [
    "ATTACHABLE",
    "ATTACHABLE_UNTESTED",
    "BELOW_FLOOR",
    "INFORMATIONAL",
    "NOT_INSTALLED",
    "REFUSED",
    "REQUIRED",
    "WHERE_PRESENT",
    "Contract",
    "EngineReport",
    "HookPoint",
    "Installed",
    "MethodResult",
    "PackageRange",
    "PointResult",
    "SourceTree",
    "SpeculativeMethod",
    "Variant",
    "VariantResult",
    "check",
    "locate",
    "parse_release",
]

REQUIRED = "required"
"""Every point of the variant must be found, in every release."""
WHERE_PRESENT = "where present"
"""Every point must be found where the variant's first module exists (else it is not offered)."""
INFORMATIONAL = "informational"
"""Reported only: a missing point never refuses the release (a worker specobs does not time)."""

NOT_INSTALLED = "not_installed"
BELOW_FLOOR = "below_floor"
ATTACHABLE = "attachable"
ATTACHABLE_UNTESTED = "attachable_untested"
REFUSED = "refused"

_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def parse_release(version: str) -> tuple[int, ...]:
    """The release segment of a PEP 440 version as integers: ``"0.5.15.post1"`` -> ``(0, 5, 15)``.

    Pre-, post- and dev-release parts are ignored: floors and tested ranges are stated in releases.
    """
    match = _RELEASE.match(version.strip().lstrip("vV"))
    if match is None:
        raise ValueError(f"Cannot read a release number from version {version!r}.")
    return tuple(int(part) for part in match.group(0).split("."))


def _compare(a: str, b: str) -> int:
    """-1, 0 or 1 as release ``a`` is older than, equal to or newer than ``b``."""
    left, right = parse_release(a), parse_release(b)
    width = max(len(left), len(right))
    left, right = left + (0,) * (width - len(left)), right + (0,) * (width - len(right))
    return (left > right) - (left < right)


@dataclass(frozen=True)
class PackageRange:
    """A third-party distribution, the oldest release specobs works with and the tested range.

    ``minimum`` is the floor (included; older releases are known not to work). ``tested_below``
    (excluded) ends the releases specobs's tests ran against: a newer release is attached when
    its hook points are all there (:func:`check`), with one warning that it is untested.
    ``PackageRange("vllm", "0.11", "0.35")``: tested 0.11.0 up to every 0.34.x.
    """

    distribution: str
    minimum: str
    tested_below: str
    aliases: tuple[str, ...] = ()
    """Other distributions that install the same import package (a CPU build, a fork)."""
    import_name: str = ""
    """The top-level import package; empty: the distribution's name."""

    @property
    def top_level(self) -> str:
        return self.import_name or self.distribution

    @property
    def requirement(self) -> str:
        """The floor as a requirement string, as OpenTelemetry's dependency check reads it."""
        return self.requirement_of(self.distribution)

    def requirement_of(self, distribution: str) -> str:
        return f"{distribution} >= {self.minimum}"

    @property
    def tested_range(self) -> str:
        """``">= 0.11, < 0.35"``: the releases specobs's tests ran against."""
        return f">= {self.minimum}, < {self.tested_below}"

    def installed(self) -> tuple[str, str] | None:
        """``(distribution, version)`` of the first of :attr:`distribution` and :attr:`aliases`
        that is installed, read from package metadata without importing the package."""
        for name in (self.distribution, *self.aliases):
            try:
                return name, importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def installed_version(self) -> str | None:
        """The installed version (of the first installed of the distribution and its aliases)."""
        found = self.installed()
        return None if found is None else found[1]

    def below_floor(self, version: str) -> bool:
        """Whether ``version`` is older than :attr:`minimum` (an unreadable version counts)."""
        try:
            return _compare(version, self.minimum) < 0
        except ValueError:
            return True

    def tested(self, version: str) -> bool:
        """Whether ``version`` lies inside the tested range."""
        try:
            return not self.below_floor(version) and _compare(version, self.tested_below) < 0
        except ValueError:
            return False


@dataclass(frozen=True)
class HookPoint:
    """One thing specobs relies on: ``module.owner.method`` with parameter names, or the fields an
    instance of ``owner`` carries (``method`` empty: the class and its fields only)."""

    module: str
    owner: str
    """The class; empty: ``method`` is a module-level function."""
    method: str = ""
    params: tuple[str, ...] = ()
    """Parameter names the hook reads (by position or keyword); each must be in the signature."""
    fields: tuple[str, ...] = ()
    """Attributes read on an instance: annotated class fields, ``self.X = ...`` stores, class
    attributes or properties, in the class or a base."""
    optional: bool = False
    """The instrumentor copes without it (it patches only what is there): never refuses."""

    @property
    def name(self) -> str:
        owner = f"{self.module}.{self.owner}" if self.owner else self.module
        return owner + (f".{self.method}" if self.method else "")


@dataclass(frozen=True)
class Variant:
    """A group of hook points that belong together (one model runner, one worker class)."""

    name: str
    requirement: str
    points: tuple[HookPoint, ...]
    description: str = ""

    @property
    def anchor(self) -> str:
        """The module whose existence makes a :data:`WHERE_PRESENT` variant required."""
        return self.points[0].module


@dataclass(frozen=True)
class SpeculativeMethod:
    """A speculative method (vLLM's ``method``), algorithm or worker class the engine offers.

    Timed when one of ``variants`` is present with every point found; ``unsupported`` says why
    specobs does not time it at all (empty: it does)."""

    name: str
    variants: tuple[str, ...]
    description: str = ""
    unsupported: str = ""


@dataclass(frozen=True)
class Contract:
    """An engine's declared hook table: what the instrumentor patches and reads, per variant."""

    engine: str
    package: PackageRange
    variants: tuple[Variant, ...]
    methods: tuple[SpeculativeMethod, ...] = ()
    one_of: tuple[str, ...] = ()
    """At least one of these variants must be present (a release with neither runner is not one
    specobs can time)."""
    methods_source: str = ""
    """Where the engine lists its methods (for the reader of a support table)."""

    def points(self) -> Iterator[tuple[Variant, HookPoint]]:
        for variant in self.variants:
            for point in variant.points:
                yield variant, point

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(name)


# -- reading an engine's files ---------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """An installed distribution: its name, version and the directory its import package is in
    (``None`` when the files cannot be found: an egg, a zip import)."""

    distribution: str
    version: str
    root: Path | None


def locate(package: PackageRange, path: Sequence[str | Path] | None = None) -> Installed | None:
    """The installed distribution of ``package`` (or an alias), from the current environment or
    from the directories in ``path`` (e.g. a ``pip install --target DIR``); nothing is imported."""
    search = None if path is None else [str(p) for p in path]
    for name in (package.distribution, *package.aliases):
        found = (importlib.metadata.distributions(name=name) if search is None
                 else importlib.metadata.distributions(name=name, path=search))
        dist = next(iter(found), None)
        if dist is None:
            continue
        version = dist.version
        root: Path | None = Path(str(dist.locate_file("")))
        if root is None or not (root / package.top_level).is_dir():
            # An editable install keeps its files elsewhere: ask the import system (no import).
            root = spec_root(package.top_level) if search is None else None
        return Installed(name, version, root)
    return None


# -- the check ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointResult:
    """One hook point in one release: found, or what is missing."""

    point: HookPoint
    variant: str
    required: bool
    missing: tuple[str, ...] = ()
    where: str = ""
    """``file:line`` of the definition found (an inherited method: the base's file)."""
    absent: bool = False
    """Its variant is not in this release (and not required): nothing is missing."""

    @property
    def found(self) -> bool:
        return not self.missing

    @property
    def status(self) -> str:
        """``found``; ``missing`` (refuses the release); ``missing_optional`` (the
        instrumentor copes, or the variant is informational); ``absent`` (its variant is not in
        this release)."""
        if self.found:
            return "found"
        if self.absent:
            return "absent"
        return "missing" if self.required else "missing_optional"

    def describe(self) -> str:
        return f"{self.point.name} ({'; '.join(self.missing)})" if self.missing else (
            self.point.name)


@dataclass(frozen=True)
class VariantResult:
    variant: Variant
    present: bool
    """Its first module and class exist in this release."""
    complete: bool
    """Present, with every non-optional point found."""
    required: bool


@dataclass(frozen=True)
class MethodResult:
    method: SpeculativeMethod
    status: str
    """``supported``, ``unsupported`` or ``absent`` (the release has no such method or worker)."""
    reason: str = ""


@dataclass(frozen=True)
class EngineReport:
    contract: Contract
    installed: Installed | None
    verdict: str
    points: tuple[PointResult, ...] = ()
    variants: tuple[VariantResult, ...] = ()
    methods: tuple[MethodResult, ...] = ()
    problems: tuple[str, ...] = field(default=())
    """One line per reason to refuse: each missing required point, a missing variant."""

    @property
    def attachable(self) -> bool:
        return self.verdict in (ATTACHABLE, ATTACHABLE_UNTESTED)

    def message(self) -> str:
        """The one warning an instrumentor logs for this verdict (empty: none is due)."""
        package = self.contract.package
        name = package.distribution if self.installed is None else self.installed.distribution
        version = "" if self.installed is None else self.installed.version
        if self.verdict == NOT_INSTALLED:
            return (f"specobs does not instrument {name}: it is not installed. The engine runs "
                    "unchanged and no speculative decoding metrics are recorded.")
        if self.verdict == BELOW_FLOOR:
            return (f"specobs does not instrument {name} {version}: it works with {name} >= "
                    f"{package.minimum} (tested {package.tested_range}). The engine runs "
                    "unchanged and no speculative decoding metrics are recorded; upgrade it or "
                    "instrument the loop by hand (docs/integrations.md).")
        if self.verdict == REFUSED:
            return (f"specobs does not instrument {name} {version}: hook points it needs are "
                    f"missing: {'; '.join(self.problems)}. The engine runs unchanged and no "
                    "speculative decoding metrics are recorded; `specobs engines` lists every "
                    "hook point, docs/integrations.md the tested releases.")
        if self.verdict == ATTACHABLE_UNTESTED:
            return (f"specobs instruments {name} {version}, a release newer than those it was "
                    f"tested with ({package.tested_range}): every hook point it needs is there, "
                    "but the figures are not verified on this release; `specobs engines` lists "
                    "what was checked.")
        return ""


def _check_point(tree: SourceTree, point: HookPoint) -> tuple[tuple[str, ...], str, bool]:
    """What is missing of ``point``, where it was found, and whether its class was."""
    if tree.file(point.module) is None:
        return (f"module {point.module} missing",), "", False
    if not point.owner:  # a module-level function, defined there or imported
        where = tree.function(point.module, point.method)
        return (() if where else (f"function {point.method} missing from "
                                  f"{tree.relative(point.module)}",)), where, True
    found = tree.find_class(point.module, point.owner)
    if found is None:
        return (f"class {point.owner} missing from {tree.relative(point.module)}",), "", False
    where = f"{tree.relative(found.module)}:{found.node.lineno}"
    missing: list[str] = []
    if point.method:
        hit = tree.method(found, point.method)
        if hit is None:
            return (f"method {point.method} missing",), where, True
        owner, fn = hit
        where = f"{tree.relative(owner.module)}:{fn.lineno}"
        have = params(fn)
        missing += [f"parameter {p} missing" for p in point.params if p not in have]
    if point.fields:
        have_fields = tree.fields(found)
        missing += [f"field {f} missing" for f in point.fields if f not in have_fields]
    return tuple(missing), where, True


def check(contract: Contract, path: Sequence[str | Path] | None = None, *,
          version: str | None = None,
          unsupported: Mapping[str, str] | None = None) -> EngineReport:
    """The verdict on the installed release (or the one under ``path``), per point.

    ``version`` overrides the installed version read from metadata (an instrumentor's package
    may report one). ``unsupported`` adds methods specobs does not time, by name, with the reason
    (SGLang's instrumentor keeps its own list). Results are cached per process.
    """
    key = None if path is None else tuple(str(p) for p in path)
    installed = locate(contract.package, key)
    if version is not None:
        if installed is None:
            installed = Installed(contract.package.distribution, version, None)
        else:
            installed = Installed(installed.distribution, version, installed.root)
    frozen = tuple(sorted((unsupported or {}).items()))
    return _check(contract, installed, frozen)


@functools.lru_cache(maxsize=64)
def _check(contract: Contract, installed: Installed | None,
           unsupported: tuple[tuple[str, str], ...]) -> EngineReport:
    package = contract.package
    if installed is None:
        return EngineReport(contract, None, NOT_INSTALLED, methods=tuple(
            MethodResult(m, "absent", "not installed") for m in contract.methods))
    if package.below_floor(installed.version):
        return EngineReport(contract, installed, BELOW_FLOOR, methods=tuple(
            MethodResult(m, "unsupported", f"{installed.version} is below the floor "
                         f"{package.minimum}") for m in contract.methods))
    tested = package.tested(installed.version)
    if installed.root is None:
        # The files cannot be read: the tested range alone decides, as before contracts.
        verdict = ATTACHABLE if tested else REFUSED
        unread: tuple[str, ...] = () if tested else (
            f"the files of {installed.distribution} {installed.version} (the hook points "
            "cannot be read, and the release is outside the tested range)",)
        return EngineReport(contract, installed, verdict, problems=unread, methods=tuple(
            MethodResult(m, "supported" if tested and not m.unsupported else "unsupported",
                         m.unsupported) for m in contract.methods))
    tree = SourceTree(installed.root)
    points: list[PointResult] = []
    variants: list[VariantResult] = []
    problems: list[str] = []
    for variant in contract.variants:
        anchor_exists = tree.file(variant.anchor) is not None
        required = variant.requirement == REQUIRED or (
            variant.requirement == WHERE_PRESENT and anchor_exists)
        results = []
        present = anchor_exists
        for i, point in enumerate(variant.points):
            missing, where, has_class = _check_point(tree, point)
            results.append(PointResult(point, variant.name, required and not point.optional,
                                       missing, where))
            if i == 0:
                present = present and has_class
        complete = present and all(r.found for r in results if not r.point.optional)
        variants.append(VariantResult(variant, present, complete, required))
        if not present and not required:
            results = [replace(r, absent=True) for r in results]
        points += results
        problems += [r.describe() for r in results if r.required and not r.found]
    present_names = {v.variant.name for v in variants if v.present}
    if contract.one_of and not present_names & set(contract.one_of):
        problems.append(f"none of {', '.join(contract.one_of)} (no module "
                        f"{' nor '.join(contract.variant(n).anchor for n in contract.one_of)})")
    verdict = REFUSED if problems else (ATTACHABLE if tested else ATTACHABLE_UNTESTED)
    reasons = dict(unsupported)
    complete_names = {v.variant.name for v in variants if v.complete}
    methods = []
    for method in contract.methods:
        reason = reasons.get(method.name, method.unsupported)
        if not present_names & set(method.variants):
            methods.append(MethodResult(method, "absent", "not in this release"))
        elif reason:
            methods.append(MethodResult(method, "unsupported", reason))
        elif verdict == REFUSED:
            methods.append(MethodResult(method, "unsupported",
                                        "specobs refuses this release (hook points missing)"))
        elif not complete_names & set(method.variants):
            methods.append(MethodResult(method, "unsupported", "hook points missing: " + "; ".join(
                r.describe() for r in points if r.variant in method.variants and not r.found)))
        else:
            methods.append(MethodResult(method, "supported"))
    return EngineReport(contract, installed, verdict, tuple(points), tuple(variants),
                        tuple(methods), tuple(problems))
