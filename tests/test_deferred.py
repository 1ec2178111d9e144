"""Deferred acceptance: a cycle ended by ``defer()`` has its times final and its acceptance given
later by ``settle()`` (from any thread), or by nobody within the resolver's timeout (counted
``dropped_records{reason="unsettled"}``: its times kept, its tokens not). On both rings: the
native core and its pure-Python specification (specobs/_ring.py) must give the same chunks and
counters for any stream of calls.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import specobs
from specobs import _ring
from tests.test_ring import PHASES, acceptance_input, make_random, normalise

CORES = ["native", "python"] if _ring.BUILT else ["python"]


@pytest.fixture(params=CORES)
def core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(_ring, "NATIVE", request.param == "native")
    return str(request.param)


def observer(**kwargs: Any) -> Any:
    kwargs.setdefault("poll_interval_seconds", 3600)
    return specobs.configure(sinks=[specobs.MemorySink()], clock="host",
                             phases=("draft", "verify", "bookkeeping"), **kwargs)  # fmt: skip


def ended(obs: Any, batch: int | None = None) -> Any:
    """A cycle with its three phases run, still open."""
    c = obs.begin(batch)
    c.mark("verify")
    c.mark("bookkeeping")
    return c


def counts(obs: Any, timeout: float = 5.0) -> dict[str, Any]:
    flushed = obs.force_flush(timeout)
    s = obs.snapshot()
    return {
        "flushed": flushed, "cycles": s.cycles_total, "drafted": s.draft_tokens_total,
        "accepted": s.accepted_tokens_total, "emitted": s.emitted_tokens_total,
        "accept_length": (s.accept_length.count, s.accept_length.sum),
        "batch": (s.batch_size.count, s.batch_size.sum),
        "phases": [s.phase_histograms[(p, "host")].count for p in ("draft", "verify")],
        "unsettled": s.dropped["unsettled"], "bad_settle": s.errors["bad_settle"],
        "queue_full": s.dropped["queue_full"],
    }  # fmt: skip


def test_a_deferred_cycle_counts_what_settle_gives_after_a_later_cycle_began(core: str) -> None:
    obs = observer()
    try:
        first = ended(obs, 4)
        first.accept([1, 2, 3, 0], draft_length=3)  # replaced by what settle() gives
        handle = first.defer()
        assert handle is first
        second = ended(obs, 2)
        second.accept([3, 3], draft_length=3)
        second.end()
        # The second cycle waits behind the first (the drain takes cycles in order).
        before = counts(obs, timeout=0.3)
        assert not before["flushed"] and before["cycles"] == 0
        # The rows that finished in flight left out (the batch size as accept() takes it).
        handle.settle([1, 2], draft_length=3, batch_size=2)
        assert counts(obs) == {
            "flushed": True, "cycles": 2, "drafted": 6 + 6, "accepted": 3 + 6,
            "emitted": 5 + 8, "accept_length": (4, 9), "batch": (2, 4), "phases": [2, 2],
            "unsettled": 0, "bad_settle": 0, "queue_full": 0,
        }  # fmt: skip
    finally:
        obs.shutdown()


def test_settle_none_counts_the_times_and_no_tokens(core: str) -> None:
    obs = observer()
    try:
        c = ended(obs, 3)
        c.accept([1, 1, 1], draft_length=2)
        c.defer().settle(None)
        assert counts(obs) == {
            "flushed": True, "cycles": 1, "drafted": 0, "accepted": 0, "emitted": 0,
            "accept_length": (0, 0), "batch": (0, 0), "phases": [1, 1], "unsettled": 0,
            "bad_settle": 0, "queue_full": 0,
        }  # fmt: skip
    finally:
        obs.shutdown()


def test_a_cycle_never_settled_is_counted_unsettled_after_the_timeout(core: str) -> None:
    obs = observer(settle_timeout_seconds=0.05)
    try:
        c = ended(obs, 2)
        c.accept([2, 2], draft_length=2)
        handle = c.defer()
        after = ended(obs, 1)
        after.accept([1], draft_length=2)
        after.end()
        time.sleep(0.1)
        assert counts(obs) == {
            "flushed": True, "cycles": 2, "drafted": 2, "accepted": 1, "emitted": 2,
            "accept_length": (1, 1), "batch": (1, 1), "phases": [2, 2], "unsettled": 1,
            "bad_settle": 0, "queue_full": 0,
        }  # fmt: skip
        handle.settle([2, 2], draft_length=2)  # too late: counted, never raised, not counted
        got = counts(obs)
        assert (got["cycles"], got["accepted"], got["bad_settle"]) == (2, 1, 1)
    finally:
        obs.shutdown()


def test_misuse_is_counted_never_raised(core: str) -> None:
    obs = observer()
    try:
        c = ended(obs, 1)
        c.settle([1], draft_length=2)  # not deferred: counted; the cycle stays open
        c.defer()
        c.defer()  # ended already: end_without_begin
        c.settle([1], draft_length=2)
        c.settle([1], draft_length=2)  # twice
        c.accept([2], draft_length=2)  # after it ended
        c.end()
        plain = ended(obs, 1)
        plain.end()
        plain.settle([1], draft_length=2)  # never deferred
        s = counts(obs)
        assert (s["cycles"], s["accepted"], s["bad_settle"]) == (2, 1, 3)
        errors = obs.snapshot().errors
        assert errors["end_without_begin"] == 2 and errors["bad_acceptance"] == 1
    finally:
        obs.shutdown()


def test_a_discarded_cycle_has_nothing_to_settle(core: str) -> None:
    obs = observer()
    try:
        c = obs.begin(1)  # one phase short: defer() discards it, as end() would
        handle = c.defer()
        handle.settle([1], draft_length=2)  # nothing to settle: no second count
        s = counts(obs)
        assert (s["cycles"], s["bad_settle"]) == (0, 0)
        assert obs.snapshot().dropped["misuse"] == 1
    finally:
        obs.shutdown()


def test_settle_from_another_thread_while_the_worker_runs_on(core: str) -> None:
    """The output processing settles cycle N on its own thread while the worker runs N+1..."""
    obs = observer(poll_interval_seconds=0.001)
    pending: list[Any] = []
    lock = threading.Condition()
    n = 300

    def settler() -> None:
        for i in range(n):
            with lock:
                while not pending:
                    lock.wait()
                handle = pending.pop(0)
            handle.settle([i % 3, 1], draft_length=2, batch_size=2)

    t = threading.Thread(target=settler)
    t.start()
    try:
        for _ in range(n):
            c = ended(obs, 5)
            c.accept([2, 2, 2, 2, 2], draft_length=2)  # the zombie-inclusive view: replaced
            handle = c.defer()
            with lock:
                pending.append(handle)
                lock.notify()
        t.join(30)
        assert not t.is_alive()
        accepted = sum(i % 3 + 1 for i in range(n))
        assert counts(obs) == {
            "flushed": True, "cycles": n, "drafted": 4 * n, "accepted": accepted,
            "emitted": accepted + 2 * n, "accept_length": (2 * n, accepted),
            "batch": (n, 2 * n), "phases": [n, n], "unsettled": 0, "bad_settle": 0,
            "queue_full": 0,
        }  # fmt: skip
    finally:
        obs.shutdown()


def test_a_deferred_cycle_in_a_full_ring_is_dropped_and_counted_unsettled(core: str) -> None:
    """A ring that fills before the resolver hands the deferred cycle on (here: no backlog
    rule) drops it with its times, counted as never settled, not as the queue's fault."""
    obs = observer(queue_size=16)
    try:
        obs._recorder.ring.settle_backlog = 1 << 30
        first = ended(obs, 1).defer()
        for _ in range(20):
            c = ended(obs, 1)
            c.accept([1], draft_length=1)
            c.end()
        first.settle([1], draft_length=1)  # its slot is gone: late
        s = counts(obs)
        assert s["unsettled"] == 1 and s["bad_settle"] == 1
        assert s["cycles"] + s["queue_full"] == 20
        assert s["accepted"] == s["cycles"]
        assert obs._recorder.ring.deferred == 0
    finally:
        obs.shutdown()


def test_a_cycle_never_settled_holds_up_at_most_the_backlog(
        core: str, caplog: pytest.LogCaptureFixture) -> None:
    """Third hostile review, case 13: a deferred cycle whose settling thread died. The drain
    takes cycles in order, so the ones behind it wait; before, they waited until the ring was
    full (2.7 s at 3,000 cycles/s, with a 5 s timeout), and then the deferred one was dropped
    as ``queue_full``. Now it is handed on, with its times and without tokens, counted
    ``unsettled`` and said once, as soon as ``settle_backlog`` cycles wait behind it, whatever
    ``settle_timeout_seconds`` says; nothing behind it is lost."""
    obs = observer(queue_size=256, settle_timeout_seconds=3600)
    backlog = obs._recorder.ring.settle_backlog
    assert backlog == 64  # a quarter of the queue (the worker's wake-up), half of it at most

    def engine(n: int) -> None:
        for _ in range(n):
            c = ended(obs, 2)
            c.accept([1, 2], draft_length=2)
            c.end()

    def settler(handle: Any) -> None:
        raise RuntimeError("the settling thread died before settle()")

    try:
        with caplog.at_level("WARNING", logger="specobs"):
            lost = ended(obs, 2).defer()
            t = threading.Thread(target=settler, args=(lost,))
            with pytest.MonkeyPatch.context() as mp:  # its traceback is the point, not noise
                mp.setattr(threading, "excepthook", lambda args: None)
                t.start()
                t.join()
            engine(backlog - 1)
            # Held up, waiting for a settle() that may still come.
            held = counts(obs, timeout=0.3)
            assert (held["flushed"], held["cycles"], held["unsettled"]) == (False, 0, 0)
            engine(1)
            s = counts(obs)
            assert s["flushed"] is True
            assert (s["cycles"], s["unsettled"], s["queue_full"]) == (backlog + 1, 1, 0)
            assert s["phases"] == [backlog + 1] * 2  # its times counted
            assert s["accepted"] == 3 * backlog  # its tokens not
            # The engine goes on: nothing behind the lost cycle waits or is lost.
            for _ in range(10):
                engine(backlog)
                assert obs.force_flush(5) is True
            # Another one lost the same way: counted, not said again.
            ended(obs, 2).defer()
            engine(backlog)
            s = counts(obs)
            assert (s["cycles"], s["unsettled"], s["queue_full"]) == (12 * backlog + 2, 2, 0)
        lines = [r.getMessage() for r in caplog.records if "never settled" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "settle_timeout_seconds=3600" in lines[0] and f"{backlog} cycles" in lines[0]
        assert 'dropped_records{reason="unsettled"}' in lines[0]
    finally:
        obs.shutdown()


def test_shutdown_counts_a_cycle_still_deferred_unsettled(core: str) -> None:
    obs = observer()
    ended(obs, 1).defer()
    done = ended(obs, 1)
    done.accept([1], draft_length=1)
    done.end()
    obs.shutdown(timeout_seconds=2.0)
    s = obs.snapshot()
    assert (s.cycles_total, s.accepted_tokens_total, s.dropped["unsettled"]) == (2, 1, 1)


def run_stream(kind: str, seed: int) -> list[Any]:
    """Random calls, defer/settle/expire among them, straight on a ring."""
    rng = random.Random(seed)
    # Sampled cycles: events held by deferred slots too.
    ring, slow = make_random(kind, seed, rng, [4, 16, 64], sampled=0.5, intervals=[1, 2, 5])
    log: list[Any] = []
    handles: list[Any] = []
    deferred: list[Any] = []
    for step in range(400):
        u = rng.random()
        c = handles[-1] if handles else None
        if u < 0.15 or c is None:
            c = ring.begin(rng.choice([None, 4, 8]))
            handles = [*handles[-3:], c]
        elif u < 0.35:
            for phase in PHASES[1:]:
                c.mark(phase)
        elif u < 0.45:
            acc, kw = acceptance_input(rng)
            c.accept(acc, **kw)
        elif u < 0.6:
            h = c.defer()
            assert h is c
            deferred = [*deferred[-5:], c]
        elif u < 0.65:
            c.end()
        elif u < 0.78 and deferred:
            h = deferred.pop(rng.randrange(len(deferred))) if rng.random() < 0.9 else c
            if rng.random() < 0.2:
                h.settle(None)
            else:
                acc, kw = acceptance_input(rng)
                h.settle(acc, **kw)
        elif u < 0.83:
            log.append(("expire", ring.expire(rng.choice([0, 997 * 20, 1 << 40]))))
        elif u < 0.95:
            held, bound = ring.pending(rng.choice([1, 4, 32]))
            log.append(("pending", normalise(held), bound))
            log.append(("drain_into", normalise(
                ring.drain_into(bound, rng.choice([2, 8, 1000]), [], -1, rng.random() < 0.2))))
        elif u < 0.97:
            log.append(("dropped", normalise(ring.take_dropped())))
        else:
            log.append(("clear", ring.clear_queue()))
            ring.forget_current()
        log.append(("counters", step, ring.begun, ring.enqueued, ring.dropped_queue_full,
                    ring.discarded, len(ring), ring.deferred, ring.unsettled,
                    ring.held_cycles, ring.poll(8, None, 4)))
    log.append(("expire", ring.expire(0)))
    log.append(("final", normalise(ring.drain_into(1 << 60, 1 << 30, [], -1, True))))
    log.append(("totals", normalise(ring.totals()), ring.drained))
    log.append(("calls", slow.calls))
    return log


@pytest.mark.parametrize("seed", range(40))
def test_native_deferral_equals_its_specification(seed: int) -> None:
    python = run_stream("python", seed)
    if not _ring.BUILT:
        pytest.skip("the native core is not built")
    native = run_stream("native", seed)
    assert len(native) == len(python)
    for a, b in zip(native, python, strict=True):
        assert a == b


def test_the_streams_defer_settle_and_expire() -> None:
    logs = [run_stream("python", seed) for seed in range(40)]
    counters = [e for log in logs for e in log if e[0] == "counters"]
    assert any(e[7] > 0 for e in counters)  # cycles awaiting settle
    assert any(e[8] > 0 for e in counters)  # handed on unsettled
    calls = [c for log in logs for c in log[-1][1]]
    assert ("misuse", "bad_settle") in calls


_FORK_SCRIPT = """
import json, os, sys
import specobs
obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host", poll_interval_seconds=0.01)
def cycle():
    c = obs.begin(1); c.mark("verify"); c.mark("bookkeeping")
    return c
pending = cycle().defer()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        out = {"deferred": obs._recorder.ring.deferred}
        pending.settle([1], draft_length=1)  # the parent's cycle: not the child's to count
        c = cycle(); c.accept([1], draft_length=1); c.end()
        out["flushed"] = obs.force_flush(5)
        s = obs.snapshot()
        out.update(cycles=s.cycles_total, accepted=s.accepted_tokens_total,
                   fork=s.dropped["fork"], bad_settle=s.errors["bad_settle"])
        obs.shutdown(2)
        os.write(w, json.dumps(out).encode())
    finally:
        os._exit(0)
os.close(w)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 4096))
pending.settle([1], draft_length=1)
assert obs.force_flush(5)
s = obs.snapshot()
print(json.dumps({"child": child, "parent": [s.cycles_total, s.accepted_tokens_total]}))
obs.shutdown()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("kind", CORES)
def test_a_forked_child_drops_the_parents_deferred_cycle_and_counts_it(kind: str) -> None:
    env = {**os.environ, "SPECOBS_CORE": kind, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["child"] == {"deferred": 0, "flushed": True, "cycles": 1, "accepted": 1,
                            "fork": 1, "bad_settle": 1}  # fmt: skip
    assert out["parent"] == [1, 1]
