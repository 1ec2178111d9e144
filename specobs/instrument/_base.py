"""The small base every specobs instrumentor builds on.

An instrumentor patches a third-party inference engine so that its speculative decoding loop
reports cycles to a :class:`specobs.Observer` without any change to the engine's code. The
contract follows OpenTelemetry's instrumentors:

- ``instrument()`` and ``uninstrument()`` are idempotent and every original attribute is put
  back exactly as it was found (an attribute that was inherited is deleted again, not copied in);
- the target package is checked with :mod:`importlib.metadata` *before* anything of it is
  imported, so an unsupported version logs one clear warning and leaves the engine untouched;
- each instrumentor class is a process-wide singleton, so ``TransformersInstrumentor()`` in two
  places is the same object and the second ``uninstrument()`` undoes the first ``instrument()``;
- ``opentelemetry-instrument`` can load it through the ``opentelemetry_instrumentor`` entry point
  (it calls ``Instrumentor().instrument(skip_dep_check=True)``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from specobs import Observer

logger = logging.getLogger("specobs.instrument")

_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def parse_release(version: str) -> tuple[int, ...]:
    """The release segment of a PEP 440 version as integers: ``"0.5.15.post1"`` -> ``(0, 5, 15)``.

    Pre-, post- and dev-release parts are ignored: a supported range is stated in releases.
    """
    match = _RELEASE.match(version.strip().lstrip("vV"))
    if match is None:
        raise ValueError(f"Cannot read a release number from version {version!r}.")
    return tuple(int(part) for part in match.group(0).split("."))


def _pad(release: tuple[int, ...], width: int) -> tuple[int, ...]:
    return release + (0,) * (width - len(release))


@dataclass(frozen=True)
class PackageRange:
    """A third-party distribution and the half-open release range specobs supports.

    ``minimum`` is included, ``below`` is excluded: ``PackageRange("vllm", "0.11", "0.34")``
    supports 0.11.0 up to every 0.33.x.
    """

    distribution: str
    minimum: str
    below: str

    @property
    def requirement(self) -> str:
        """The range as a requirement string, as OpenTelemetry's dependency check reads it."""
        return f"{self.distribution} >= {self.minimum}, < {self.below}"

    def installed_version(self) -> str | None:
        """The installed version, read from package metadata without importing the package."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def supports(self, version: str) -> bool:
        """Whether ``version`` lies inside the range."""
        try:
            got = parse_release(version)
        except ValueError:
            return False
        low, high = parse_release(self.minimum), parse_release(self.below)
        width = max(len(got), len(low), len(high))
        return _pad(low, width) <= _pad(got, width) < _pad(high, width)


@dataclass
class _Patch:
    owner: Any
    name: str
    had_own: bool
    original: Any


class BaseInstrumentor:
    """Idempotent, restorable patching of one third-party package.

    Subclasses set :attr:`package`, implement :meth:`_instrument` (calling :meth:`_patch` for
    every attribute they replace) and expose a typed ``instrument(...)`` that calls
    :meth:`_instrument_checked`.
    """

    package: ClassVar[PackageRange]
    _instances: ClassVar[dict[type, BaseInstrumentor]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls) -> BaseInstrumentor:
        with BaseInstrumentor._instances_lock:
            instance = BaseInstrumentor._instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance._lock = threading.RLock()
                instance._patches = []
                instance._instrumented = False
                instance._warned = False
                instance._observer = None
                BaseInstrumentor._instances[cls] = instance
            return instance

    _lock: threading.RLock
    _patches: list[_Patch]
    _instrumented: bool
    _warned: bool
    _observer: Observer | None

    # -- what OpenTelemetry's loader reads ------------------------------------------------------

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirement strings of the instrumented package (OpenTelemetry's dependency check)."""
        return (self.package.requirement,)

    @property
    def is_instrumented(self) -> bool:
        """Whether the target is patched now."""
        return self._instrumented

    # -- lifecycle --------------------------------------------------------------------------------

    def _instrument_checked(self, observer: Observer | None, skip_dep_check: bool) -> bool:
        """Patch the target once; ``False`` (and one warning) when it is missing or unsupported."""
        with self._lock:
            if self._instrumented:
                return True
            if not skip_dep_check and not self._version_supported():
                return False
            self._observer = observer
            try:
                self._instrument()
            except Exception:
                # A half-applied patch set is worse than none: put everything back.
                self._restore_all()
                self._observer = None
                logger.exception(
                    "specobs could not instrument %s; it is left untouched.",
                    self.package.distribution,
                )
                return False
            self._instrumented = True
            return True

    def uninstrument(self) -> None:
        """Restore every patched attribute; a no-op when not instrumented."""
        with self._lock:
            if not self._instrumented:
                return
            self._uninstrument()
            self._restore_all()
            self._instrumented = False
            self._observer = None

    def _version_supported(self) -> bool:
        version = self.package.installed_version()
        if version is not None and self.package.supports(version):
            return True
        if not self._warned:
            self._warned = True
            got = "is not installed" if version is None else f"{version} is installed"
            logger.warning(
                "specobs does not instrument %s: it supports %s, but %s. The engine runs "
                "unchanged and no speculative decoding metrics are recorded; install a "
                "supported version or instrument the loop by hand (docs/integrations.md).",
                self.package.distribution,
                self.package.requirement,
                got,
            )
        return False

    # -- for subclasses ---------------------------------------------------------------------------

    def _instrument(self) -> None:
        raise NotImplementedError

    def _uninstrument(self) -> None:
        """Extra teardown before the patches are restored (optional)."""

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(original)``, remembering how to undo it."""
        had_own = name in vars(owner)
        original = vars(owner)[name] if had_own else getattr(owner, name)
        replacement = make(original)
        self._patches.append(_Patch(owner, name, had_own, original))
        setattr(owner, name, replacement)

    def _restore_all(self) -> None:
        while self._patches:
            patch = self._patches.pop()
            if patch.had_own:
                setattr(patch.owner, patch.name, patch.original)
            else:
                try:
                    delattr(patch.owner, patch.name)
                except AttributeError:
                    pass

    def observer(self) -> Observer:
        """The observer cycles go to: the one given to ``instrument``, else one from SPECOBS_*.

        Built on first use, in the process and thread that runs the engine, so loading a plugin in
        a parent process starts no threads that a fork would lose.
        """
        observer = self._observer
        if observer is None:
            with self._lock:
                observer = self._observer
                if observer is None:
                    import specobs

                    observer = specobs.configure()
                    self._observer = observer
        return observer


class LogOnce:
    """Logs the first failure of a kind on the hot path, then stays quiet (and never raises)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, what: str) -> None:
        if what in self._seen:
            return
        self._seen.add(what)
        logger.warning(
            "specobs instrumentation failed in %s; the engine continues and this is logged once.",
            what,
            exc_info=True,
        )
