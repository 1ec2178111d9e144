"""A request the engine serves, as its caller holds it, and the engine's counters.

:class:`RequestHandle` is what ``SpecDecodeEngine.submit`` returns: tokens arrive on the engine
thread and may be read, streamed or waited for from any other. :class:`EngineStats` is one
reading of the engine's counters (``/health`` shows it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from specobs.tools._breakdown import ratio

__all__ = ["EngineStats", "RequestHandle", "TokenCallback"]

_log = logging.getLogger("specobs.demo")

TokenCallback = Callable[[list[int], bool], None]


class RequestHandle:
    """A submitted request. Tokens arrive incrementally (thread-safe to read from any thread).

    ``tokens`` is a snapshot of the output so far; ``stream()`` yields new chunks as they come;
    ``wait()`` / ``future`` give the whole output; ``finish_reason`` is ``"length"`` (max_tokens
    reached or the sequence filled ``max_seq_len``), ``"stop"`` (eos generated; the eos token is
    not part of the output) or ``"cancelled"``. ``drafted_tokens`` / ``accepted_tokens``: its
    draft tokens so far and those the target accepted (reported to the observer with
    ``trace_id`` when it finishes, ``Observer.request_finished``).
    """

    def __init__(
        self, request_id: int, prompt_ids: list[int], max_tokens: int, eos_id: int | None,
        trace_id: int | None = None,
    ) -> None:
        self.id = request_id
        self.trace_id = trace_id
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.prompt_ids = tuple(prompt_ids)
        self.max_tokens = max_tokens
        self.eos_id = eos_id
        self.future: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        self.finish_reason: str | None = None
        self.submitted_at = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._tokens: list[int] = []
        self._cond = threading.Condition()
        self._callbacks: list[TokenCallback] = []
        self._cancelled = False

    @property
    def tokens(self) -> list[int]:
        with self._cond:
            return list(self._tokens)

    @property
    def done(self) -> bool:
        return self.future.done()

    def add_callback(self, fn: TokenCallback) -> None:
        """Call ``fn(new_tokens, done)`` on the engine thread whenever tokens arrive (and once
        with what already arrived). Keep it quick, e.g. ``loop.call_soon_threadsafe``."""
        with self._cond:
            self._callbacks.append(fn)
            have, done = list(self._tokens), self.future.done()
        if have or done:
            fn(have, done)

    def wait(self, timeout: float | None = None) -> list[int]:
        """The whole output; raises ``TimeoutError`` after ``timeout`` seconds."""
        return self.future.result(timeout)

    def stream(self, timeout: float | None = None) -> Iterator[list[int]]:
        """Yield chunks of new tokens until the request is done; ``TimeoutError`` when nothing
        arrives for ``timeout`` seconds."""
        seen = 0
        while True:
            with self._cond:
                if len(self._tokens) == seen and not self.future.done():
                    if not self._cond.wait(timeout) and len(self._tokens) == seen:
                        raise TimeoutError(f"no token for request {self.id} in {timeout} s")
                chunk = self._tokens[seen:]
                finished = self.future.done() and len(self._tokens) == seen + len(chunk)
            seen += len(chunk)
            if chunk:
                yield chunk
            if finished:
                return

    def cancel(self) -> None:
        """Stop generating (e.g. the client went away); the engine frees the slot next step."""
        self._cancelled = True

    # Engine side -------------------------------------------------------------------------
    def _emit(self, new: list[int], finish_reason: str | None) -> None:
        with self._cond:
            if new and self.first_token_at is None:
                self.first_token_at = time.monotonic()
            self._tokens.extend(new)
            if finish_reason is not None:
                self.finish_reason = finish_reason
                self.finished_at = time.monotonic()
            callbacks = list(self._callbacks)
            self._cond.notify_all()
        if finish_reason is not None and not self.future.done():
            self.future.set_result(self.tokens)
            with self._cond:
                self._cond.notify_all()
        for fn in callbacks:
            try:
                fn(new, finish_reason is not None)
            except Exception:  # a consumer's bug must not stop the engine
                _log.exception("token callback of request %d failed", self.id)

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self.finish_reason = "error"
            self.finished_at = time.monotonic()
        if not self.future.done():
            self.future.set_exception(exc)
        with self._cond:
            self._cond.notify_all()
            callbacks = list(self._callbacks)
        for fn in callbacks:
            with contextlib.suppress(Exception):
                fn([], True)


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Counters since the engine started. ``acceptance_rate`` = accepted / drafted tokens;
    ``mean_accept_length`` = accepted draft tokens per sequence per cycle (0..k)."""

    cycles: int
    prefills: int
    requests_submitted: int
    requests_finished: int
    active: int
    waiting: int
    draft_tokens: int
    accepted_tokens: int
    emitted_tokens: int
    sequence_cycles: int
    k: int
    fault: str | None

    @property
    def acceptance_rate(self) -> float:
        # 0.0 before anything was drafted: /health's JSON has always carried a number here.
        return ratio(self.accepted_tokens, self.draft_tokens) or 0.0

    @property
    def mean_accept_length(self) -> float:
        return ratio(self.accepted_tokens, self.sequence_cycles) or 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["acceptance_rate"] = self.acceptance_rate
        out["mean_accept_length"] = self.mean_accept_length
        return out
