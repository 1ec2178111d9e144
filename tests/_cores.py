"""Fixtures for tests that run on both rings (the native core and its pure-Python
specification) with observers they make and shut down."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import specobs
from specobs import _ring

CORES = ["native", "python"] if _ring.BUILT else ["python"]
PHASES = ("draft", "verify", "bookkeeping")
#: The observers' ``max_draft_length``.
K = 4


@pytest.fixture(params=CORES)
def core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ring the observers made in the test use."""
    monkeypatch.setattr(_ring, "NATIVE", request.param == "native")
    return str(request.param)


def observer_factory(**defaults: Any) -> Iterator[Callable[..., specobs.Observer]]:
    """``new(**configure_kwargs)`` over ``defaults``, each observer shut down when the generator
    is closed: the body of every observer-making fixture."""
    made: list[specobs.Observer] = []

    def new(**kwargs: Any) -> specobs.Observer:
        obs = specobs.configure(**{**defaults, **kwargs})
        made.append(obs)
        return obs

    yield new
    for obs in made:
        obs.shutdown(2.0)


@pytest.fixture
def observers() -> Iterator[Callable[..., specobs.Observer]]:
    """``new(**configure_kwargs)``: host-clock observers with :data:`PHASES` and :data:`K`, a
    memory sink and no periodic flush unless told; all shut down after the test."""
    yield from observer_factory(clock="host", phases=PHASES, max_draft_length=K,
                                poll_interval_seconds=3600, sinks=[specobs.MemorySink()])
