"""``python -m specobs`` is the ``specobs`` command: the same parser, the same exit codes."""

from __future__ import annotations

import subprocess
import sys

import specobs


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specobs", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_python_dash_m_specobs_runs_the_cli() -> None:
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    assert specobs.__version__ in done.stdout
    bad = _run("no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
