"""Contracts with SGLang, vLLM and transformers at pinned releases, and the plugin paths.

1. The pinned wheels are fetched with ``pip download --no-deps`` into a cache
   (``SPECOBS_CONTRACTS_CACHE``, default ``~/.cache/specobs-contracts``; skipped with the reason
   when the package index cannot be reached) and every class, method, parameter and field the
   instrumentors rely on is checked with ``ast`` -- nothing of the engines is imported.
2. Behaviour: stand-in workers and runners that mirror those signatures and the engines' call
   order are driven through the real plugin loading path: SGLang's own ``load_plugins()`` and
   ``HookRegistry`` taken from the pinned wheel, vLLM's ``load_general_plugins()`` from its wheel,
   each finding specobs through an ``importlib.metadata.EntryPoint``.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import specobs
from specobs.instrument import sglang as sg_inst
from specobs.instrument import vllm as vl_inst
from specobs.instrument._base import PackageRange
from specobs.instrument._package_sglang import PACKAGE as SGLANG_RANGE
from specobs.instrument._package_transformers import PACKAGE as TRANSFORMERS_RANGE
from tests import _pinned_wheels as pinned_wheels

CACHE = pinned_wheels.CACHE

SGLANG_PINS = ("0.5.10", "0.5.11", "0.5.12", "0.5.23")
TRANSFORMERS_PINS = ("4.57.6", "5.17.0")


# -- fetching and reading the pinned wheels --------------------------------------------------------


def _source(dist: str, version: str, path: str) -> str | None:
    return pinned_wheels.member(pinned_wheels.wheel(dist, version), path)


@cache
def _tree(dist: str, version: str, path: str) -> ast.Module | None:
    text = _source(dist, version, path)
    return None if text is None else ast.parse(text)


_class = pinned_wheels.class_def


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{cls.name}.{name} is missing")


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class fields (dataclasses, pydantic) and attributes assigned on ``self``."""
    names = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _module_constant(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        if target == name and value is not None:
            return ast.literal_eval(value)
    raise AssertionError(f"module constant {name} is missing")


# -- SGLang contracts ------------------------------------------------------------------------------

# Every SGLang worker class create_worker can return, every hook target, field and topology
# source: tests/test_instrument_sglang.py (against the same wheels).


@pytest.mark.parametrize("version", [v for v in SGLANG_PINS if v >= "0.5.11"])
def test_sglang_plugin_framework_contract(version: str) -> None:
    plugins = _tree("sglang", version, "sglang/srt/plugins/__init__.py")
    registry = _tree("sglang", version, "sglang/srt/plugins/hook_registry.py")
    assert plugins is not None and registry is not None
    assert _module_constant(plugins, "GENERAL_PLUGINS_GROUP") == "sglang.srt.plugins"
    register = _method(_class(registry, "HookRegistry"), "register")
    assert _params(register)[:4] == ["cls", "target", "hook", "hook_type"]
    members = {
        n.targets[0].id
        for n in _class(registry, "HookType").body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    assert "AROUND" in members


# vLLM: tests/test_instrument_vllm.py (contracts and behaviour), tests/test_engine_vllm_cpu.py.


# -- transformers contracts ------------------------------------------------------------------------


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}


@pytest.mark.parametrize("version", TRANSFORMERS_PINS)
def test_transformers_seams_exist_in_pinned_releases(version: str) -> None:
    assert TRANSFORMERS_RANGE.tested(version)
    utils = _tree("transformers", version, "transformers/generation/utils.py")
    generators = _tree("transformers", version, "transformers/generation/candidate_generator.py")
    assert utils is not None and generators is not None
    mixin = _class(utils, "GenerationMixin")
    _method(mixin, "_get_candidate_generator")
    calls = _calls(_method(mixin, "_assisted_decoding"))
    assert {
        "candidate_generator.get_candidates",
        "candidate_generator.update_candidate_strategy",
        "self._get_candidate_generator",
        "self",  # the target forward over the candidates, where the verify hook fires
    } <= calls
    base = _class(generators, "CandidateGenerator")
    assert _params(_method(base, "get_candidates"))[:2] == ["self", "input_ids"]
    assert _params(_method(base, "update_candidate_strategy")) == [
        "self", "input_ids", "scores", "num_matches",
    ]  # fmt: skip


def test_transformers_before_the_range_builds_its_generator_outside_the_loop() -> None:
    # Up to 4.56 generate() built the candidate generator and passed it in, so the seam the
    # instrumentor uses is missing: the range starts at 4.57 for that reason.
    assert TRANSFORMERS_RANGE.below_floor("4.56.2")
    utils = _tree("transformers", "4.56.2", "transformers/generation/utils.py")
    assert utils is not None
    calls = _calls(_method(_class(utils, "GenerationMixin"), "_assisted_decoding"))
    assert "self._get_candidate_generator" not in calls


# -- behaviour through the real plugin loading paths -----------------------------------------------


class _Installed(PackageRange):
    """A range whose distribution reports a given installed version (no wheel installed)."""

    def __init__(self, base: PackageRange, version: str) -> None:
        super().__init__(base.distribution, base.minimum, base.tested_below)
        object.__setattr__(self, "_version", version)

    def installed_version(self) -> str | None:
        return self._version  # type: ignore[attr-defined, no-any-return]


def _package(monkeypatch: pytest.MonkeyPatch, name: str, path: bool = True) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=path)
    if path:
        module.__path__ = []
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    if parent:
        monkeypatch.setattr(sys.modules[parent], child, module, raising=False)
    return module


def _load_from_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dist: str, version: str, name: str
) -> types.ModuleType:
    """Execute one module of a pinned wheel under its real name (its parents are stand-ins)."""
    path = name.replace(".", "/")
    is_package = _source(dist, version, path + "/__init__.py") is not None
    member = path + ("/__init__.py" if is_package else ".py")
    text = _source(dist, version, member)
    assert text is not None, member
    file = tmp_path / dist / member
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=[] if is_package else None
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    monkeypatch.setattr(sys.modules[parent], child, module, raising=False)
    spec.loader.exec_module(module)
    return module


class _Mode:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_extend(self) -> bool:
        return self.kind == "extend"

    def is_idle(self) -> bool:
        return self.kind == "idle"

    def is_decode(self) -> bool:
        return self.kind == "decode"


class _Batch:
    def __init__(self, kind: str, size: int) -> None:
        torch = pytest.importorskip("torch")
        self.forward_mode = _Mode(kind)
        self.is_extend_in_batch = False
        self.seq_lens = torch.full((size,), 7)
        self.spec_info = None


class _Result:
    """Mirrors GenerationBatchResult: the per-request field of the release, or accept_lens."""

    def __init__(self, **fields: Any) -> None:
        self.accept_lens = None
        self.__dict__.update(fields)


def _sglang_v2_module(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> types.ModuleType:
    """Stand-ins mirroring sglang 0.5.23's eagle_worker_v2 signatures and call order."""
    torch = pytest.importorskip("torch")
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        _package(monkeypatch, name)
    module = _package(monkeypatch, sg_inst.V2_MODULE, path=False)

    class EagleDraftWorker:
        speculative_num_steps = 3

        def draft(self, batch: Any, *, with_topology: bool = False) -> Any:
            calls.append("draft")
            return "verify-input"

        def _draft_extend_for_decode(
            self, batch: Any, batch_result: Any, *, kv_loc_plan: Any = None
        ) -> None:
            calls.append("draft_extend")

    class EAGLEWorkerV2:
        def __init__(self, accept_lens: list[int], tp_rank: int = 0) -> None:
            self.speculative_num_steps = 3
            self.tp_rank = tp_rank
            self.draft_worker = EagleDraftWorker()
            self._accept_lens = accept_lens

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
            pp_proxy_tensors: Any = None,
        ) -> Any:  # fmt: skip
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                calls.append("prefill")
                return _Result()
            verify_input = self.draft_worker.draft(batch)
            batch.spec_info = verify_input
            output = self.verify(batch, pp_proxy_tensors=pp_proxy_tensors)
            self.draft_worker._draft_extend_for_decode(batch, output, kv_loc_plan=None)
            return output

        def verify(self, batch: Any, pp_proxy_tensors: Any = None, grammar_barrier: Any = None):
            calls.append("verify")
            # accept_lens counts the bonus token, as in SGLang.
            return _Result(accept_lens=torch.tensor(self._accept_lens))

    module.EagleDraftWorker = EagleDraftWorker
    module.EAGLEWorkerV2 = EAGLEWorkerV2
    return module


@pytest.fixture
def fresh_instrumentors() -> Any:
    for cls in (sg_inst.SGLangInstrumentor, vl_inst.VllmInstrumentor):
        cls().uninstrument()
        cls()._observer = None
    yield
    for cls in (sg_inst.SGLangInstrumentor, vl_inst.VllmInstrumentor):
        observer = cls().current_observer
        cls().uninstrument()
        cls()._observer = None
        if observer is not None:
            observer.shutdown(timeout_seconds=5.0)


def _snapshot(observer: Any) -> Any:
    observer.force_flush(timeout_seconds=5.0)
    return observer.snapshot()


def _sglang_plugin_loader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str
) -> tuple[types.ModuleType, types.ModuleType]:
    """SGLang's own ``sglang.srt.plugins`` loader and ``hook_registry``, loaded from its wheel at
    ``version``, with specobs's entry point the only plugin, ``SPECOBS_SGLANG=1``, and the
    instrumentor seeing ``version`` installed: ``(hook_registry, plugins)``."""
    monkeypatch.setattr(sg_inst.SGLangInstrumentor, "package", _Installed(SGLANG_RANGE, version))
    environ = _package(monkeypatch, "sglang.srt.environ", path=False)

    class _Unset:
        def get(self) -> None:
            return None

    environ.envs = types.SimpleNamespace(SGLANG_PLUGINS=_Unset(), SGLANG_PLATFORM=_Unset())
    _package(monkeypatch, "sglang.srt.plugins")
    registry = _load_from_wheel(
        monkeypatch, tmp_path, "sglang", version, "sglang.srt.plugins.hook_registry"
    )
    plugins = _load_from_wheel(monkeypatch, tmp_path, "sglang", version, "sglang.srt.plugins")
    entry = importlib.metadata.EntryPoint(
        name="specobs", value="specobs.instrument.sglang:sglang_plugin", group="sglang.srt.plugins"
    )
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [entry] if group == entry.group else []
    )
    monkeypatch.setenv(sg_inst.SPECOBS_SGLANG, "1")
    return registry, plugins


def test_sglang_plugin_through_sglangs_own_loader_and_hook_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any
) -> None:
    version = "0.5.23"
    calls: list[str] = []
    module = _sglang_v2_module(monkeypatch, calls)
    original_forward = module.EAGLEWorkerV2.forward_batch_generation
    registry, plugins = _sglang_plugin_loader(monkeypatch, tmp_path, version)
    monkeypatch.setenv("SPECOBS_CLOCK", "host")
    for var in ("SPECOBS_EXPORTERS", "SPECOBS_RANK", "RANK", "LOCAL_RANK", "SPECOBS_PHASES"):
        monkeypatch.delenv(var, raising=False)
    try:
        plugins.load_plugins()
        patched = module.EAGLEWorkerV2.forward_batch_generation
        assert patched is not original_forward
        assert patched.__wrapped__ is original_forward

        worker = module.EAGLEWorkerV2(accept_lens=[1, 4, 2])
        worker.forward_batch_generation(_Batch("extend", 3))  # prefill: not a cycle
        worker.forward_batch_generation(_Batch("idle", 0))  # idle: not a cycle
        for _ in range(5):
            out = worker.forward_batch_generation(_Batch("decode", 3))
            assert out.accept_lens.tolist() == [1, 4, 2]  # the engine's result is untouched
        assert calls.count("draft") == calls.count("verify") == calls.count("draft_extend") == 6

        observer = sg_inst.SGLangInstrumentor().current_observer
        assert observer is not None
        snap = _snapshot(observer)
        assert snap.cycles_total == 5
        assert snap.accepted_tokens_total == 5 * (0 + 3 + 1)
        assert snap.draft_tokens_total == 5 * 3 * 3
        assert snap.emitted_tokens_total == 5 * (1 + 4 + 2)
        assert not any(snap.errors.values()), snap.errors
        for phase in ("draft", "verify", "bookkeeping"):
            assert snap.phase_count(phase, "host") == 5
            assert snap.phase_seconds_sum(phase, "host") > 0.0
    finally:
        registry.HookRegistry.reset()


def test_sglang_plugin_off_without_env_and_on_other_ranks_records_nothing(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    module = _sglang_v2_module(monkeypatch, calls)
    monkeypatch.delenv(sg_inst.SPECOBS_SGLANG, raising=False)
    registered: list[str] = []
    _package(monkeypatch, "sglang.srt.plugins")
    hook_registry = _package(monkeypatch, "sglang.srt.plugins.hook_registry", path=False)
    hook_registry.HookType = types.SimpleNamespace(AROUND="around")
    hook_registry.HookRegistry = types.SimpleNamespace(
        register=lambda target, hook, kind: registered.append(target)
    )
    sg_inst.sglang_plugin()
    assert registered == []

    monkeypatch.setattr(sg_inst.SGLangInstrumentor, "package", _Installed(SGLANG_RANGE, "0.5.23"))
    monkeypatch.setenv("SPECOBS_CLOCK", "host")
    for var in ("SPECOBS_ALL_RANKS", "SPECOBS_RANK", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert sg_inst.SGLangInstrumentor().instrument() is True
    module.EAGLEWorkerV2(accept_lens=[2], tp_rank=1).forward_batch_generation(_Batch("decode", 1))
    observer = sg_inst.SGLangInstrumentor().current_observer
    assert observer is not None
    assert _snapshot(observer).cycles_total == 0  # rank 1 does not record by default
    assert calls == ["draft", "verify", "draft_extend"]


def test_sglang_v1_worker_direct_instrumentation_restores(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    """sglang 0.5.10 has no plugin framework: SGLangInstrumentor patches V1 and V2 directly."""
    calls: list[str] = []
    _sglang_v2_module(monkeypatch, calls)
    v1 = _package(monkeypatch, sg_inst.V1_MODULE, path=False)

    class EAGLEWorker:  # mirrors 0.5.10: V1 syncs and returns per-request CPU counts
        def __init__(self) -> None:
            self.speculative_num_steps = 4
            self.tp_rank = 0

        def forward_batch_generation(self, batch: Any) -> Any:
            spec_info = self.draft(batch)
            self.verify(batch, spec_info)
            self.forward_draft_extend_after_decode(batch)
            return _Result(num_accepted_tokens=5, accept_length_per_req_cpu=[4, 1, 0])

        def draft(self, batch: Any) -> Any:
            calls.append("draft")

        def verify(self, batch: Any, spec_info: Any) -> Any:
            calls.append("verify")

        def forward_draft_extend_after_decode(self, batch: Any) -> None:
            calls.append("extend")

    v1.EAGLEWorker = EAGLEWorker
    originals = {k: v for k, v in vars(EAGLEWorker).items() if callable(v)}
    observer = specobs.configure(sinks=[specobs.MemorySink()], clock="host", rank=0)
    monkeypatch.setattr(sg_inst.SGLangInstrumentor, "package", _Installed(SGLANG_RANGE, "0.5.10"))
    inst = sg_inst.SGLangInstrumentor()
    assert inst.instrument(observer=observer) is True
    assert inst.instrument(observer=observer) is True
    worker = EAGLEWorker()
    worker.forward_batch_generation(_Batch("decode", 3))
    worker.forward_batch_generation(_Batch("decode", 3))
    inst.uninstrument()
    assert {k: v for k, v in vars(EAGLEWorker).items() if callable(v)} == originals
    worker.forward_batch_generation(_Batch("decode", 3))  # not counted
    snap = _snapshot(observer)
    assert snap.cycles_total == 2
    assert snap.accepted_tokens_total == 2 * 5
    assert snap.draft_tokens_total == 2 * 3 * 4
    assert not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)
