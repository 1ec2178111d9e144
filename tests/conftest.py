"""Shared fixtures. The real-server fixtures live in their own modules, loaded as plugins."""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["tests._otlp_receiver", "tests._prometheus_server"]

# The suite must never pick up a user's exporter settings.
for _var in list(os.environ):
    if _var.startswith(("SPECOBS_", "OTEL_")):
        del os.environ[_var]


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
