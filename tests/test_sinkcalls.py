"""Calls into sinks that no sink can turn into a stop (specobs/_sinkcalls.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from specobs._sinkcalls import call_sinks, hand_on


class Sink:
    """Records what it was handed, and raises ``exc`` from ``on_cycles`` if given."""

    def __init__(self, exc: BaseException | None = None, answer: Any = True) -> None:
        self.exc = exc
        self.answer = answer
        self.got: list[Any] = []

    def on_cycles(self, cycles: Any) -> None:
        self.got.append(cycles)
        if self.exc is not None:
            raise self.exc

    def force_flush(self, timeout: float) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("exc", [RuntimeError("boom"), SystemExit(3), KeyboardInterrupt()])
def test_a_sink_that_raises_anything_is_reported_and_the_others_still_get_the_chunk(exc):
    reports: list[tuple[str, str]] = []
    first, bad, last = Sink(), Sink(exc), Sink()
    chunk: Any = ["cycle"]
    hand_on([first, bad, last], chunk, lambda kind, msg: reports.append((kind, msg())))
    assert first.got == bad.got == last.got == [chunk]
    ((kind, message),) = reports
    assert kind == "sink_error"
    assert "Sink raised" in message and type(exc).__name__ in message


def test_each_sinks_answer_comes_back_in_order_and_a_raise_reads_false():
    sinks = [Sink(answer=True), Sink(answer=RuntimeError("x")), Sink(answer=False)]
    assert call_sinks(sinks, "force_flush", time.monotonic() + 5) == [True, False, False]


def test_a_sink_that_never_returns_is_left_behind_as_none():
    release = threading.Event()

    class Stuck(Sink):
        def force_flush(self, timeout: float) -> Any:
            release.wait(30)
            return True

    try:
        got = call_sinks([Sink(), Stuck()], "force_flush", time.monotonic())
    finally:
        release.set()
    assert got == [True, None]
