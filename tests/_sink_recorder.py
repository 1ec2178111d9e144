"""A real specobs observer exporting through a real PrometheusSink, fed speculative cycles on a
fake GPU by a background thread: the scrape target the Prometheus tests point a real
Prometheus at.

Subclass :class:`SinkRecorder`, set what :meth:`SinkRecorder.step` reads, then call
``super().__init__(...)``, which starts the thread; :meth:`SinkRecorder.stop` ends it and shuts
the observer down, as does leaving a ``with`` block. The caller checks that
``specobs.PrometheusSink`` is importable first (it needs ``prometheus_client``) and skips
otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import specobs
from specobs.timing import FakeEventClock, FakeGpu

_R = TypeVar("_R", bound="SinkRecorder")


class SinkRecorder:
    """The observer (``obs``), its sink (``sink``) and fake GPU (``gpu``); a thread calls
    :meth:`step` then waits ``pause_seconds``, until :meth:`stop`."""

    def __init__(
        self,
        *,
        name: str,
        pool_size: int,
        max_draft_length: int,
        labels: dict[str, str],
        pause_seconds: float,
        **settings: Any,
    ) -> None:
        self.gpu = FakeGpu()
        self.sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
        self.obs = specobs.configure(
            sinks=[self.sink],
            clock=FakeEventClock(self.gpu, pool_size=pool_size),
            sample_every=1,
            max_draft_length=max_draft_length,
            labels=labels,
            poll_interval_seconds=0.02,
            **settings,
        )
        self._pause_seconds = pause_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        """``host:port`` of the sink's /metrics, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.sink.port}"

    def cycle(self, accepted: Sequence[int], draft_length: int) -> None:
        """One speculative cycle: draft, verify and bookkeeping on the fake GPU, ``accepted``
        draft tokens per sequence out of ``draft_length``."""
        with self.obs.cycle(batch_size=len(accepted)) as cycle:
            self.gpu.run(200_000)
            cycle.mark("verify")
            self.gpu.run(600_000)
            cycle.mark("bookkeeping")
            self.gpu.run(100_000)
            cycle.accept(list(accepted), draft_length=draft_length)
        self.gpu.complete()

    def step(self) -> None:
        """What the thread does between pauses."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self._pause_seconds)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.obs.shutdown(5)

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
