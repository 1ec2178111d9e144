"""The hot path and acceptance under misuse: what a bad call costs, and that it is counted once.

* A misuse message shows the caller's value through a bounded ``short_repr``, and is built only
  when the rate-limited log emits it: a suppressed line never calls the value's ``repr``.
"""

from __future__ import annotations

import logging

import pytest

import specobs
from specobs._recorder import short_repr


def _observer(**kw):
    # A poll interval no test reaches: only force_flush() resolves, so a chunk is what we say.
    return specobs.configure(sinks=[], poll_interval_seconds=3600, **kw)


def _lines(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


class CountingRepr:
    """A value whose repr is expensive in a way we can count."""

    calls = 0

    def __repr__(self) -> str:
        CountingRepr.calls += 1
        return "<counting " + "z" * 10_000 + ">"


@pytest.fixture
def counting():
    CountingRepr.calls = 0
    return CountingRepr()


# -- misuse messages: built only when emitted, and bounded -----------------------------------


def test_a_suppressed_misuse_line_never_calls_the_values_repr(caplog, counting):
    caplog.set_level(logging.WARNING, logger="specobs")
    obs = _observer()
    c = obs.begin()
    for _ in range(500):
        c.mark(counting)  # unknown phase, on an open cycle
    c.mark("verify")
    for _ in range(500):
        c.mark(counting)  # still unknown (a cycle's unknown_phase keeps its times)
    c.mark("bookkeeping")
    c.end()
    for _ in range(500):
        c.mark(counting)  # the handle of an ended cycle
        obs.mark(counting)  # the observer with no open cycle
        obs.set_requests(running=counting)  # not a count
    assert obs.force_flush()
    s = obs.snapshot()
    obs.shutdown()

    assert s.errors["unknown_phase"] == 1000
    assert s.errors["mark_without_begin"] == 1000
    assert s.errors["bad_request_counts"] == 500
    assert s.cycles_total == 1
    emitted = _lines(caplog, "<counting")
    # One line per kind (rate-limited), and the repr called for those lines only.
    assert len(emitted) == 3
    assert CountingRepr.calls == len(emitted)
    assert all(len(line) < 300 for line in emitted)  # the 10,000-character repr is cut


HUGE = {
    "str": lambda: "x" * 10**7,
    "list": lambda: list(range(10**6)),
    "tuple": lambda: tuple(range(10**6)),
    "set": lambda: set(range(10**5)),
    "dict": lambda: {i: "v" * 1000 for i in range(10**4)},
    "bytes": lambda: b"y" * 10**7,
    "int": lambda: 10**100_000,  # its full repr is refused (int_max_str_digits), and quadratic
    "str-subclass": lambda: type("Str", (str,), {})("s" * 10**6),
    "list-subclass": lambda: type("List", (list,), {})(range(10**5)),
}


@pytest.mark.parametrize("make", HUGE.values(), ids=HUGE.keys())
def test_a_huge_bad_value_gives_a_short_message(caplog, make):
    caplog.set_level(logging.WARNING, logger="specobs")
    obs = _observer()
    c = obs.begin()
    c.mark(make())
    c.end()
    assert obs.force_flush()
    errors = obs.snapshot().errors
    obs.shutdown()
    assert errors["unknown_phase"] == 1
    assert errors["internal"] == 0
    (line,) = _lines(caplog, "unknown phase")
    assert len(line) < 200


def test_a_huge_container_of_slow_values_reprs_only_what_it_shows(counting):
    text = short_repr([CountingRepr() for _ in range(10_000)])
    assert 1 <= CountingRepr.calls <= 6  # the few items shown, not the 10,000
    assert len(text) <= 80 and text.startswith("[") and text.endswith("...")
    CountingRepr.calls = 0
    short_repr({i: CountingRepr() for i in range(10_000)})
    assert 1 <= CountingRepr.calls <= 4


def test_short_repr_is_bounded_and_never_raises():
    class Raises:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert short_repr(Raises()) == "<Raises>"
    assert short_repr([Raises()]).startswith("[<Raises")
    assert short_repr("verify") == "'verify'"
    assert short_repr((1,)) == "(1,)"
    assert short_repr(True) == "True"
    for value in ("x" * 1000, list(range(1000)), {"k": ["v" * 500] * 50}, 2**5000, Raises()):
        assert len(short_repr(value)) <= 80
        assert len(short_repr(value, 30)) <= 30
