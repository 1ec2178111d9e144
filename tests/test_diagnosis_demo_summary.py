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


def test_without_a_baseline_or_cycles_the_summary_says_so_not_a_dash() -> None:
    """"speedup -x" and "vs baseline -" on the first frame and after a stall said nothing:
    the summary says that no baseline was measured yet, or that the window had no cycles."""
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host", max_draft_length=4,
                            env={})
    try:
        _cycles(obs, 50, [3, 4, 2, 4])
        snap = obs.snapshot()
    finally:
        obs.shutdown(5)
    unknown = _summary.compute_view(snap, None, 1.0, baseline=None)
    line = _summary.plain_line(unknown, fault=None)
    assert "no baseline yet" in line and "-x" not in line
    final = _summary.final_lines(unknown, seconds=1.0, fault=None,
                                 baseline_note="measured while serving, same batch", requests="")
    assert any("tokens/s no baseline yet (measured while serving, same batch)" in ln
               for ln in final), final
    idle = _summary.compute_view(snap, snap, 1.0, baseline=80.0)
    assert "speedup - (no cycles in the window)" in _summary.plain_line(idle, fault=None)
    assert any("vs baseline 80.0 (configured): speedup - (no cycles in the window)" in ln
               for ln in _summary.final_lines(idle, seconds=1.0, fault=None,
                                              baseline_note="configured", requests=""))


def test_the_draft_heads_training_has_a_row_of_its_own_while_it_runs() -> None:
    """The training status stood in the requests row, where a reader looking at why the
    speedup is below 1 did not see it: it has its own row, and none once the draft trained."""
    import io

    from rich.console import Console

    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host", max_draft_length=4,
                            env={})
    try:
        _cycles(obs, 50, [3, 4, 2, 4])
        view = _summary.compute_view(obs.snapshot(), None, 1.0, baseline=None)
    finally:
        obs.shutdown(5)

    def text(training: str) -> str:
        console = Console(width=140, record=True, file=io.StringIO())
        console.print(_summary.render_rich(
            view, title="t", fault=None, requests="2 running, 0 waiting, 7 finished",
            where=[], baseline_note="configured", training=training))
        return console.export_text()

    rows = [ln.replace("│", " ").split() for ln in text("draft training 40/300").splitlines()]
    assert ["draft", "head", "draft", "training", "40/300"] in [r[:5] for r in rows]
    assert any(r[:5] == ["requests", "2", "running,", "0", "waiting,"] for r in rows)
    assert "draft head" not in text("")
    line = _summary.plain_line(view, fault=None, requests="2 running",
                               training="draft training 4/9")
    assert "| draft training 4/9 | 2 running" in line
