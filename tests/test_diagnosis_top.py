"""``specobs top``'s status line: the diagnosis of each poll's interval, in the live view and the
plain line, and the speedup next to the baseline."""

from __future__ import annotations

import io

import pytest

from specobs.tools import _diagnosis as dg
from specobs.tools import _top
from tests.test_diagnosis import win

pytest.importorskip("rich")


def _render(frame: _top.Frame) -> str:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    view = _top.LiveView("test", 2.0, console)
    console.print(view.render(frame, None))
    return out.getvalue()


def test_a_collapsed_draft_shows_in_the_status_line() -> None:
    w = win(positions=(0.18, 0.175, 0.175, 0.175), baseline=300.0)
    frame = _top._data_frame(w.breakdown, tuple(dg.diagnose(w)))
    text = _render(frame)
    assert "status FAIL: SPEC-ACCEPT-COLLAPSE: the draft disagrees with the target from its " \
           "first token" in " ".join(text.split())
    assert "status=fail(SPEC-ACCEPT-COLLAPSE)" in _top.plain_line(frame)


def test_healthy_status_and_the_speedup_next_to_the_baseline() -> None:
    w = win(baseline=300.0)
    frame = _top._data_frame(w.breakdown, tuple(dg.diagnose(w)))
    text = _render(frame)
    assert "status OK: no problem found" in text
    assert "baseline 300.0 tok/s, speedup 2.73x" in text
    assert _top.plain_line(frame).endswith("status=ok")


def test_a_stall_replaces_the_idle_guess() -> None:
    w = win(cycles=0, running=4, waiting=0, elapsed=2.0)
    frame = _top._data_frame(w.breakdown, tuple(dg.diagnose(w)))
    assert frame.message.startswith("decoding is stalled: 4 requests running")
    assert "(idle?)" not in _top.plain_line(frame)
    idle = _top._data_frame(win(cycles=0).breakdown)
    assert "(idle?)" in idle.message


def test_frames_without_findings_keep_their_old_line() -> None:
    w = win()
    assert "status=" not in _top.plain_line(_top._data_frame(w.breakdown))
