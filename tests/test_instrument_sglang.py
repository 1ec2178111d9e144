"""SGLang: the coverage of every worker class, the seams, topology and the plugin path.

1. AST checks against the pinned wheels (fetched by tests/test_instrument_contracts.py's cache):
   every worker class ``SpeculativeAlgorithm.create_worker`` can return in 0.5.23 is either hooked
   or reported as unsupported by specobs, and every hooked method, parameter and field exists.
2. Behaviour: stand-ins mirroring each covered class's call order (0.5.23), driven through
   SGLang's own ``load_plugins()`` taken from the wheel; ``EAGLEWorkerV2``'s own step, DP
   spec/prefill coordination and prefill methods compiled from the wheel and run over stand-in
   draft and target workers; topology (PP, DP replicas, DP attention)
   from a stand-in of SGLang's ``runtime_context``; the import-time behaviour (nothing of SGLang is
   imported by the plugin; classes are patched when SGLang imports them).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.metadata
import logging
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

import specobs
from specobs.instrument import sglang as sg_inst
from specobs.instrument._base import Topology, wrap_around
from specobs.instrument._package_sglang import PACKAGE as SGLANG_RANGE
from tests.test_instrument_contracts import (
    SGLANG_PINS,
    _Batch,
    _class,
    _fields,
    _Installed,
    _load_from_wheel,
    _method,
    _Mode,
    _module_constant,
    _package,
    _params,
    _Result,
    _sglang_plugin_loader,
    _snapshot,
    _source,
    _tree,
)

SG = "sglang/srt/speculative/"
LATEST = "0.5.23"


# -- AST: coverage and seams against the real wheels -----------------------------------------------


def _returned_classes(tree: ast.Module) -> dict[str, str]:
    """``{class name: module}`` that ``SpeculativeAlgorithm.create_worker`` imports and returns."""
    fn = _method(_class(tree, "SpeculativeAlgorithm"), "create_worker")
    imported: dict[str, str] = {}
    returned: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = node.module
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
            returned.add(node.value.id)
    # ``platform_worker_cls`` is an out-of-tree platform's class: covered by the runtime check.
    returned.discard("platform_worker_cls")
    missing = returned - set(imported)
    assert not missing, f"create_worker returns classes it does not import: {missing}"
    return {name: imported[name] for name in returned}


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _class_in(version: str, module: str, name: str) -> ast.ClassDef:
    tree = _tree("sglang", version, _module_path(module))
    assert tree is not None, module
    return _class(tree, name)


def _resolve_method(version: str, module: str, cls: str, method: str) -> tuple[str, str]:
    """The (module, class) that defines ``cls.method``, following same-package base classes."""
    tree = _tree("sglang", version, _module_path(module))
    assert tree is not None, module
    node = _class(tree, cls)
    if any(isinstance(n, ast.FunctionDef) and n.name == method for n in node.body):
        return module, cls
    imports = {
        alias.asname or alias.name: n.module
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module
        for alias in n.names
    }
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in imports:
            try:
                return _resolve_method(version, imports[base.id], base.id, method)
            except (AssertionError, LookupError):
                continue
    raise LookupError(f"{module}.{cls}.{method} is defined nowhere in its bases")


def test_every_worker_class_create_worker_returns_is_hooked_or_reported() -> None:
    """Fails when SGLang adds (or renames) a worker class specobs neither hooks nor reports."""
    spec_info = _tree("sglang", LATEST, SG + "spec_info.py")
    assert spec_info is not None
    returned = _returned_classes(spec_info)
    declared = set(sg_inst.HOOKED_WORKERS) | set(sg_inst.UNSUPPORTED_WORKERS)
    assert not set(sg_inst.HOOKED_WORKERS) & set(sg_inst.UNSUPPORTED_WORKERS)
    assert set(returned) <= declared, (
        f"create_worker in sglang {LATEST} returns {sorted(set(returned) - declared)}, which "
        "specobs neither hooks nor reports as unsupported"
    )
    assert len(returned) == 8, sorted(returned)  # every worker class of 0.5.23, counted
    hooked_modules = {t.module for t in sg_inst.HOOK_TARGETS}
    for name, module in returned.items():
        if name not in sg_inst.HOOKED_WORKERS:
            continue
        # A hooked worker's decode step resolves to a hooked method (its own or inherited).
        owner = _resolve_method(LATEST, module, name, "forward_batch_generation")
        steps = {
            (t.module, t.owner)
            for t in sg_inst.HOOK_TARGETS
            if t.method == "forward_batch_generation"
        }
        assert owner in steps, f"{name}'s decode step is {owner}, which specobs does not hook"
        assert owner[0] in hooked_modules
    # The runtime check wraps both factories that pick the class.
    assert ("SpeculativeAlgorithm", "create_worker") == (
        "SpeculativeAlgorithm",
        _method(_class(spec_info, "SpeculativeAlgorithm"), "create_worker").name,
    )
    registry = _tree("sglang", LATEST, SG + "spec_registry.py")
    assert registry is not None
    assert _params(_method(_class(registry, "CustomSpecAlgo"), "create_worker")) == [
        "self",
        "server_args",
    ]


WORKER_FIELDS = {
    # class: fields the cycle hook reads from the worker for the drafted count
    "EAGLEWorkerV2": {"topk", "speculative_num_steps", "speculative_num_draft_tokens"},
    "MultiLayerEagleWorkerV2": {"topk", "speculative_num_steps", "speculative_num_draft_tokens"},
    "FrozenKVMTPWorkerV2": {"topk", "speculative_num_steps", "speculative_num_draft_tokens"},
    "NGRAMWorker": {"draft_token_num"},
    "EAGLEWorker": {"speculative_num_steps"},
    # DFLASH, UNO and DSPARK: tests/test_instrument_sglang_workers.py checks them in full.
    "DFlashWorkerV2": {"block_size"},
    "UnoWorkerV2": {"tree_mode", "forward_width", "verify_width"},
    "DSparkWorkerV2": {"verify_num_draft_tokens"},
}


@pytest.mark.parametrize("version", SGLANG_PINS)
def test_hooked_seams_exist_with_expected_signatures(version: str) -> None:
    assert SGLANG_RANGE.tested(version)
    present = 0
    for target in sg_inst.HOOK_TARGETS:
        tree = _tree("sglang", version, _module_path(target.module))
        if tree is None:
            continue  # a worker generation this release does not have
        if not target.owner:
            continue  # a module's function (UNO's run_eagle_verify): test_instrument_sglang_workers
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        if target.owner not in classes and version != LATEST:
            continue  # an older layout; see below
        owner = _class(tree, target.owner)
        defined = any(
            isinstance(n, ast.FunctionDef) and n.name == target.method for n in owner.body
        )
        if not defined and version != LATEST:
            # An older layout (0.5.12's FrozenKVMTPWorkerV2 subclasses a V1 worker): the runtime
            # skips the target too, and create_worker's check reports the class if its step is
            # then not hooked. 0.5.23 must have every target.
            continue
        present += 1
        fn = _method(owner, target.method)
        params = _params(fn)
        assert params[0] == "self", target.dotted
        if target.method == "forward_batch_generation":
            # The hook reads the batch as the first argument after self.
            assert params[1] in ("batch", "model_worker_batch"), (target.dotted, params)
            assert ast.unparse(fn.args.args[1].annotation or ast.Constant("")) in (
                "ScheduleBatch",
                "ModelWorkerBatch",
            ), target.dotted
            fields = _fields(_class(tree, target.owner))
            assert WORKER_FIELDS[target.owner] <= fields, (target.dotted, sorted(fields))
    assert present >= 4, f"sglang {version}: fewer than the EAGLE V2 seams found"

    utils = _tree("sglang", version, "sglang/srt/managers/utils.py")
    assert utils is not None
    result = _fields(_class(utils, "GenerationBatchResult"))
    assert "accept_lens" in result
    assert set(sg_inst.ACCEPTED_PER_REQUEST_FIELDS) & result
    batch = _tree("sglang", version, "sglang/srt/managers/schedule_batch.py")
    assert batch is not None
    # The batch fields the cycle hooks read, and the ForwardMode predicates they call.
    assert {"forward_mode", "seq_lens", "is_extend_in_batch"} <= _fields(
        _class(batch, "ScheduleBatch")
    )
    modes = _tree("sglang", version, "sglang/srt/model_executor/forward_batch_info.py")
    assert modes is not None
    mode = _class(modes, "ForwardMode")
    for predicate in ("is_extend", "is_idle", "is_decode"):
        assert _params(_method(mode, predicate))[0] == "self", predicate


def test_latest_release_seams_per_class() -> None:
    """0.5.23 specifics: the phase seams are called from the step, in the order the hooks assume."""
    calls = {
        ("eagle_worker_v2", "EAGLEWorkerV2"): ["draft", "verify", "_draft_extend_for_decode"],
        ("multi_layer_eagle_worker_v2", "MultiLayerEagleWorkerV2"): [
            "draft",
            "verify",
            "_draft_extend_for_decode",
        ],
        ("frozen_kv_mtp_worker_v2", "FrozenKVMTPWorkerV2"): [
            "draft",
            "verify",
            "_draft_extend_for_decode",
        ],
        ("ngram_worker", "NGRAMWorker"): [
            "_prepare_for_speculative_decoding",
            "_update_ngram_corpus",
        ],
    }
    for (module, cls), expected in calls.items():
        tree = _tree("sglang", LATEST, SG + module + ".py")
        assert tree is not None
        fn = _method(_class(tree, cls), "forward_batch_generation")
        called = [
            node.func.attr
            for node in ast.walk(fn)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        ]
        order = [name for name in called if name in expected]
        # ast.walk is breadth first; compare by first appearance in source order instead.
        by_line = sorted(
            (node.lineno, node.func.attr)
            for node in ast.walk(fn)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in expected
        )
        first: list[str] = []
        for _, name in by_line:
            if name not in first:
                first.append(name)
        assert first == expected, (cls, first)
        assert set(order) == set(expected)
    # FrozenKVMTPWorkerV2 inherits verify from EAGLEWorkerV2 (hooked there).
    frozen = _tree("sglang", LATEST, SG + "frozen_kv_mtp_worker_v2.py")
    assert frozen is not None
    node = _class(frozen, "FrozenKVMTPWorkerV2")
    assert [ast.unparse(b) for b in node.bases] == ["EAGLEWorkerV2"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "verify" for n in node.body)
    # NGRAM's tree width lives in draft_token_num; the draft extend takes no kwargs we pass.
    ngram = _tree("sglang", LATEST, SG + "ngram_worker.py")
    assert ngram is not None
    assert "draft_token_num" in _fields(_class(ngram, "NGRAMWorker"))


def test_latest_release_topology_sources() -> None:
    """The parallel context fields topology_of reads, and the rank layout it assumes."""
    ctx = _tree("sglang", LATEST, "sglang/srt/runtime_context.py")
    assert ctx is not None
    _method(_class(ctx, "ParallelContext"), "__getattr__")
    src = ast.unparse(ctx)
    for name in ("get_parallel", "num_dp_ranks_of", "derive_attention_ranks", "spawn_world_rank"):
        assert f"def {name}" in src, name
    # The names topology_of reads from get_parallel(): the launcher's rank bundle (dp_rank),
    # the ranks derived with their widths, and num_dp_ranks = replicas x attention-DP groups.
    assert "dp_rank" in _fields(_class(ctx, "SpawnRanks"))
    pairs = _module_constant(ctx, "_RANK_AND_WIDTH")
    assert {("tp_rank", "tp_size"), ("pp_rank", "pp_size")} <= set(pairs)
    num_dp = ast.unparse(next(
        n for n in ctx.body if isinstance(n, ast.FunctionDef) and n.name == "num_dp_ranks_of"
    ))  # fmt: skip
    assert "return cfg.dp_size * cfg.attn_dp_size" in num_dp
    # WORLD rank = offset + tp_size * pp_rank + tp_rank: PP stage 0 holds WORLD rank 0.
    assert "cfg.ep_join_rank_offset + cfg.tp_size * pp_rank + tp_rank" in src
    # The launcher hands every scheduler its dp_rank (replica, or attention-DP group).
    dpc = _tree("sglang", LATEST, "sglang/srt/managers/data_parallel_controller.py")
    assert dpc is not None
    assert "compute_dp_attention_world_info" in ast.unparse(dpc)
    # Only the last PP stage hosts the draft worker.
    v2 = _tree("sglang", LATEST, SG + "eagle_worker_v2.py")
    assert v2 is not None
    assert "self._hosts_draft = get_parallel().pp_group.is_last_rank" in ast.unparse(v2)


# -- stand-ins mirroring 0.5.23's call order -------------------------------------------------------


def _accept(values: list[int]) -> _Result:
    torch = pytest.importorskip("torch")
    return _Result(accept_lens=torch.tensor(values, dtype=torch.int32))  # bonus token included


def _speculative_package(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        if name not in sys.modules:
            _package(monkeypatch, name)


def _speculative_module(monkeypatch: pytest.MonkeyPatch, name: str) -> types.ModuleType:
    """An empty stand-in for the module ``name`` of SGLang's speculative package."""
    _speculative_package(monkeypatch)
    return _package(monkeypatch, name, path=False)


def _spec_worker_state(
    worker: Any, draft_worker: Any, accept: list[int], topk: int, steps: int, tokens: int
) -> None:
    """What a stand-in EAGLE-style worker holds: SGLang's speculative settings and draft worker,
    and the accept lengths its verify returns."""
    worker.topk = topk
    worker.speculative_num_steps = steps
    worker.speculative_num_draft_tokens = tokens
    worker.draft_worker = draft_worker
    worker._accept = accept


def _eagle_v2(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> types.ModuleType:
    module = _speculative_module(monkeypatch, sg_inst.V2_MODULE)

    class EagleDraftWorker:
        def draft(self, batch: Any, *, with_topology: bool = False) -> Any:
            calls.append("draft-tail" if with_topology else "draft")
            return "verify-input"

        def _draft_extend_for_decode(
            self, batch: Any, batch_result: Any, *, kv_loc_plan: Any = None
        ) -> None:
            calls.append("draft_extend")

    class EAGLEWorkerV2:
        def __init__(
            self,
            accept: list[int],
            topk: int = 1,
            steps: int = 3,
            tokens: int = 4,
            pp: bool = False,
        ) -> None:
            _spec_worker_state(self, EagleDraftWorker(), accept, topk, steps, tokens)
            self._pp = pp

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
            pp_proxy_tensors: Any = None,
        ) -> Any:  # fmt: skip
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                calls.append("prefill")
                return _Result()
            if not self._pp and self.speculative_num_steps > 0:
                batch.spec_info = self.draft_worker.draft(batch)
            output = self.verify(batch, pp_proxy_tensors=pp_proxy_tensors)
            self.draft_worker._draft_extend_for_decode(batch, output, kv_loc_plan=None)
            if self._pp:
                self.draft_worker.draft(batch, with_topology=True)  # the PP tail draft
            return output

        def verify(
            self, batch: Any, pp_proxy_tensors: Any = None, grammar_barrier: Any = None
        ) -> Any:
            calls.append("verify")
            return _accept(self._accept)

    module.EagleDraftWorker = EagleDraftWorker
    module.EAGLEWorkerV2 = EAGLEWorkerV2
    return module


def _standalone(monkeypatch: pytest.MonkeyPatch, v2: types.ModuleType) -> types.ModuleType:
    module = _package(monkeypatch, "sglang.srt.speculative.standalone_worker_v2", path=False)

    class StandaloneWorkerV2(v2.EAGLEWorkerV2):  # type: ignore[misc, name-defined]
        pass

    module.StandaloneWorkerV2 = StandaloneWorkerV2
    return module


def _multi_layer(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> types.ModuleType:
    module = _speculative_module(monkeypatch, sg_inst.MULTI_LAYER_MODULE)

    class MultiLayerEagleDraftWorker:
        def draft(self, batch: Any) -> Any:
            calls.append("draft")
            return "verify-input"

        def _draft_extend_plan_for_decode(self, batch: Any) -> bool:
            calls.append("plan")
            return True

        def _draft_extend_for_decode(
            self, batch: Any, batch_result: Any, *, staged: bool = False, kv_loc_plan: Any = None
        ) -> None:
            calls.append("draft_extend")

    class MultiLayerEagleWorkerV2:
        def __init__(self, accept: list[int], topk: int = 1, steps: int = 3, tokens: int = 4):
            _spec_worker_state(self, MultiLayerEagleDraftWorker(), accept, topk, steps, tokens)

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
            pp_proxy_tensors: Any = None,
        ) -> Any:  # fmt: skip
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                return _Result()
            batch.spec_info = self.draft_worker.draft(batch)
            staged = self.draft_worker._draft_extend_plan_for_decode(batch)
            output = self.verify(batch, grammar_barrier=grammar_barrier)
            self.draft_worker._draft_extend_for_decode(batch, output, staged=staged)
            return output

        def verify(self, batch: Any, grammar_barrier: Any = None) -> Any:
            calls.append("verify")
            return _accept(self._accept)

    module.MultiLayerEagleDraftWorker = MultiLayerEagleDraftWorker
    module.MultiLayerEagleWorkerV2 = MultiLayerEagleWorkerV2
    return module


def _frozen(
    monkeypatch: pytest.MonkeyPatch, calls: list[str], v2: types.ModuleType
) -> types.ModuleType:
    module = _package(monkeypatch, sg_inst.FROZEN_KV_MTP_MODULE, path=False)

    class FrozenKVMTPDraftWorker:
        def draft(self, batch: Any) -> Any:
            calls.append("frozen-draft")
            return "verify-input"

        def _draft_extend_for_decode(self, batch: Any, batch_result: Any) -> None:
            calls.append("frozen-extend")

    class FrozenKVMTPWorkerV2(v2.EAGLEWorkerV2):  # type: ignore[misc, name-defined]
        def __init__(self, accept: list[int], topk: int = 1, steps: int = 2, tokens: int = 3):
            # Like the real class: does not call EAGLEWorkerV2.__init__.
            _spec_worker_state(self, FrozenKVMTPDraftWorker(), accept, topk, steps, tokens)
            self._pp = False

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None
        ) -> Any:
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                return _Result()
            batch.spec_info = self.draft_worker.draft(batch)
            output = self.verify(batch, grammar_barrier=grammar_barrier)  # EAGLEWorkerV2's
            self.draft_worker._draft_extend_for_decode(batch, output)
            return output

    module.FrozenKVMTPDraftWorker = FrozenKVMTPDraftWorker
    module.FrozenKVMTPWorkerV2 = FrozenKVMTPWorkerV2
    return module


def _ngram(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> types.ModuleType:
    module = _speculative_module(monkeypatch, sg_inst.NGRAM_MODULE)

    class NGRAMWorker:
        def __init__(self, accept: list[int], tokens: int = 8) -> None:
            self.draft_token_num = tokens
            self.speculative_num_draft_tokens = tokens
            self.topk = 1
            self.speculative_num_steps = 3  # not what NGRAM verifies: its tree is tokens wide
            self._accept = accept

        def _prepare_for_speculative_decoding(self, batch: Any) -> None:
            if not batch.forward_mode.is_decode():
                return
            calls.append("ngram-draft")
            batch.forward_mode = _Mode("target_verify")

        def _update_ngram_corpus(self, batch: Any) -> None:
            calls.append("corpus")

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None
        ) -> Any:
            self._prepare_for_speculative_decoding(batch)
            if batch.forward_mode.kind == "target_verify":
                calls.append("ngram-verify")
                self._update_ngram_corpus(batch)
                batch.forward_mode = _Mode("decode")
                return _accept(self._accept)
            return _Result()

    module.NGRAMWorker = NGRAMWorker
    return module


def _host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOBS_CLOCK", "host")
    for var in (
        "SPECOBS_EXPORTERS", "SPECOBS_RANK", "RANK", "LOCAL_RANK", "SPECOBS_PHASES",
        "SPECOBS_ALL_RANKS", "SPECOBS_PROMETHEUS_PORT", "SPECOBS_MAX_DRAFT_LENGTH",
    ):  # fmt: skip
        monkeypatch.delenv(var, raising=False)


def _instrument(
    monkeypatch: pytest.MonkeyPatch, observer: Any = None
) -> sg_inst.SGLangInstrumentor:
    monkeypatch.setattr(sg_inst.SGLangInstrumentor, "package", _Installed(SGLANG_RANGE, LATEST))
    inst = sg_inst.SGLangInstrumentor()
    assert inst.instrument(observer=observer) is True
    return inst


@pytest.fixture
def fresh_instrumentors() -> Any:
    inst = sg_inst.SGLangInstrumentor()
    inst.uninstrument()
    inst._observer = None
    yield
    observer = inst.current_observer
    inst.uninstrument()
    inst._observer = None
    if observer is not None:
        observer.shutdown(timeout_seconds=5.0)


def _memory_observer(**kwargs: Any) -> Any:
    return specobs.configure(sinks=[specobs.MemorySink()], clock="host", rank=0, **kwargs)


def _instrumented_observer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The host clock only, then SGLang's instrumentor installed with a memory-sink observer,
    which it returns."""
    _host_only(monkeypatch)
    observer = _memory_observer()
    _instrument(monkeypatch, observer)
    return observer


def _assert_counted(snap: Any, cycles: int, *, drafted: int, accepted: int) -> None:
    """``cycles`` cycles, with ``drafted`` and ``accepted`` draft tokens in all, and each phase
    host-timed once a cycle."""
    assert snap.cycles_total == cycles
    assert snap.draft_tokens_total == drafted
    assert snap.accepted_tokens_total == accepted
    for phase in ("draft", "verify", "bookkeeping"):
        assert snap.phase_count(phase, "host") == cycles


# -- behaviour: the plugin through SGLang's own loader ---------------------------------------------


def test_plugin_through_sglangs_own_loader_patches_every_covered_class(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    original = v2.EAGLEWorkerV2.forward_batch_generation
    ml = _multi_layer(monkeypatch, calls)
    registry, plugins = _sglang_plugin_loader(monkeypatch, tmp_path, LATEST)
    _host_only(monkeypatch)
    try:
        plugins.load_plugins()
        registry.HookRegistry.apply_hooks()  # SGLang's own step; specobs registers nothing there
        assert v2.EAGLEWorkerV2.forward_batch_generation.__wrapped__ is original
        assert sg_inst.is_hooked(v2.EAGLEWorkerV2)
        assert sg_inst.is_hooked(ml.MultiLayerEagleWorkerV2)

        worker = v2.EAGLEWorkerV2(accept=[1, 4, 2])
        worker.forward_batch_generation(_Batch("extend", 3))  # prefill: not a cycle
        worker.forward_batch_generation(_Batch("idle", 0))  # idle: not a cycle
        for _ in range(5):
            out = worker.forward_batch_generation(_Batch("decode", 3))
            assert out.accept_lens.tolist() == [1, 4, 2]  # the engine's result is untouched
        observer = sg_inst.SGLangInstrumentor().current_observer
        assert observer is not None
        snap = _snapshot(observer)
        _assert_counted(snap, 5, drafted=5 * 3 * 3, accepted=5 * (0 + 3 + 1))
        assert not any(snap.errors.values()), snap.errors
    finally:
        registry.HookRegistry.reset()


def test_plugin_off_without_env(monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    original = v2.EAGLEWorkerV2.forward_batch_generation
    monkeypatch.delenv(sg_inst.SPECOBS_SGLANG, raising=False)
    sg_inst.sglang_plugin()
    assert v2.EAGLEWorkerV2.forward_batch_generation is original
    assert not sg_inst.SGLangInstrumentor().is_instrumented


@pytest.mark.parametrize(
    ("topk", "steps", "tokens", "drafted"),
    [(1, 3, 4, 3), (4, 3, 8, 7), (8, 5, 64, 63), (1, 0, 1, 0)],
    ids=["chain", "tree", "wide-tree", "drafting-off"],
)
def test_eagle_v2_drafted_counts_follow_the_tree(
    monkeypatch: pytest.MonkeyPatch,
    fresh_instrumentors: Any,
    topk: int,
    steps: int,
    tokens: int,
    drafted: int,
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    _host_only(monkeypatch)
    _instrument(monkeypatch)
    accept = [1, 2] if drafted else [1, 1]  # drafting off: only the bonus token
    worker = v2.EAGLEWorkerV2(accept=accept, topk=topk, steps=steps, tokens=tokens)
    for _ in range(3):
        worker.forward_batch_generation(_Batch("decode", 2))
    observer = sg_inst.SGLangInstrumentor().current_observer
    assert observer is not None
    # The histogram buckets reach the widest tree: a 63-token tree needs max_draft_length 63.
    assert observer.settings.max_draft_length == max(8, drafted)
    snap = _snapshot(observer)
    assert snap.cycles_total == 3
    assert snap.draft_tokens_total == 3 * 2 * drafted
    assert snap.accepted_tokens_total == (3 * (0 + 1) if drafted else 0)
    assert not any(snap.errors.values()), snap.errors
    if steps == 0:
        assert "draft" not in calls


def test_standalone_inherits_the_eagle_hooks(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    sa = _standalone(monkeypatch, v2)
    observer = _instrumented_observer(monkeypatch)
    assert sg_inst.is_hooked(sa.StandaloneWorkerV2)
    sa.StandaloneWorkerV2(accept=[3, 3]).forward_batch_generation(_Batch("decode", 2))
    snap = _snapshot(observer)
    assert (snap.cycles_total, snap.draft_tokens_total, snap.accepted_tokens_total) == (1, 6, 4)
    observer.shutdown(timeout_seconds=5.0)


def test_multi_layer_eagle_phases_and_tree_counts(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    ml = _multi_layer(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    worker = ml.MultiLayerEagleWorkerV2(accept=[2, 1, 5], topk=2, steps=4, tokens=6)
    worker.forward_batch_generation(_Batch("extend", 3))
    worker.forward_batch_generation(_Batch("decode", 3))
    worker.forward_batch_generation(_Batch("decode", 3))
    assert calls == ["draft", "plan", "verify", "draft_extend"] * 2
    snap = _snapshot(observer)
    # Drafted with topk 2: the tree verifies 6 - 1 per request.
    _assert_counted(snap, 2, drafted=2 * 3 * 5, accepted=2 * (1 + 0 + 4))
    assert not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


def test_frozen_kv_mtp_is_one_cycle_with_the_inherited_verify(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    frozen = _frozen(monkeypatch, calls, v2)
    observer = _instrumented_observer(monkeypatch)
    assert sg_inst.is_hooked(frozen.FrozenKVMTPWorkerV2)
    worker = frozen.FrozenKVMTPWorkerV2(accept=[3, 1])
    for _ in range(4):
        worker.forward_batch_generation(_Batch("decode", 2))
    assert calls == ["frozen-draft", "verify", "frozen-extend"] * 4
    snap = _snapshot(observer)
    # Not 8: the EAGLEWorkerV2 verify it inherits and its own step are one cycle, not two.
    _assert_counted(snap, 4, drafted=4 * 2 * 2, accepted=4 * (2 + 0))
    observer.shutdown(timeout_seconds=5.0)


def test_subclass_step_calling_super_counts_one_cycle(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)

    class Wrapped(v2.EAGLEWorkerV2):  # type: ignore[misc, name-defined]
        def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            return super().forward_batch_generation(batch, *args, **kwargs)

    # Its step is hooked too (as if SGLang shipped it), around a super() call into a hooked step.
    Wrapped.forward_batch_generation = wrap_around(
        sg_inst.around_decode_step, Wrapped.forward_batch_generation
    )
    Wrapped(accept=[2]).forward_batch_generation(_Batch("decode", 1))
    snap = _snapshot(observer)
    assert snap.cycles_total == 1
    assert snap.draft_tokens_total == 3
    observer.shutdown(timeout_seconds=5.0)


def test_ngram_draft_is_the_lookup_and_bookkeeping_the_corpus_update(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    ng = _ngram(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    worker = ng.NGRAMWorker(accept=[1, 3, 8])
    worker.forward_batch_generation(_Batch("extend", 3))
    for _ in range(2):
        worker.forward_batch_generation(_Batch("decode", 3))
    assert calls == ["ngram-draft", "ngram-verify", "corpus"] * 2
    snap = _snapshot(observer)
    # Drafted: a tree of 8 nodes verifies 7, not num_steps.
    _assert_counted(snap, 2, drafted=2 * 3 * 7, accepted=2 * (0 + 2 + 7))
    assert not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


def test_latest_release_ngram_draft_waits_for_the_previous_step() -> None:
    """The facts behind docs/integrations.md's NGRAM host-clock note (0.5.23): the step specobs
    books as draft waits for the previous step's GPU verify (overlap, no grammar) and for the
    previous step's queued corpus insert, which is all the bookkeeping phase does on the host."""
    ngram = _class_in(LATEST, sg_inst.NGRAM_MODULE, "NGRAMWorker")
    hooks = {(t.owner, t.method): t.hook for t in sg_inst.HOOK_TARGETS}
    assert hooks["NGRAMWorker", "_prepare_for_speculative_decoding"] is sg_inst.around_draft
    assert hooks["NGRAMWorker", "_update_ngram_corpus"] is sg_inst.around_draft_extend
    prepare = ast.unparse(_method(ngram, "_prepare_for_speculative_decoding"))
    assert "self._prepare_draft_tokens(batch)" in prepare
    draft = ast.unparse(_method(ngram, "_prepare_draft_tokens"))
    assert "use_prev_tokens = self.enable_overlap and (not batch.grammar_needs_sync())" in draft
    assert "batch.spec_info.accept_tokens, batch.spec_info.accept_lens" in draft
    assert "prev_token_ids = prev_token_ids.cpu()" in draft  # the host waits on the GPU here
    assert draft.index(".cpu()") < draft.index("self.ngram_corpus.synchronize()")
    assert draft.index("self.ngram_corpus.synchronize()") < draft.index(
        "self.ngram_corpus.batch_get("
    )
    assert "self.enable_overlap = not get_schedule().disable_overlap_schedule" in ast.unparse(
        _method(ngram, "__init__")
    )
    assert "self.ngram_corpus.batch_put(batch_tokens)" in ast.unparse(
        _method(ngram, "_update_ngram_corpus")
    )
    corpus = _class_in(LATEST, "sglang.srt.speculative.cpp_ngram.ngram_corpus", "NgramCorpus")
    assert ast.unparse(_method(corpus, "batch_put")).endswith("self._obj.insert(batch_tokens)")
    # The native corpus inserts on its own thread; synchronize() waits for that queue.
    native = _source("sglang", LATEST, "sglang/kernels/jit/csrc/ngram_corpus/ngram.cpp")
    assert native is not None
    assert "insert_worker_ = std::thread(&Ngram::insertWorker, this);" in native
    assert "insert_queue_.enqueue(" in native and "void Ngram::synchronize() const" in native


def test_latest_release_overlap_rows_of_requests_finished_in_flight() -> None:
    """The facts behind docs/integrations.md's overlap-scheduling note (0.5.23): the overlap loop
    launches a step before it processes the previous result, so a request that finished there
    (other than by length) is verified once more; SGLang's aggregate speculative counters count
    that row, its per-request counters skip it -- a decision taken in result processing, after
    the step's cycle has ended (specobs takes acceptance from the step's result)."""
    scheduler = _class_in(LATEST, "sglang.srt.managers.scheduler", "Scheduler")
    loop = ast.unparse(_method(scheduler, "event_loop_overlap"))
    launch = loop.index("batch_result = self.run_batch(batch)")
    assert loop.index("pop_and_process()", launch) > launch  # the previous result, after
    inflight = ast.unparse(_method(scheduler, "_reqs_finishing_inflight"))
    assert "req.next_output_finishes_by_length()" in inflight  # the only finish foreseen
    processor = _class_in(
        LATEST, "sglang.srt.managers.scheduler_components.batch_result_processor",
        "SchedulerBatchResultProcessor",
    )  # fmt: skip
    resolve = ast.unparse(_method(processor, "_resolve_spec_v2_tokens"))
    total = resolve.index("result.num_correct_drafts = sum(result.num_correct_drafts_per_req_cpu)")
    skip = resolve.index("if req.is_retracted or req.finished():")
    assert total < skip  # the aggregate sums every row, the per-request counters skip some
    assert skip < resolve.index("req.spec_verify_ct += 1")
    assert skip < resolve.index("req.spec_num_correct_drafts += num_correct_drafts")
    decode = ast.unparse(_method(processor, "process_batch_result_decode"))
    assert "batch_size = batch.batch_size()" in decode
    assert "self.metrics_reporter.update_spec_metrics(batch_size, result.num_correct_drafts" in (
        decode
    )
    assert "if (self.enable_overlap or self.enable_overlap_mlx) and (req.finished() or " in (
        decode
    )  # the row's tokens are dropped
    # The step's own result is what result processing reads (the same object).
    launch_src = ast.unparse(_method(scheduler, "run_batch"))
    assert "batch_result = self.model_worker.forward_batch_generation(batch, **fwd_kwargs)" in (
        launch_src
    )
    assert "self.result_queue.append((batch.copy(), batch_result))" in loop


# -- the real 0.5.23 step: EAGLEWorkerV2's own methods, compiled from the wheel --------------------


def _real_methods(
    version: str, module: str, cls: str, names: tuple[str, ...], namespace: dict[str, Any]
) -> dict[str, Any]:
    """SGLang's own method bodies, compiled from the pinned wheel against ``namespace``.

    Nothing is copied into specobs: the functions are read from the wheel at test time, with the
    module globals they use supplied by ``namespace`` (stand-ins for CUDA-only helpers). Their
    annotations stay unevaluated.
    """
    node = _class_in(version, module, cls)
    future = ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0)
    tree = ast.Module(body=[future, *(_method(node, name) for name in names)], type_ignores=[])
    exec(compile(ast.fix_missing_locations(tree), f"<sglang {version} {cls}>", "exec"), namespace)
    return {name: namespace[name] for name in names}


class _Msgspec(types.ModuleType):
    """Just enough of msgspec for a frozen ``msgspec.Struct`` (not installed here)."""

    class Struct:
        def __init_subclass__(cls, frozen: bool = False, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            dataclasses.dataclass(frozen=frozen)(cls)


class _Stage:
    def __init__(self, stages: list[str], name: str) -> None:
        self.stages, self.name = stages, name

    def __enter__(self) -> None:
        self.stages.append(self.name)

    def __exit__(self, *args: Any) -> None:
        pass


class _SpecInput:
    def __init__(self, verify: bool) -> None:
        self.verify = verify
        self.kv_loc_plan = None

    def is_verify_input(self) -> bool:
        return self.verify


class _DPBatch(_Batch):
    """A ScheduleBatch of one attention-DP rank, as prepare_mlp_sync_batch leaves it."""

    def __init__(
        self, kind: str, size: int, *, peers_prefill: bool, counts: list[int], prefills: list[int]
    ) -> None:
        torch = pytest.importorskip("torch")
        super().__init__(kind, size)
        self.is_extend_in_batch = peers_prefill
        self.global_num_tokens = counts
        self.global_num_tokens_for_logprob = counts
        self.draft_global_num_tokens = None
        # What ScheduleBatch.init_new takes from it for a prefilling rank's idle draft batch.
        self.req_to_token_pool = self.token_to_kv_pool_allocator = self.tree_cache = None
        self.model_config = self.enable_overlap = self.spec_algorithm = None
        self.dp_spec_prefill_coordination_metadata = (
            counts, counts, torch.tensor(prefills),
        )  # fmt: skip


def _real_eagle_v2(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    calls: list[str],
    *,
    coordination: bool,
    rank: int,
) -> Any:
    """``EAGLEWorkerV2`` with 0.5.23's own step, coordination and prefill methods; its draft
    worker, target worker and verify are stand-ins (they need CUDA)."""
    _speculative_package(monkeypatch)
    monkeypatch.setitem(sys.modules, "msgspec", _Msgspec("msgspec"))
    plan_module = _load_from_wheel(
        monkeypatch, tmp_path, "sglang", LATEST,
        "sglang.srt.speculative.dp_spec_prefill_coordination",
    )  # fmt: skip
    module = _package(monkeypatch, sg_inst.V2_MODULE, path=False)
    torch = pytest.importorskip("torch")

    class EagleDraftWorker:
        draft_runner = None
        parallel_layout = types.SimpleNamespace(local_dp=False)

        def draft(self, batch: Any, *, with_topology: bool = False) -> Any:
            calls.append("draft-idle" if batch.forward_mode.is_idle() else "draft")
            return _SpecInput(verify=True)

        def _draft_extend_for_decode(
            self, batch: Any, batch_result: Any, *, kv_loc_plan: Any = None
        ) -> None:
            calls.append("draft_extend")

        def _draft_extend_for_prefill(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append("draft_extend_prefill")
            return _SpecInput(verify=False)

    class Target:
        model_config = types.SimpleNamespace(vocab_size=32)

        def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
            calls.append("prefill")
            logits = types.SimpleNamespace(hidden_states=None, mm_input_embeds=None)
            return _Result(kv_loc_plan=None, logits_output=logits, next_token_ids=None,
                           extra_keep_alive_refs=None)  # fmt: skip

    def init_new(*args: Any) -> Any:
        idle = _Batch("extend", 0)  # the idle draft batch a prefilling rank drafts over

        def prepare_for_idle() -> None:
            idle.forward_mode = _Mode("idle")

        idle.prepare_for_idle = prepare_for_idle  # type: ignore[attr-defined]
        return idle

    stages: list[str] = []
    context = contextlib.nullcontext
    namespace: dict[str, Any] = {
        "DPSpecPrefillCoordinationPlan": plan_module.DPSpecPrefillCoordinationPlan,
        "CaptureHiddenMode": types.SimpleNamespace(NULL=0, LAST=1, FULL=2),
        "EagleDraftInput": types.SimpleNamespace(
            create_idle_input=lambda **kwargs: _SpecInput(verify=False)
        ),
        "ScheduleBatch": types.SimpleNamespace(init_new=init_new),
        "ForwardMode": types.SimpleNamespace(DECODE=_Mode("decode")),
        "envs": types.SimpleNamespace(
            SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=types.SimpleNamespace(get=lambda: False)
        ),
        "get_parallel": lambda: types.SimpleNamespace(attn_dp_rank=rank, pp_size=1),
        "get_draft_recurrent_hidden_state_spec": lambda runner: (8, torch.float32),
        "draft_tp_context": lambda layout: context(),
        "speculative_moe_backend_context": context,
        "speculative_moe_a2a_backend_context": context,
        "spec_stage_span": lambda name: _Stage(stages, name),
    }
    real = _real_methods(
        LATEST, sg_inst.V2_MODULE, "EAGLEWorkerV2",
        ("forward_batch_generation", "_forward_dp_spec_prefill_coordination",
         "_forward_prefill_batch"),
        namespace,
    )  # fmt: skip

    def __init__(self: Any, accept: list[int]) -> None:
        self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens = 1, 3, 4
        self.enable_dp_spec_prefill_coordination = coordination
        self.draft_worker = self._draft_worker = EagleDraftWorker()
        self.target_worker = Target()
        self.speculative_algorithm = types.SimpleNamespace(is_standalone=lambda: False)
        self.device = "cpu"
        self._accept = accept

    def verify(self: Any, batch: Any, pp_proxy_tensors: Any = None,
               grammar_barrier: Any = None) -> Any:  # fmt: skip
        assert batch.spec_info.is_verify_input()
        calls.append("verify")
        return _Result(accept_lens=torch.tensor(self._accept, dtype=torch.int32),
                       new_seq_lens=batch.seq_lens)  # fmt: skip

    module.EagleDraftWorker = EagleDraftWorker
    module.EAGLEWorkerV2 = type("EAGLEWorkerV2", (), {
        **real, "__init__": __init__, "verify": verify,
        "activate_step_by_batch": lambda self, bs: None, "stages": stages,
    })  # fmt: skip
    return module


@pytest.mark.parametrize("coordination", [True, False], ids=["coordinated", "uncoordinated"])
def test_dp_attention_decode_rank_beside_a_prefilling_peer_is_a_cycle_when_coordinated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any, coordination: bool
) -> None:
    """0.5.23's own step: with SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=1 the decode rank of a
    DP-attention group drafts, verifies and extends its rows while its peer prefills; without
    it the worker runs a batch so flagged as prefill (the scheduler then hands the decode rank
    an idle batch anyway). Plain decode steps are cycles either way."""
    calls: list[str] = []
    v2 = _real_eagle_v2(monkeypatch, tmp_path, calls, coordination=coordination, rank=0)
    observer = _instrumented_observer(monkeypatch)
    worker = v2.EAGLEWorkerV2(accept=[1, 4, 2])
    # Rank 0 decodes 3 requests, rank 1 prefills 50 tokens: a heterogeneous plan.
    for _ in range(2):
        batch = _DPBatch("decode", 3, peers_prefill=True, counts=[3, 50], prefills=[0, 1])
        out = worker.forward_batch_generation(batch)
    worker.forward_batch_generation(
        _DPBatch("decode", 3, peers_prefill=False, counts=[3, 2], prefills=[0, 0])
    )
    snap = _snapshot(observer)
    coordinated = 2 if coordination else 0
    if coordination:
        assert out.accept_lens.tolist() == [1, 4, 2]
        assert calls == ["draft", "verify", "draft_extend"] * 3
        # The coordination plan sized this rank's verify (3 requests x 4 tokens), not the peer's.
        assert batch.global_num_tokens == [3 * 4, 50]
    else:
        assert calls == ["prefill", "draft_extend_prefill"] * 2 + ["draft", "verify",
                                                                   "draft_extend"]
    _assert_counted(snap, coordinated + 1, drafted=(coordinated + 1) * 3 * 3,
                    accepted=(coordinated + 1) * (0 + 3 + 1))  # fmt: skip
    assert snap.emitted_tokens_total == (coordinated + 1) * (1 + 4 + 2)
    assert not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


def test_dp_attention_prefilling_rank_of_a_coordinated_step_records_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any
) -> None:
    """The peer's side: it drafts over an idle batch (the collectives need it) and prefills."""
    calls: list[str] = []
    v2 = _real_eagle_v2(monkeypatch, tmp_path, calls, coordination=True, rank=1)
    observer = _instrumented_observer(monkeypatch)
    worker = v2.EAGLEWorkerV2(accept=[2])
    worker.forward_batch_generation(
        _DPBatch("extend", 2, peers_prefill=True, counts=[3, 50], prefills=[0, 1])
    )
    assert calls == ["draft-idle", "prefill", "draft_extend_prefill"]
    assert v2.EAGLEWorkerV2.stages == ["draft", "draft_extend"]
    snap = _snapshot(observer)
    assert snap.cycles_total == 0
    assert snap.draft_tokens_total == 0
    assert not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


def test_latest_release_dp_spec_prefill_coordination_seams() -> None:
    """What the coordinated-step hook relies on in 0.5.23's source."""
    node = _class_in(LATEST, sg_inst.V2_MODULE, "EAGLEWorkerV2")
    step = _method(node, "forward_batch_generation")
    coordinated = _method(node, "_forward_dp_spec_prefill_coordination")
    # The worker's step hands every is_extend_in_batch batch of a heterogeneous plan to it ...
    src = ast.unparse(step)
    assert "batch.is_extend_in_batch and self.enable_dp_spec_prefill_coordination" in src
    assert "self._forward_dp_spec_prefill_coordination(batch, plan, on_publish" in src
    assert "enable_dp_spec_prefill_coordination" in _fields(node)
    # ... whose batch is its second argument (the hook reads it there) ...
    assert _params(coordinated)[:2] == ["self", "batch"]
    # ... and which decides prefill by this rank's own forward mode, then drafts, verifies and
    # extends through the methods specobs hooks, in that order.
    body = ast.unparse(coordinated)
    assert "is_prefill = batch.forward_mode.is_extend()" in body
    order = sorted(
        (n.lineno, n.func.attr)
        for n in ast.walk(coordinated)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("draft", "verify", "_draft_extend_for_decode")
    )
    assert [name for _, name in order] == ["draft", "verify", "_draft_extend_for_decode"]
    # The plan flags the batch is_extend_in_batch, so the step hook never sees it as decode.
    plan = _tree("sglang", LATEST, SG + "dp_spec_prefill_coordination.py")
    assert plan is not None
    apply = _method(_class(plan, "DPSpecPrefillCoordinationPlan"), "apply")
    assert "batch.is_extend_in_batch = True" in ast.unparse(apply)
    # Only EAGLE, EAGLE3 (EAGLEWorkerV2) and DSPARK (its own coordinated step, hooked) may turn
    # it on.
    hook = _tree("sglang", LATEST, "sglang/srt/arg_groups/speculative_hook.py")
    assert hook is not None
    assert "('EAGLE', 'EAGLE3', 'DSPARK')" in ast.unparse(hook)
    # That step never activates adaptive steps; adaptive speculation is off under attention DP,
    # so the speculative_num_steps the hook reads for the drafted count is the configured one.
    assert "activate_step_by_batch" not in body
    adaptive = _tree("sglang", LATEST, SG + "adaptive_spec_params.py")
    assert adaptive is not None
    reason = next(
        n for n in adaptive.body
        if isinstance(n, ast.FunctionDef) and n.name == "adaptive_unsupported_reason"
    )  # fmt: skip
    assert "if attn_dp_enabled_of(resolved_view(server_args)):" in ast.unparse(reason)


# -- unsupported classes: one warning per class, exported, never silent ----------------------------


def _spec_info(monkeypatch: pytest.MonkeyPatch, returns: dict[str, type]) -> types.ModuleType:
    module = _speculative_module(monkeypatch, sg_inst.SPEC_INFO_MODULE)

    class SpeculativeAlgorithm:
        def __init__(self, name: str) -> None:
            self.name = name

        def create_worker(self, server_args: Any) -> Any:
            return returns[self.name]

    module.SpeculativeAlgorithm = SpeculativeAlgorithm
    return module


def test_unsupported_workers_warn_once_per_class_and_export_it(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)

    # Out-of-tree classes (a platform's worker, a plugin algorithm's): none is hooked.
    class PlatformWorker:
        def forward_batch_generation(self, batch: Any, on_publish: Any = None) -> Any:
            calls.append("platform")
            return _accept([2])

    class PluginWorker(PlatformWorker):
        pass

    originals = dict(vars(PlatformWorker))
    spec = _spec_info(
        monkeypatch,
        {"PLATFORM": PlatformWorker, "PLUGIN": PluginWorker, "EAGLE": v2.EAGLEWorkerV2},
    )
    _host_only(monkeypatch)
    monkeypatch.setenv("SPECOBS_EXPORTERS", "none")
    inst = _instrument(monkeypatch)
    caplog.set_level(logging.WARNING, logger="specobs.instrument")

    assert spec.SpeculativeAlgorithm("EAGLE").create_worker(None) is v2.EAGLEWorkerV2
    assert "does not time" not in caplog.text  # a hooked class is not reported
    cls = spec.SpeculativeAlgorithm("PLATFORM").create_worker(None)
    assert cls is PlatformWorker
    worker = cls()
    for _ in range(5):
        assert worker.forward_batch_generation(_Batch("decode", 1)).accept_lens.tolist() == [2]
    assert calls == ["platform"] * 5
    warnings = [r for r in caplog.records if "does not time" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "PlatformWorker" in warnings[0].getMessage()
    assert "specobs has no hooks for its decode step" in warnings[0].getMessage()
    observer = inst.current_observer
    assert observer is not None
    assert observer.settings.integration == "unsupported"
    assert _snapshot(observer).errors.get("unsupported_engine") == 1

    # A second unsupported class in the same process still gets its own single line.
    spec.SpeculativeAlgorithm("PLUGIN").create_worker(None)().forward_batch_generation(
        _Batch("decode", 1)
    )
    spec.SpeculativeAlgorithm("PLUGIN").create_worker(None)().forward_batch_generation(
        _Batch("decode", 1)
    )
    warnings = [r for r in caplog.records if "does not time" in r.getMessage()]
    assert len(warnings) == 2 and "PluginWorker" in warnings[1].getMessage()

    inst.uninstrument()
    assert dict(vars(PlatformWorker)) == originals
    assert "create_worker" in vars(spec.SpeculativeAlgorithm)
    assert not hasattr(spec.SpeculativeAlgorithm.create_worker, "__wrapped__")


# -- topology --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        # tp 4, pp 2: stage 0 (WORLD ranks 0-3) never runs the worker's decode step.
        (dict(tp_rank=0, tp_size=4, pp_rank=0, pp_size=2), Topology(False, 0)),
        (dict(tp_rank=0, tp_size=4, pp_rank=1, pp_size=2), Topology(True, 4)),
        (dict(tp_rank=1, tp_size=4, pp_rank=1, pp_size=2), Topology(False, 5)),
        # --dp-size 2: each replica's WORLD starts at 0; dp_rank tells them apart.
        (dict(tp_rank=0, tp_size=2, dp_rank=1, dp_ranks=2), Topology(True, 0, 1, 2)),
        (dict(tp_rank=1, tp_size=2, dp_rank=1, dp_ranks=2), Topology(False, 1, 1, 2)),
        # DP attention, tp 8 in 4 groups of 2: TP rank 6 leads group 3.
        (
            dict(tp_rank=6, tp_size=8, dp_rank=3, dp_ranks=4, attn_dp_size=4),
            Topology(True, 0, 3, 4),
        ),
        (
            dict(tp_rank=7, tp_size=8, dp_rank=3, dp_ranks=4, attn_dp_size=4),
            Topology(False, 1, 3, 4),
        ),
        # One replica: no dp_rank label.
        (dict(tp_rank=0, tp_size=1, dp_rank=0, dp_ranks=1), Topology(True, 0, None, 1)),
    ],
)
def test_topology_from_ranks(ranks: dict[str, int], expected: Topology) -> None:
    assert sg_inst.topology_from(**ranks) == expected


class _Parallel:
    """The fields of 0.5.23's ParallelContext that topology_of reads."""

    def __init__(self, **fields: Any) -> None:
        defaults = dict(tp_size=1, pp_rank=0, pp_size=1, dp_rank=None, dp_size=1, attn_dp_size=1)
        self.__dict__.update({**defaults, **fields})
        self.num_dp_ranks = self.dp_size * self.attn_dp_size


def _runtime_context(monkeypatch: pytest.MonkeyPatch, parallel: _Parallel) -> None:
    module = _package(monkeypatch, "sglang.srt.runtime_context", path=False)
    module.get_parallel = lambda: parallel


def test_pipeline_parallel_records_on_the_last_stage_only(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    _host_only(monkeypatch)
    monkeypatch.setenv("SPECOBS_EXPORTERS", "none")
    seen = {}
    for pp_rank in (0, 1):
        # WORLD rank 0 is PP stage 0; the last stage's TP rank 0 is WORLD rank 2 here.
        _runtime_context(monkeypatch, _Parallel(tp_rank=0, tp_size=2, pp_rank=pp_rank, pp_size=2))
        inst = _instrument(monkeypatch)
        worker = v2.EAGLEWorkerV2(accept=[2, 3], pp=True)
        for _ in range(3):
            worker.forward_batch_generation(_Batch("decode", 2))
        observer = inst.current_observer
        assert observer is not None
        seen[pp_rank] = (observer.settings.leader, observer.settings.rank, _snapshot(observer))
        observer.shutdown(timeout_seconds=5.0)
        inst.uninstrument()
        inst._observer = None
    assert seen[0][0] is False and seen[0][2].cycles_total == 0
    leader, rank, snap = seen[1]
    assert (leader, rank) == (True, 2)
    assert snap.cycles_total == 3
    assert snap.accepted_tokens_total == 3 * (1 + 2)
    # On the last stage the draft runs last (the PP tail draft): it is still booked as draft.
    assert calls.count("draft-tail") == 6 and "draft" not in calls
    for phase in ("draft", "verify", "bookkeeping"):
        assert snap.phase_count(phase, "host") == 3
        assert snap.phase_seconds_sum(phase, "host") > 0.0


def test_dp_replica_with_a_taken_port_warns_once_and_never_retries(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    pytest.importorskip("prometheus_client")
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    _host_only(monkeypatch)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    base = taken.getsockname()[1] - 1  # replica 1 gets base + 1: the taken port
    monkeypatch.setenv("SPECOBS_EXPORTERS", "prometheus")
    monkeypatch.setenv("SPECOBS_PROMETHEUS_PORT", str(base))
    monkeypatch.setenv("SPECOBS_PROMETHEUS_ADDR", "127.0.0.1")
    _runtime_context(monkeypatch, _Parallel(tp_rank=0, tp_size=1, dp_rank=1, dp_size=2))
    configured: list[dict[str, Any]] = []
    real_configure = specobs.configure

    def counting_configure(**kwargs: Any) -> Any:
        configured.append(kwargs)
        return real_configure(**kwargs)

    monkeypatch.setattr(specobs, "configure", counting_configure)
    caplog.set_level(logging.WARNING, logger="specobs.instrument")
    try:
        inst = _instrument(monkeypatch)
        worker = v2.EAGLEWorkerV2(accept=[2])
        for _ in range(50):
            worker.forward_batch_generation(_Batch("decode", 1))
    finally:
        taken.close()
    assert len(configured) == 1, "configure() must not be retried on every step"
    assert configured[0]["replica"] == 1 and configured[0]["replicas"] == 2
    assert configured[0]["leader"] is True
    failures = [r for r in caplog.records if "could not start recording" in r.getMessage()]
    assert len(failures) == 1
    assert "replica 1/2" in failures[0].getMessage()
    observer = inst.current_observer
    assert observer is not None and not observer.settings.enabled
    assert calls.count("verify") == 50  # the engine ran every step


def test_dp_replica_labels_and_port(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[str] = []
    v2 = _eagle_v2(monkeypatch, calls)
    _host_only(monkeypatch)
    monkeypatch.setenv("SPECOBS_EXPORTERS", "none")
    _runtime_context(monkeypatch, _Parallel(tp_rank=0, tp_size=1, dp_rank=2, dp_size=3))
    inst = _instrument(monkeypatch)
    v2.EAGLEWorkerV2(accept=[2]).forward_batch_generation(_Batch("decode", 1))
    observer = inst.current_observer
    assert observer is not None
    settings = observer.settings
    assert (settings.replica, settings.replicas, settings.leader) == (2, 3, True)
    assert _snapshot(observer).cycles_total == 1


def test_topology_falls_back_to_worker_ranks_on_older_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "sglang.srt.runtime_context", raising=False)
    args = types.SimpleNamespace(tp_size=2, pp_size=2, dp_size=2, enable_dp_attention=False)
    target = types.SimpleNamespace(tp_rank=0, pp_rank=1, dp_rank=1, server_args=args)
    worker = types.SimpleNamespace(target_worker=target, server_args=args)
    assert sg_inst.topology_of(worker) == Topology(True, 2, 1, 2)
    target.pp_rank = 0
    assert sg_inst.topology_of(worker).leader is False


# -- import cost: the plugin imports nothing of SGLang; classes patch on SGLang's import -----------


def test_plugin_imports_no_worker_module_and_patches_on_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_instrumentors: Any
) -> None:
    """A real on-disk package: the worker module is imported after the plugin ran."""
    pkg = tmp_path / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True)
    for directory in (pkg.parent.parent, pkg.parent, pkg):
        (directory / "__init__.py").write_text("")
    (pkg / "eagle_worker_v2.py").write_text(
        textwrap.dedent(
            """
            class EagleDraftWorker:
                def draft(self, batch, *, with_topology=False):
                    return None

                def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
                    return None


            class EAGLEWorkerV2:
                def forward_batch_generation(self, batch, on_publish=None):
                    return None

                def verify(self, batch, grammar_barrier=None):
                    return None
            """
        )
    )
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(sg_inst.SPECOBS_SGLANG, "1")
    monkeypatch.setattr(sg_inst.SGLangInstrumentor, "package", _Installed(SGLANG_RANGE, LATEST))
    sg_inst.sglang_plugin()
    assert sg_inst.SGLangInstrumentor().is_instrumented
    assert sg_inst.V2_MODULE not in sys.modules  # the plugin imported nothing of SGLang
    assert not [m for m in sys.modules if m.startswith("sglang")]
    try:
        module = importlib.import_module(sg_inst.V2_MODULE)
        assert sg_inst.is_hooked(module.EAGLEWorkerV2)  # patched as SGLang imported it
        sg_inst.SGLangInstrumentor().uninstrument()
        assert not sg_inst.is_hooked(module.EAGLEWorkerV2)
    finally:
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
