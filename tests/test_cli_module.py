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


def test_the_tools_docstring_names_every_command_and_its_shape() -> None:
    """``specobs.tools``'s table lists each command the dispatcher loads from the tools, with
    its module, and says which of them are subpackages, as the files are."""
    import re
    from pathlib import Path

    import specobs.tools
    from specobs.cli import _SUBCOMMANDS

    doc = specobs.tools.__doc__ or ""
    rows = dict(re.findall(r"^``([a-z-]+)``\s+:mod:`([\w.]+)`", doc, flags=re.M))
    expected = {cmd: mod for cmd, (mod, _) in _SUBCOMMANDS.items()
                if mod.startswith("specobs.tools.")}
    assert rows == expected
    here = Path(specobs.tools.__file__).parent
    packages = {mod.rsplit(".", 1)[1] for mod in expected.values()
                if (here / mod.rsplit(".", 1)[1] / "__init__.py").exists()}
    stated = re.search(r"^(.*) are subpackages; the others are single modules\.", doc, re.M)
    assert stated is not None
    assert set(re.findall(r"``(\w+)``", stated.group(1))) == packages
