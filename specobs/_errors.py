"""The exceptions specobs raises.

Only configuration raises. The hot path (``begin``/``mark``/``accept``/``end``) never raises into
the worker: misuse there is logged once (rate-limited) and counted in
``specobs_exporter_errors_total{kind}``.

::

    SpecobsError
    ├── ConfigurationError        a bad argument or environment variable
    ├── MissingDependencyError    an optional extra is not installed (also an ImportError)
    └── ObserverClosedError       a blocking call on an observer after shutdown()
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "MissingDependencyError",
    "ObserverClosedError",
    "SpecobsError",
]


class SpecobsError(Exception):
    """Base class of every exception specobs raises."""


class ConfigurationError(SpecobsError, ValueError):
    """A setting is invalid. The message names the setting, what was expected and what was got."""


class MissingDependencyError(SpecobsError, ImportError):
    """An optional dependency is missing. The message names the ``pip install`` that fixes it."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the '{module}' package, which is not installed. "
            f"Install it with: pip install 'specobs[{extra}]'"
        )
        self.extra = extra
        self.module = module


class ObserverClosedError(SpecobsError, RuntimeError):
    """A blocking call was made on an observer that has been shut down."""


def require(module: str, *, feature: str, extra: str) -> None:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(feature, extra, module) from exc
