"""The observers still open in this process: rebuilt in a forked child, shut down at exit.

The observer registers itself here when it starts recording and leaves at ``shutdown()``; the
hooks are installed with the first one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Protocol

from specobs._aggregation import Aggregation
from specobs._config import exit_timeout_seconds

__all__ = ["install_hooks", "live"]

_log = logging.getLogger("specobs")


class _Open(Protocol):
    """What the hooks use of an observer (:class:`specobs._observer.Observer`)."""

    aggregation: Aggregation

    @property
    def closed(self) -> bool: ...

    def shutdown(self, timeout_seconds: float = 5.0) -> None: ...

    def _after_fork_in_child(self) -> None: ...


#: Every observer not yet shut down, held strongly: an observer the user keeps only in a local
#: variable (``def main(): obs = configure(...)``) still has its threads and endpoint running
#: after that variable is gone, so the exit hook must still find it, flush it and stop them.
#: ``shutdown()`` removes it. Insertion-ordered, so the exit hook shuts down in creation order.
live: dict[int, _Open] = {}
_installed = False


def _after_fork_in_child() -> None:
    for obs in list(live.values()):
        try:
            obs._after_fork_in_child()
        except Exception as exc:  # pragma: no cover - never break the child
            _log.warning("specobs: could not rebuild the observer after fork: %r", exc)


def install_hooks() -> None:
    """Rebuild the open observers in a forked child, and shut them down at exit (once)."""
    global _installed
    if not _installed:
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_at_exit)
        _installed = True


def _at_exit() -> None:
    """Shut down every observer still open when the interpreter exits.

    Engine integrations never call ``shutdown()``; without this the records of the last poll
    interval and the final OTLP export were lost. Bounded by ``SPECOBS_EXIT_TIMEOUT_SECONDS``
    (default 5 s) for all observers together; what could not be delivered in time is counted
    (``dropped{reason="shutdown"}`` for records, ``span_export`` / ``metric_export`` for OTLP,
    counted before the final export so a collector that is up still receives the counts) and
    named in one log line.
    """
    observers = [o for o in list(live.values()) if not o.closed]
    if not observers:
        return
    timeout = exit_timeout_seconds()
    # On a daemon thread, joined for the timeout: each observer's shutdown is bounded, but a
    # custom sink that ignores its timeout must not keep the interpreter from exiting.
    done = threading.Thread(
        target=_shutdown_all, args=(observers, time.monotonic() + timeout),
        name="specobs-exit", daemon=True,
    )  # fmt: skip
    done.start()
    done.join(timeout + _EXIT_GRACE_SECONDS)
    if done.is_alive():
        _log.warning(
            "specobs: at exit, the shutdown of %d observer(s) did not finish within %.3g s (a "
            "sink that does not return?); exiting without it", len(observers), timeout,
        )


#: How long past ``SPECOBS_EXIT_TIMEOUT_SECONDS`` the exit hook waits for the shutdowns (their
#: own bounds are the timeout; this covers the thread's start and the final log line).
_EXIT_GRACE_SECONDS = 0.5


def _shutdown_all(observers: list[_Open], deadline: float) -> None:
    for i, obs in enumerate(observers):
        share = max(0.0, deadline - time.monotonic()) / (len(observers) - i)
        try:
            before = obs.aggregation.snapshot()
            obs.shutdown(share)
            after = obs.aggregation.snapshot()
        except Exception as exc:  # never a traceback at exit
            _log.warning("specobs: exit flush failed: %r", exc)
            continue
        lost = {
            reason: after.dropped.get(reason, 0) - before.dropped.get(reason, 0)
            for reason in ("shutdown", "span_export", "metric_export")
        }
        if any(lost.values()):
            _log.warning(
                "specobs: at exit, within %.3g s, could not deliver %d cycle records, %d spans "
                "and %d metric exports (counted in specobs_exporter_dropped_records_total)",
                share, lost["shutdown"], lost["span_export"], lost["metric_export"],
            )
