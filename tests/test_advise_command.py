"""``specobs advise``: the schedule from windows at several batch sizes, printed in an engine's
own configuration and read back by that engine's code; the command against a live endpoint and
against bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from specobs.tools import _advise
from specobs.tools import _diagnosis as dg
from specobs.tools._diagnosis._engine_config import mapping, render
from tests import test_top
from tests._synthetic_engine import Synthetic, linear
from tests.test_engine_config_syntax import pinned_wheel, vllm_mapping
from tests.test_top import Engine, cli_here, closed_port_url

engines = test_top.engines
__all__ = ["engines", "pinned_wheel"]


def test_the_schedule_of_windows_at_several_batch_sizes_is_what_vllm_runs(
        pinned_wheel: Callable[[str, str], Path]) -> None:
    """A forward whose verify costs more than its tokens gain at batch 64: speculation at the
    small batches, k = 0 at 64, and vLLM 0.34's own lookup schedules exactly that."""
    e = Synthetic(linear(1.0e-3, 0.1e-3))
    windows = [dg.window(e.window(3, b, 800)) for b in (1, 4, 16, 64)]
    result = _advise.advise(windows, None)
    bands = result["bands"]
    assert [round(c.batch) for c in result["choices"]] == [1, 4, 16, 64]
    assert bands[0].k > 0 and bands[-1].k == 0 and bands[-1].hi is None
    # Each observed batch's k is the truth's best within 3%.
    for c in result["choices"]:
        best = max(range(9), key=lambda k, b=c.batch: e.tokens_per_second(k, b))
        assert e.tokens_per_second(c.k, c.batch) >= 0.97 * e.tokens_per_second(best, c.batch)
    snippet = render(bands, "vllm", max_batch=128)
    wheel = pinned_wheel("vllm", "0.34.0")
    assert vllm_mapping(wheel, snippet, 128) == mapping(bands, 128)
    codes = {f.code for f in result["findings"]}
    assert {"SPEC-ADVICE-SCHEDULE", "SPEC-ADVICE-BATCH", "SPEC-ADVICE-K"} <= codes


def test_advise_a_live_endpoint(engines: Callable[..., Engine],
                                capsys: pytest.CaptureFixture[str]) -> None:
    eng = engines(baseline=50.0).start(period_seconds=0.001)
    rc, out, err = cli_here(capsys, "advise", eng.url, "--wait", "1.5", "--interval", "0.5",
                            "--engine", "vllm", "--json")
    assert err == "" and rc == 0, (rc, out, err)
    report = json.loads(out)
    assert report["windows"] >= 1 and report["bands"]
    assert report["bands"][0]["lo"] == 1 and report["bands"][-1]["hi"] is None
    assert any(b["measured"] for b in report["bands"])
    assert "num_speculative_tokens_per_batch_size" in report["snippet"]
    # The endpoint's baseline is configured: no plain step measured, so k moves one step.
    k = next(f for f in report["findings"] if f["code"] == "SPEC-ADVICE-K")
    assert "one step of k at a time" in k["sentence"]
    rc, out, _ = cli_here(capsys, "advise", eng.url, "--wait", "0.5", "--interval", "0.5")
    assert rc == 0 and "one batch size observed" in out and "k=" in out


def test_bad_input_is_refused_with_what_was_expected(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli_here(capsys, "advise", "http://127.0.0.1:1/metrics", "--wait", "1",
                          "--interval", "2")
    assert rc == 2 and "expected --wait >= --interval > 0" in err and "--interval 2" in err
    rc, _, err = cli_here(capsys, "advise")
    assert rc == 2 and "exactly one" in err
    rc, _, err = cli_here(capsys, "advise", closed_port_url(), "--wait", "0.2",
                          "--interval", "0.1", "--timeout", "1")
    assert rc == 2 and err.startswith("specobs advise: cannot connect to http://127.0.0.1:")


def test_no_window_with_enough_cycles_exits_1(engines: Callable[..., Engine],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    eng = engines(baseline=50.0)
    eng.run(5)
    rc, out, _ = cli_here(capsys, "advise", eng.url, "--wait", "0.2", "--interval", "0.1")
    assert rc == 1 and "no schedule" in out


@pytest.mark.parametrize("command", ["doctor", "top", "advise"])
def test_a_missing_dependency_is_not_a_problem_found(command: str) -> None:
    """Exit 2 with the package to install, never 1 (doctor's "a problem found")."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['httpx'] = None; from specobs.cli import main; "
            f"sys.exit(main([{command!r}, 'http://127.0.0.1:9/metrics']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=test_top.cli_env(), timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "httpx is missing: pip install 'specobs[cli,prometheus]'" in done.stderr
