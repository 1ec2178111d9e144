"""Stand-in vLLM modules patched by a fresh :class:`VllmInstrumentor`, for the tests that drive
the hooks without vLLM installed."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import specobs
from specobs.instrument import vllm as vl_inst


@contextlib.contextmanager
def instrumented_vllm(
    monkeypatch: pytest.MonkeyPatch,
    runner_module: str,
    runner: type,
    scheduler: type,
    phases: tuple[str, ...],
) -> Iterator[Any]:
    """``runner`` as vLLM's runner class in ``runner_module`` (V1's or V2's) and ``scheduler``
    as its scheduler class, in stand-in modules patched by a fresh instrumentor recording to an
    in-memory observer of ``phases``; yields the observer, and on exit unpatches and shuts it
    down."""
    modules = {name: types.ModuleType(name)
               for name in ("vllm", runner_module, vl_inst.SCHEDULER_MODULE)}  # fmt: skip
    setattr(modules[runner_module], vl_inst.RUNNER_CLASS, runner)
    setattr(modules[vl_inst.SCHEDULER_MODULE], vl_inst.SCHEDULER_CLASS, scheduler)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    inst = vl_inst.VllmInstrumentor()
    inst.uninstrument()
    inst._observer = None
    observer = specobs.configure(sinks=[specobs.MemorySink()], clock="host", phases=phases)
    assert inst.instrument(observer=observer, skip_dep_check=True)
    try:
        yield observer
    finally:
        inst.uninstrument()
        inst._observer = None
        observer.shutdown(timeout_seconds=5.0)
