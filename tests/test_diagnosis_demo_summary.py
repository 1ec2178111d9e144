"""The demo's summary says why a speedup is below 1, in the words of the diagnosis: the draft
still warming up (acceptance rising since the start), or the reason from the data."""

from __future__ import annotations

import specobs
from specobs.demo import _summary


def _cycles(obs: specobs.Observer, n: int, accepted: list[int]) -> None:
    for _ in range(n):
        with obs.cycle(batch_size=len(accepted)) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(accepted, draft_length=4)
    assert obs.force_flush(5)


def test_a_warming_draft_is_named_and_a_fast_one_needs_no_note() -> None:
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host", max_draft_length=4,
                            env={})
    try:
        _cycles(obs, 100, [0, 0, 1, 0])  # the draft still training: little accepted
        old = obs.snapshot()
        _cycles(obs, 100, [3, 4, 2, 4])
        new = obs.snapshot()
    finally:
        obs.shutdown(5)
    # A baseline no speculative cycle can beat: the speedup is below 1.
    slow = _summary.compute_view(new, old, 1.0, baseline=1e12)
    assert slow.speedup is not None and slow.speedup < 1
    assert slow.speedup_note == "acceptance is still rising: the draft is warming up"
    line = _summary.plain_line(slow, fault=None)
    assert "x (acceptance is still rising: the draft is warming up)" in line
    # The whole run has no past to rise from: the reason comes from the data instead.
    whole = _summary.compute_view(new, None, 2.0, baseline=1e12)
    assert whole.speedup_note and "warming" not in whole.speedup_note
    assert any(whole.speedup_note in ln for ln in _summary.final_lines(
        whole, seconds=2.0, fault=None, baseline_note="configured", requests=""))
    fast = _summary.compute_view(new, old, 1.0, baseline=1e-3)
    assert fast.speedup is not None and fast.speedup > 1 and fast.speedup_note == ""
