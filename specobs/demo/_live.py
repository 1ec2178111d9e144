"""What ``specobs demo`` prints while it serves and when it ends.

While serving: a rich view on a terminal, else a line every few seconds, of the rates over the
last few seconds (steady, yet current after a fault switch). At the end: the whole serving
window's summary. Both render :mod:`._summary`'s view of the observer's snapshots.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from ._stages import PLAIN_INTERVAL_SECONDS, DemoRun, say

__all__ = ["Stop", "final_summary", "summarize_live"]

_LIVE_INTERVAL_SECONDS = 1.0
_FIRST_PLAIN_SECONDS = 2.0
"""Plain output shows the first cycle breakdown this soon after serving starts, then every
``PLAIN_INTERVAL_SECONDS``."""


class Stop(Exception):
    """``--duration`` has passed."""


def _training_text(engine: Any) -> str:
    """The draft head's training while it runs in the background (or how it ended badly);
    empty once it trained, or with the shipped weights."""
    pending = getattr(getattr(engine, "models", None), "pending", None)
    if pending is None or (pending.done.is_set() and pending.error is None):
        return ""
    return str(pending.status())


def _requests_text(engine: Any, load: Any) -> str:
    s = engine.stats()
    text = f"{s.active} running, {s.waiting} waiting, {s.requests_finished} finished"
    if load is not None:
        text += f"; load {load.requests_ok} ok, {load.requests_failed} failed"
        if load.errors:
            text += " (" + ", ".join(f"{k} {v}" for k, v in load.errors.most_common(3)) + ")"
    return text



def summarize_live(r: DemoRun, where: list[str], *, live: bool) -> None:
    """The summary while serving: a rich view on a terminal, a line every few seconds
    otherwise, of the rates over the last few seconds; until ``--duration`` has passed
    (:class:`Stop`) or Ctrl-C (``KeyboardInterrupt``)."""
    from . import _summary

    args, engine, observer = r.args, r.engine, r.observer
    assert engine is not None and observer is not None
    # --duration counts from here: serving and load, not start-up.
    r.first = first = observer.snapshot()
    r.first_at = first_at = time.monotonic()
    deadline = None if args.duration is None else first_at + args.duration
    title = (f"specobs demo — {args.device}, k={args.k}, max batch {args.max_batch}"
             + ("" if args.duration is None else f", {args.duration:g} s")
             + " — Ctrl-C stops")
    if not live:
        for line in where:
            say(line)

    def wait_until(t: float) -> None:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Stop
            if now >= t:
                return
            time.sleep(min(0.2, t - now))

    # Rates over the last few seconds: steady, yet current after a fault switch.
    history: collections.deque[tuple[float, Any]] = collections.deque([(first_at, first)])
    window = 5.0
    interval = _LIVE_INTERVAL_SECONDS if live else PLAIN_INTERVAL_SECONDS

    def frame() -> tuple[Any, str, str]:
        snap, now = observer.snapshot(), time.monotonic()
        while len(history) > 1 and now - history[1][0] >= window:
            history.popleft()
        then, old = history[0]
        history.append((now, snap))
        view = _summary.compute_view(snap, old, now - then, r.baseline())
        return view, _requests_text(engine, r.load_summary), _training_text(engine)

    next_at = first_at
    if live:
        from rich.live import Live

        with Live(refresh_per_second=4, transient=False) as view_live:
            while True:
                next_at += interval
                wait_until(next_at)
                view, requests, training = frame()
                view_live.update(_summary.render_rich(
                    view, title=title, fault=engine.fault, requests=requests, where=where,
                    baseline_note=r.baseline_note, training=training,
                ))  # fmt: skip
    else:
        next_at += min(_FIRST_PLAIN_SECONDS, interval) - interval
        while True:
            next_at += interval
            wait_until(next_at)
            view, requests, training = frame()
            say(f"[{time.monotonic() - r.started:6.1f} s] " + _summary.plain_line(
                view, fault=engine.fault, requests=requests, training=training))



def final_summary(r: DemoRun, interrupted: bool) -> int:
    """The whole serving window's summary, and the exit status."""
    from . import _summary

    if r.final is None or r.engine is None or r.first is None:
        return 130 if interrupted else 1
    seconds = r.final_at - r.first_at
    view = _summary.compute_view(r.final, r.first, seconds, r.baseline())
    say("")
    for line in _summary.final_lines(
        view, seconds=seconds, fault=r.engine.fault, baseline_note=r.baseline_note,
        requests=_requests_text(r.engine, r.load_summary),
    ):  # fmt: skip
        say(line)
    if interrupted:
        say("stopped by Ctrl-C")
    return 0
