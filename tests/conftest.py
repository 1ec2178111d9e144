"""Shared fixtures. The real-server fixtures live in their own modules, loaded as plugins."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

pytest_plugins = ["tests._otlp_receiver", "tests._prometheus_server", "tests._cores"]

# The suite must never pick up a user's exporter settings (but keeps where its caches live,
# and SPECOBS_CORE: scripts/check runs the hot path's tests again with SPECOBS_CORE=python, on
# the pure-Python ring, which the variable must reach; tests/test_ring_choice.py checks it does).
_KEEP = {
    "SPECOBS_TEST_WEIGHTS_DIR", "SPECOBS_CONTRACTS_CACHE", "SPECOBS_TEST_ENGINE_VENVS",
    "SPECOBS_KEEP_ENGINE_VENV", "SPECOBS_CORE",
}
for _var in list(os.environ):
    if _var.startswith(("SPECOBS_", "OTEL_")) and _var not in _KEEP:
        del os.environ[_var]

# One weight cache for the demo engine across the whole suite and its subprocesses (`specobs
# demo` started by tests finds it through SPECOBS_CACHE_DIR): the models are trained once, by
# whichever test needs them first, and reused by every later run on the same machine.
os.environ["SPECOBS_CACHE_DIR"] = os.environ.get("SPECOBS_TEST_WEIGHTS_DIR") or os.path.join(
    tempfile.gettempdir(), "specobs-test-weights"
)


@pytest.fixture
def fast_switching():
    """A tiny thread switch interval, so the resolver and the worker interleave constantly."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA device; run on the H200 (see benchmarks/gpu_run.sh)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
