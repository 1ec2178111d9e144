"""The wheel a release builds: ``python -m build --wheel`` from a clean clone of the repository
holds both compiled extensions next to their pure-Python twins, and ``auditwheel show`` (where
installed) accepts the extensions as manylinux. docs/releasing.md says how a release ships it.

What a clone holds is the committed tree, so this checks the commit, not the working copy; the
build runs ``--no-isolation`` with this environment's setuptools and wheel (the test extra).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _importable(name: str) -> bool:
    # ``find_spec`` alone is fooled by a ``build/`` folder in the working directory (a namespace
    # package); the real module has a file.
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


def _has_compiler() -> bool:
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    return headers and (shutil.which("cc") is not None or shutil.which("gcc") is not None)


def _build(tmp: Path, kind: str) -> Path:
    """``python -m build --<kind>`` from a fresh clone under ``tmp``: the one file it made."""
    if not _importable("build"):
        pytest.skip("the build module is not installed (pip install build)")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    src, out = tmp / "src", tmp / "dist"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(src)],
                   check=True, capture_output=True, text=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "LDSHARED")}
    r = subprocess.run([sys.executable, "-m", "build", f"--{kind}", "--no-isolation",
                        "--outdir", str(out)], cwd=src, env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built = list(out.glob("specobs-*"))
    assert len(built) == 1, built
    return built[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _has_compiler():
        pytest.skip("no C compiler and Python headers: the wheel would have no extensions")
    return _build(tmp_path_factory.mktemp("wheel"), "wheel")


def test_the_sdist_holds_both_extensions_sources_and_their_shared_header(
    tmp_path: Path,
) -> None:
    names = tarfile.open(_build(tmp_path, "sdist")).getnames()
    core = [f"_core/{path.name}" for path in sorted((ROOT / "specobs" / "_core").iterdir())]
    for source in (*core, "_speedups.c", "_bucket.h"):
        assert any(n.endswith(f"/specobs/{source}") for n in names), (source, names)


def test_the_wheel_holds_both_extensions_and_the_pure_python_ring(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for pattern in ("specobs/_core*.so", "specobs/_speedups*.so"):
        assert any(fnmatch(n, pattern) for n in names), (pattern, names)
    assert "specobs/_ring.py" in names
    assert "specobs/_bucketing.py" in names
    # A wheel with extensions is a platform wheel (auditwheel repair renames it manylinux).
    assert not wheel.name.endswith("-none-any.whl"), wheel.name


def test_auditwheel_accepts_the_extensions_as_manylinux(wheel: Path) -> None:
    if not _importable("auditwheel"):
        pytest.skip("auditwheel is not installed (pip install auditwheel)")
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join((r.stdout + r.stderr).split())
    m = re.search(r'consistent with the following platform tag: "(manylinux_\d+_\d+_\w+)"', text)
    assert m, text
