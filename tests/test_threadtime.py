"""The recording thread's time on a CPU and waiting for one (``specobs_worker_thread_time``),
read from the kernel for the thread that began the last cycle, on both hot-path cores."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import specobs
from specobs import _threadtime

pytestmark = pytest.mark.skipif(
    _threadtime.read_schedstat(threading.get_native_id()) is None,
    reason="this kernel keeps no per-thread schedstat",
)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _cycles(obs: specobs.Observer, n: int, work_seconds: float = 0.0) -> None:
    for _ in range(n):
        with obs.cycle(batch_size=2) as c:
            _spin(work_seconds)
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1, 0], draft_length=2)


def test_the_recording_threads_cpu_time_is_counted_and_not_another_threads() -> None:
    obs = specobs.configure(sinks=[], clock="host")
    try:
        seen: dict[str, float] = {}

        def engine() -> None:
            _cycles(obs, 1)  # the ring learns this thread
            obs.snapshot()  # the first read only sets where counting starts
            _cycles(obs, 50, work_seconds=0.004)  # 0.2 s on a CPU
            seen.update(obs.snapshot().worker_thread_seconds)

        t = threading.Thread(target=engine)
        t.start()
        _spin(0.3)  # this thread's own CPU time is not the recording thread's
        t.join()
        assert set(seen) == {"running", "waiting"}
        assert 0.2 <= seen["running"] < 0.29, seen
    finally:
        obs.shutdown(5)


def test_waiting_for_a_cpu_is_counted_while_other_processes_take_every_core() -> None:
    obs = specobs.configure(sinks=[], clock="host")
    burners = []
    try:
        _cycles(obs, 1)
        before = obs.snapshot().worker_thread_seconds
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(2 * (os.cpu_count() or 1))]
        _cycles(obs, 50, work_seconds=0.004)
        after = obs.snapshot().worker_thread_seconds
    finally:
        for b in burners:
            b.kill()
            b.wait()
        obs.shutdown(5)
    # Three runnable processes per core or more: the thread waits at least as long as it runs,
    # give or take the scheduler's fairness, and at least a third of it on any kernel.
    ran = after["running"] - before.get("running", 0.0)
    waited = after["waiting"] - before.get("waiting", 0.0)
    assert ran >= 0.2 and waited >= ran / 3, (ran, waited)


def test_a_new_recording_thread_counts_from_its_first_read() -> None:
    tt = _threadtime.WorkerThreadTime()
    assert tt.seconds() == {}
    me = threading.get_native_id()
    tt.update(me)
    assert tt.seconds() == {"running": 0.0, "waiting": 0.0}
    _spin(0.05)
    tt.update(me)
    ran = tt.seconds()["running"]
    assert ran >= 0.05
    tt.update(2**31 - 1)  # no such thread: nothing added, nothing lost
    assert tt.seconds()["running"] == ran
    tt.after_fork_in_child()
    assert tt.seconds() == {}
