"""Calls into the sinks that no sink can turn into a stop of the resolver or of the process.

``on_cycles`` runs on the resolver's thread: whatever it raises is that sink's failure, counted
and logged, and the other sinks still get the chunk (:func:`hand_on`). ``force_flush`` and
``shutdown`` run on a daemon thread per sink, all at once, joined until a deadline
(:func:`call_sinks`): a sink that blocks costs its share of the time and a log line, never a
hung ``shutdown()`` or interpreter exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from specobs._model import ResolvedCycle
from specobs._recorder import short_repr

if TYPE_CHECKING:
    from specobs.sinks._base import Sink

__all__ = ["SINK_CALL_GRACE_SECONDS", "call_sinks", "hand_on"]

_log = logging.getLogger("specobs")


def _sink_failed(sink: Any, exc: BaseException) -> Callable[[], str]:
    """The message for a sink whose ``on_cycles`` raised, built only if logged."""
    return lambda: (f"sink {type(sink).__name__} raised {short_repr(exc, 200)} from on_cycles; "
                    f"its cycles of that chunk are lost to it (the aggregation has them)")



def hand_on(
    sinks: Sequence[Sink], out: list[ResolvedCycle], misuse: Callable[[str, Any], None]
) -> None:
    """A chunk's resolved cycles to every sink; a sink that raises is reported to ``misuse``
    as ``sink_error``."""
    for sink in sinks:
        try:
            sink.on_cycles(out)
        except BaseException as exc:
            # Whatever a sink raises -- SystemExit from a library's sys.exit(),
            # KeyboardInterrupt, CancelledError -- is the sink's failure, not a reason for the
            # resolver's thread to end: those cycles are missing from that sink alone.
            misuse("sink_error", _sink_failed(sink, exc))


#: How long past its deadline a sink call may take before it is left behind: a sink that honours
#: its timeout returns at about the deadline (finishing an export it cut short, closing a
#: socket), and must not be mistaken for one that hangs. The bound of ``force_flush`` /
#: ``shutdown`` is their timeout plus this, per call.
SINK_CALL_GRACE_SECONDS = 0.2


def call_sinks(sinks: Sequence[Sink], method: str, deadline: float) -> list[object]:
    """``sink.<method>(remaining seconds)`` for every sink, each on a daemon thread, all at once,
    joined until ``deadline`` plus :data:`SINK_CALL_GRACE_SECONDS`.

    A sink's ``force_flush`` and ``shutdown`` must return within their timeout (``Sink``'s
    contract), but a custom sink that blocks would otherwise hang ``shutdown()`` and the
    interpreter's exit with it, and one slow sink would take the time of those after it.
    Returns, per sink, what the call returned, ``False`` when it raised, and ``None`` when it
    had not returned in time (logged; its thread is left behind, a daemon).
    """
    results: list[list[object]] = [[] for _ in sinks]

    def call(sink: Sink, out: list[object]) -> None:
        try:
            out.append(getattr(sink, method)(max(0.0, deadline - time.monotonic())))
        except Exception as exc:
            _log.warning("specobs: sink %r %s failed: %r", sink, method, exc)
            out.append(False)

    threads = [
        threading.Thread(target=call, args=(sink, out), name=f"specobs-sink-{method}", daemon=True)
        for sink, out in zip(sinks, results, strict=True)
    ]
    for t in threads:
        t.start()
    until = max(deadline, time.monotonic()) + SINK_CALL_GRACE_SECONDS
    for t in threads:
        t.join(max(0.0, until - time.monotonic()))
    for sink, out in zip(sinks, results, strict=True):
        if not out:
            _log.warning(
                "specobs: sink %r did not return from %s within its timeout; going on without it",
                sink, method,
            )
    return [out[0] if out else None for out in results]
