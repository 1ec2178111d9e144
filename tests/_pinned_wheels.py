"""The engines' pinned wheels for the contract tests: downloaded once (``pip download
--no-deps``) into ``SPECOBS_CONTRACTS_CACHE`` (default ``~/.cache/specobs-contracts``) and read as
zip archives, never installed. A test skips with the reason when the package index cannot be
reached."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

import pytest

CACHE = Path(
    os.environ.get("SPECOBS_CONTRACTS_CACHE", Path.home() / ".cache" / "specobs-contracts")
)


@cache
def wheel(dist: str, version: str) -> Path:
    """The cached wheel of ``dist==version``, downloaded when missing."""

    def found() -> Path | None:
        hits = sorted(CACHE.glob(f"{dist}-{version}-*.whl"))
        return hits[0] if hits else None

    hit = found()
    if hit is not None:
        return hit
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             f"{dist}=={version}", "-d", str(CACHE)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot download the pinned wheel {dist}=={version}: {exc!r}")
    hit = found()
    if done.returncode != 0 or hit is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"cannot reach the package index for the pinned wheel {dist}=={version} "
                    f"(pip download --no-deps failed: {tail[0]})")
    return hit


def member(archive: Path, path: str) -> str | None:
    """The text of ``path`` inside the wheel ``archive``; None where it has no such file."""
    with zipfile.ZipFile(archive) as opened:
        try:
            return opened.read(path).decode()
        except KeyError:
            return None


def class_def(tree: ast.Module, name: str) -> ast.ClassDef:
    """The class ``name`` in ``tree`` (the first, at any depth); fails the test where it is
    missing."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} is missing")
