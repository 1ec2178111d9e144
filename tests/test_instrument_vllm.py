"""The vLLM plugin against vLLM's real code: the pinned wheels' runners, worker and config.

1. Contracts read from the pinned wheels with ``ast`` (nothing of vLLM is imported): every seam
   of model runner V1 and V2, and -- the check that matters most -- which runner class the
   worker *builds* for each documented speculative configuration, evaluated with vLLM's own
   ``use_v2_model_runner`` from the wheel. It fails when vLLM starts building a runner specobs
   does not instrument.
2. Behaviour: stand-in runners written as real modules under a ``vllm`` package on
   ``sys.path``, imported through the ordinary import system *after* vLLM's real
   ``load_general_plugins()`` (from the wheel) ran the plugin, so the post-import patching path
   is the one exercised. They mirror the call order of the real ``execute_model`` /
   ``sample_tokens``.

The real engine runs in tests/test_engine_vllm_cpu.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import logging
import sys
import textwrap
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

import specobs
from specobs.instrument import vllm as vl_inst
from specobs.instrument._base import Topology
from specobs.instrument._package_vllm import PACKAGE as VLLM_RANGE
from tests._pinned_wheels import wheel as _wheel
from tests.test_instrument_contracts import (
    _calls,
    _class,
    _fields,
    _Installed,
    _method,
    _module_constant,
    _params,
    _source,
    _tree,
)

VERSION = "0.33.0"
V2_VERSIONS = ("0.33.0", "0.34.0")
"""The releases whose model runner V2 the contract tests read (0.34 deleted V1)."""
V1_FILE = "vllm/v1/worker/gpu_model_runner.py"
V2_FILE = "vllm/v1/worker/gpu/model_runner.py"


# -- 1. contracts from the wheel -------------------------------------------------------------------


V1_SIGNATURES = {
    "execute_model": ["self", "scheduler_output", "intermediate_tensors"],
    "_sample": ["self", "logits", "spec_decode_metadata"],
    "sample_tokens": ["self", "grammar_output"],
    "_bookkeeping_sync": ["self", "scheduler_output", "sampler_output"],
    "propose_draft_token_ids": ["self", "scheduler_output", "sampled_token_ids"],
}
V2_SIGNATURES = {
    "execute_model": ["self", "scheduler_output", "intermediate_tensors", "dummy_run"],
    "sample": ["self", "hidden_states", "input_batch", "grammar_output"],
    "postprocess_sampled": ["self", "idx_mapping", "sampled_tokens", "num_sampled"],
    "sample_tokens": ["self", "grammar_output"],
}


@pytest.mark.parametrize("version", V2_VERSIONS)
def test_v1_and_v2_seams_exist_with_the_signatures_the_hooks_read(version: str) -> None:
    assert VLLM_RANGE.tested(version)
    assert set(V1_SIGNATURES) == set(vl_inst.HOOKS_V1)
    assert set(V2_SIGNATURES) == set(vl_inst.HOOKS_V2)
    v1 = _tree("vllm", version, V1_FILE)
    if version >= "0.34":
        assert v1 is None  # model runner V1 was deleted: only its post-import hook waits
    for path, signatures in ((V1_FILE, V1_SIGNATURES), (V2_FILE, V2_SIGNATURES)):
        if path == V1_FILE and v1 is None:
            continue
        tree = _tree("vllm", version, path)
        assert tree is not None, path
        runner = _class(tree, vl_inst.RUNNER_CLASS)
        for method, expected in signatures.items():
            params = _params(_method(runner, method))
            assert params[: len(expected)] == expected, (path, method, params)
    assert [m.replace(".", "/") + ".py" for m in vl_inst.RUNNERS] == [V1_FILE, V2_FILE]


def test_v1_seams_in_the_oldest_supported_release() -> None:
    oldest = VLLM_RANGE.minimum + ".0"
    tree = _tree("vllm", oldest, V1_FILE)
    assert tree is not None
    runner = _class(tree, vl_inst.RUNNER_CLASS)
    own = {n.name for n in runner.body if isinstance(n, ast.FunctionDef)}
    # Before the split, execute_model sampled, drafted and did the bookkeeping itself and
    # returned the output: the cycle then ends where execute_model returns.
    assert "sample_tokens" not in own
    assert "self._sample" in _calls(_method(runner, "execute_model"))
    for method, expected in V1_SIGNATURES.items():
        if method != "sample_tokens":
            assert _params(_method(runner, method))[: len(expected)] == expected, method
    assert "speculative_config" in _fields(runner)
    assert _tree("vllm", oldest, V2_FILE) is None  # no model runner V2 yet
    metadata = _tree("vllm", oldest, "vllm/v1/spec_decode/metadata.py")
    assert metadata is not None
    assert "num_draft_tokens" in _fields(_class(metadata, "SpecDecodeMetadata"))
    sampler = _tree("vllm", oldest, "vllm/v1/sample/rejection_sampler.py")
    assert sampler is not None
    assert _module_constant(sampler, "PLACEHOLDER_TOKEN_ID") == vl_inst.PLACEHOLDER_TOKEN_ID


@pytest.mark.parametrize("version", V2_VERSIONS)
def test_v2_sample_tokens_runs_sample_then_the_state_update_then_the_speculator(
    version: str,
) -> None:
    """The V2 phase split rests on this order inside ``sample_tokens``."""
    tree = _tree("vllm", version, V2_FILE)
    assert tree is not None
    runner = _class(tree, vl_inst.RUNNER_CLASS)
    body = _method(runner, "sample_tokens")
    lines: dict[str, int] = {}
    for node in ast.walk(body):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("self.sample", "self.postprocess_sampled", "self.speculator.propose"):
                lines.setdefault(name, node.lineno)
    assert set(lines) == {"self.sample", "self.postprocess_sampled", "self.speculator.propose"}
    assert lines["self.sample"] < lines["self.postprocess_sampled"] < lines[
        "self.speculator.propose"
    ]
    assert vl_inst.V2_PHASES == ("verify", "bookkeeping", "draft")
    # sample() returns (sampler_output, num_sampled, num_rejected): the hook reads index 1.
    sample = _method(runner, "sample")
    returns = [n for n in ast.walk(sample) if isinstance(n, ast.Return) and n.value is not None]
    assert [ast.unparse(r.value) for r in returns] == [
        "(sampler_output, sampler_output.num_sampled, sampler_output.num_rejected)"
    ]
    batch = _tree("vllm", version, "vllm/v1/worker/gpu/input_batch.py")
    assert batch is not None
    assert {"num_draft_tokens", "num_draft_tokens_per_req"} <= _fields(_class(batch, "InputBatch"))
    # num_sampled = accepted drafts + 1; 0 while a request is still in chunked prefill.
    kernel = _source("vllm", version, "vllm/v1/worker/gpu/input_batch.py")
    assert kernel is not None and "num_rejected = num_logits - num_sampled" in kernel
    assert "num_sampled = tl.where(is_chunked_prefilling, 0, num_sampled)" in kernel


def test_v1_phase_order_follows_the_branch_in_sample_tokens() -> None:
    tree = _tree("vllm", VERSION, V1_FILE)
    assert tree is not None
    text = ast.unparse(_method(_class(tree, vl_inst.RUNNER_CLASS), "sample_tokens"))
    # The predicates v1_phase_order mirrors, and where the host-token drafters run.
    for needle in (
        "spec_config.use_eagle()", "spec_config.uses_draft_model()",
        "spec_config.uses_extract_hidden_states()", "spec_config.disable_padded_drafter_batch",
        "spec_config.use_ngram_gpu()", "draft_after_bookkeeping = True",
    ):  # fmt: skip
        assert needle in text, needle

    def config(method: str, padded: bool = True) -> Any:
        return types.SimpleNamespace(
            method=method,
            disable_padded_drafter_batch=not padded,
            use_eagle=lambda: method in ("eagle", "eagle3", "mtp"),
            uses_draft_model=lambda: method == "draft_model",
            uses_extract_hidden_states=lambda: False,
            use_ngram_gpu=lambda: method == "ngram_gpu",
        )

    gpu_first = ("verify", "draft", "bookkeeping")
    host_first = ("verify", "bookkeeping", "draft")
    for method in ("eagle", "eagle3", "mtp", "draft_model", "ngram_gpu"):
        assert vl_inst.v1_phase_order(config(method)) == gpu_first, method
    for method in ("ngram", "suffix"):
        assert vl_inst.v1_phase_order(config(method)) == host_first, method
    assert vl_inst.v1_phase_order(config("eagle3", padded=False)) == host_first
    # Releases whose config lacks the predicates: by the method's name.
    assert vl_inst.v1_phase_order(types.SimpleNamespace(method="ngram")) == host_first
    assert vl_inst.v1_phase_order(types.SimpleNamespace(method="eagle")) == gpu_first


def _function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    fn = _method(_class(tree, cls), name)
    fn = ast.FunctionDef(**{**fn.__dict__, "decorator_list": []})  # a plain function
    return fn


def _use_v2(method: str, env: bool | None, has_triton: bool = True) -> bool:
    """vLLM's own ``VllmConfig.use_v2_model_runner``, from the wheel, on a stub config."""
    tree = _tree("vllm", VERSION, "vllm/config/vllm.py")
    assert tree is not None
    module = ast.Module(
        body=[
            _function(tree, "VllmConfig", "use_v2_model_runner"),
            _function(tree, "VllmConfig", "_get_v2_model_runner_unsupported_features"),
        ],
        type_ignores=[],
    )
    ast.fix_missing_locations(module)
    quiet = types.SimpleNamespace(warning_once=lambda *a, **k: None, info_once=lambda *a, **k: None)
    scope: dict[str, Any] = {
        "envs": types.SimpleNamespace(VLLM_USE_V2_MODEL_RUNNER=env),
        "HAS_TRITON": has_triton,
        "current_platform": types.SimpleNamespace(is_unspecified=lambda: False),
        "logger": quiet,
    }
    exec(compile(module, "vllm/config/vllm.py", "exec"), scope)
    config = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None),
        watermark_config=None,
        speculative_config=types.SimpleNamespace(
            method=method, parallel_drafting=False, use_heterogeneous_vocab=False
        ),
        parallel_config=types.SimpleNamespace(
            distributed_executor_backend="mp", pipeline_parallel_size=1, use_ubatching=False
        ),
    )
    config._get_v2_model_runner_unsupported_features = types.MethodType(
        scope["_get_v2_model_runner_unsupported_features"], config
    )
    return bool(scope["use_v2_model_runner"](config))


def _runner_imports(path: str, cls: str, method: str) -> dict[bool, set[str]]:
    """Modules ``cls.method`` imports a runner class from, under ``if self.use_v2_model_runner``
    (True) and outside it (False)."""
    tree = _tree("vllm", VERSION, path)
    assert tree is not None
    fn = _method(_class(tree, cls), method)
    found: dict[bool, set[str]] = {True: set(), False: set()}

    def visit(node: ast.AST, v2: bool) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "self.use_v2_model_runner":
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, False)
            return
        if isinstance(node, ast.ImportFrom) and any("ModelRunner" in a.name for a in node.names):
            found[v2].add(node.module or "")
        for child in ast.iter_child_nodes(node):
            visit(child, v2)

    for stmt in fn.body:
        visit(stmt, False)
    return found


@pytest.mark.parametrize("method", ["eagle", "eagle3", "ngram", "draft_model", "mtp"])
def test_the_runner_the_worker_builds_is_one_specobs_instruments(method: str) -> None:
    # vLLM 0.33.0 builds model runner V2 for the documented configurations by default ...
    assert _use_v2(method, env=None) is True
    # ... V1 when asked to, or when Triton is missing.
    assert _use_v2(method, env=False) is False
    assert _use_v2(method, env=None, has_triton=False) is False
    gpu = _runner_imports("vllm/v1/worker/gpu_worker.py", "Worker", "_make_model_runner")
    # mm_encoder_model_runner is the encoder-only runner (no speculative decoding).
    assert gpu[True] - {"vllm.v1.worker.mm_encoder_model_runner"} == {vl_inst.V2_MODULE}
    assert gpu[False] == {vl_inst.V1_MODULE}
    # The CPU worker builds subclasses of the same two runners.
    cpu = _runner_imports("vllm/v1/worker/cpu_worker.py", "CPUWorker", "init_device")
    assert cpu == {True: {"vllm.v1.worker.cpu.model_runner"}, False: set()}
    for path, base_module in (
        ("vllm/v1/worker/cpu/model_runner.py", vl_inst.V2_MODULE),
        ("vllm/v1/worker/cpu_model_runner.py", vl_inst.V1_MODULE),
    ):
        tree = _tree("vllm", VERSION, path)
        assert tree is not None
        runner = _class(tree, "CPUModelRunner")
        assert [ast.unparse(b) for b in runner.bases] == [vl_inst.RUNNER_CLASS]
        imported = {
            n.module for n in tree.body
            if isinstance(n, ast.ImportFrom) and any(a.name == "GPUModelRunner" for a in n.names)
        }  # fmt: skip
        assert imported == {base_module}, path
        # The CPU runners keep the seams (an override would bypass the hooks).
        own = {n.name for n in runner.body if isinstance(n, ast.FunctionDef)}
        assert not own & (set(vl_inst.HOOKS_V1) | set(vl_inst.HOOKS_V2)), path


def test_worker_load_model_is_where_the_runner_is_checked() -> None:
    tree = _tree("vllm", VERSION, "vllm/v1/worker/gpu_worker.py")
    assert tree is not None
    worker = _class(tree, vl_inst.WORKER_CLASS)
    assert _params(_method(worker, "load_model"))[:1] == ["self"]
    # init_device builds the runner; the executors then call load_model, where specobs looks.
    built = {
        ast.unparse(n.value) for n in ast.walk(worker)
        if isinstance(n, ast.AnnAssign | ast.Assign) and n.value is not None
        and "self.model_runner" in ast.unparse(n)
    }  # fmt: skip
    assert "self._make_model_runner()" in built
    assert "self.model_runner.load_model" in _calls(_method(worker, "load_model"))
    uniproc = _source("vllm", VERSION, "vllm/v1/executor/uniproc_executor.py")
    multiproc = _source("vllm", VERSION, "vllm/v1/executor/multiproc_executor.py")
    assert uniproc is not None and "self.driver_worker.load_model()" in uniproc
    assert multiproc is not None and "self.worker.load_model()" in multiproc
    cpu = _tree("vllm", VERSION, "vllm/v1/worker/cpu_worker.py")
    assert cpu is not None
    assert [ast.unparse(b) for b in _class(cpu, "CPUWorker").bases] == ["Worker"]
    plugins = _tree("vllm", VERSION, "vllm/plugins/__init__.py")
    assert plugins is not None
    assert _module_constant(plugins, "DEFAULT_PLUGINS_GROUP") == "vllm.general_plugins"
    state = _tree("vllm", VERSION, "vllm/distributed/parallel_state.py")
    assert state is not None
    names = {n.name for n in state.body if isinstance(n, ast.FunctionDef)}
    assert {"get_tp_group", "get_pp_group"} <= names
    group = _class(state, "GroupCoordinator")
    assert {"rank_in_group", "world_size"} <= _fields(group)
    assert "is_last_rank" in {n.name for n in group.body if isinstance(n, ast.FunctionDef)}


# -- 2. behaviour: stand-ins imported through the real import system ------------------------------

STANDINS = {
    "vllm/__init__.py": "",
    "vllm/envs.py": "VLLM_PLUGINS = None\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/parallel_state.py": '''
        import types
        LAYOUT = {"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1}
        def get_tp_group():
            return types.SimpleNamespace(rank_in_group=LAYOUT["tp_rank"],
                                         world_size=LAYOUT["tp_size"])
        def get_pp_group():
            return types.SimpleNamespace(rank_in_group=LAYOUT["pp_rank"],
                                         world_size=LAYOUT["pp_size"],
                                         is_last_rank=LAYOUT["pp_rank"] == LAYOUT["pp_size"] - 1)
    ''',
    # Model runner V2, as vllm 0.33.0's execute_model / sample_tokens call it.
    "vllm/v1/worker/gpu/model_runner.py": '''
        import types
        import torch
        CALLS = []
        DEVICE = "cpu"
        NUM_SAMPLED = None

        class GPUModelRunner:
            def __init__(self, spec_config, dp=(0, 1)):
                self.speculative_config = spec_config
                self.parallel_config = types.SimpleNamespace(
                    data_parallel_rank=dp[0], data_parallel_size=dp[1])
                self.execute_model_state = None
                self.speculator = types.SimpleNamespace(propose=self._propose)

            def execute_model(self, scheduler_output, intermediate_tensors=None,
                              dummy_run=False):
                CALLS.append("dummy" if dummy_run else "forward")
                drafts = scheduler_output.scheduled_spec_decode_tokens
                per_req = [len(drafts.get(r, ())) for r in scheduler_output.num_scheduled_tokens]
                batch = types.SimpleNamespace(
                    req_ids=list(scheduler_output.num_scheduled_tokens),
                    num_draft_tokens=sum(per_req),
                    num_draft_tokens_per_req=(
                        __import__("numpy").array(per_req, dtype="int32") if drafts else None))
                self.execute_model_state = (batch, scheduler_output.accepted)
                return None

            def sample_tokens(self, grammar_output):
                if self.execute_model_state is None:
                    return None
                batch, accepted = self.execute_model_state
                self.execute_model_state = None
                sampler_output, num_sampled, num_rejected = self.sample(None, batch,
                                                                        grammar_output)
                CALLS.append("output-prep")
                self.postprocess_sampled(None, None, num_sampled, num_rejected)
                self.speculator.propose(batch, num_sampled, num_rejected)
                return "async-output"

            def sample(self, hidden_states, input_batch, grammar_output):
                CALLS.append("sample")
                if NUM_SAMPLED is not None:  # already on the device: no host-to-device copy
                    num_sampled = NUM_SAMPLED.clone()
                    return types.SimpleNamespace(), num_sampled, num_sampled * 0
                num_sampled = torch.tensor([a + 1 for a in self_accepted(input_batch)],
                                           dtype=torch.int32, device=DEVICE)
                return types.SimpleNamespace(), num_sampled, num_sampled * 0

            def postprocess_sampled(self, idx_mapping, sampled_tokens, num_sampled,
                                    num_rejected, query_start_loc=None, draft_tokens=None):
                CALLS.append("postprocess")

            def _propose(self, *args, **kwargs):
                CALLS.append("propose")

        def self_accepted(batch):
            if batch.num_draft_tokens_per_req is None:  # no drafts: one token per request
                return [0] * 3
            return ACCEPTED[: len(batch.num_draft_tokens_per_req)]

        ACCEPTED = [2, 3, 0]
    ''',
    # Model runner V1 (0.33.0): execute_model, then sample_tokens -> _sample -> draft/bookkeeping.
    "vllm/v1/worker/gpu_model_runner.py": '''
        import types
        import torch
        CALLS = []

        class GPUModelRunner:
            def __init__(self, spec_config, dp=(0, 1)):
                self.speculative_config = spec_config
                self.parallel_config = types.SimpleNamespace(
                    data_parallel_rank=dp[0], data_parallel_size=dp[1])
                self.execute_model_state = None

            def execute_model(self, scheduler_output, intermediate_tensors=None):
                CALLS.append("forward")
                drafts = scheduler_output.scheduled_spec_decode_tokens
                metadata = (types.SimpleNamespace(num_draft_tokens=[len(d) for d in
                                                                    drafts.values()])
                            if drafts else None)
                self.input_batch = types.SimpleNamespace(
                    req_ids=list(scheduler_output.num_scheduled_tokens))
                self.execute_model_state = (scheduler_output, metadata)
                return None

            def sample_tokens(self, grammar_output):
                scheduler_output, metadata = self.execute_model_state
                self.execute_model_state = None
                sampler_output = self._sample(None, metadata)
                first = self.speculative_config.method != "ngram"
                if first:
                    self.propose_draft_token_ids(scheduler_output, None)
                self._bookkeeping_sync(scheduler_output, sampler_output, None, None, 0)
                if not first:
                    self.propose_draft_token_ids(scheduler_output, None)
                return "model-runner-output"

            def _sample(self, logits, spec_decode_metadata):
                CALLS.append("sample")
                # Rows: 2 accepted of 3, all 3, none; -1 marks rejected slots.
                sampled = torch.tensor([[5, 6, 7, -1], [5, 6, 7, 8], [9, -1, -1, -1]])
                return types.SimpleNamespace(sampled_token_ids=sampled)

            def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args):
                CALLS.append("draft")

            def _bookkeeping_sync(self, scheduler_output, sampler_output, logits,
                                  hidden_states, num_scheduled_tokens):
                CALLS.append("bookkeeping")
    ''',
    "vllm/v1/worker/gpu_worker.py": '''
        import importlib

        class Worker:
            RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"

            def __init__(self, vllm_config):
                self.vllm_config = vllm_config
                self.model_runner = None

            def load_model(self):
                module, _, name = self.RUNNER.partition(":")
                cls = getattr(importlib.import_module(module), name)
                self.model_runner = cls(self.vllm_config.speculative_config)
    ''',
}


def _spec(method: str, k: int = 3) -> Any:
    return types.SimpleNamespace(
        method=method, num_speculative_tokens=k, disable_padded_drafter_batch=False,
        use_eagle=lambda: method in ("eagle", "eagle3"),
        uses_draft_model=lambda: method == "draft_model",
        uses_extract_hidden_states=lambda: False, use_ngram_gpu=lambda: False,
    )  # fmt: skip


def _step(drafts: dict[str, list[int]], requests: tuple[str, ...] = ("a", "b", "c")) -> Any:
    return types.SimpleNamespace(
        scheduled_spec_decode_tokens=drafts,
        num_scheduled_tokens={r: 1 + len(drafts.get(r, ())) for r in requests},
        accepted=None,
    )


DRAFTS = {"a": [1, 1, 1], "b": [2, 2, 2], "c": [3, 3, 3]}


@pytest.fixture
def vllm_standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ``vllm`` package of stand-ins on the path, nothing of it imported yet; the plugin
    enabled; fresh instrumentor state."""
    root = tmp_path / "site"
    for rel, text in STANDINS.items():
        file = root / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    monkeypatch.setattr(vl_inst.VllmInstrumentor, "package", _Installed(VLLM_RANGE, VERSION))
    monkeypatch.setenv(vl_inst.SPECOBS_VLLM, "1")
    monkeypatch.setenv("SPECOBS_CLOCK", "host")
    for var in ("SPECOBS_EXPORTERS", "SPECOBS_RANK", "RANK", "LOCAL_RANK", "SPECOBS_PHASES",
                "SPECOBS_ALL_RANKS"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    inst = vl_inst.VllmInstrumentor()
    inst.uninstrument()
    inst._observer = None
    yield root
    observer = inst.current_observer
    inst.uninstrument()
    inst._observer = None
    if observer is not None:
        observer.shutdown(timeout_seconds=5.0)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        sys.modules.pop(name, None)


@pytest.fixture(params=V2_VERSIONS)
def vllm_tree(
    vllm_standins: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Any:
    """The stand-ins plus vLLM's real ``vllm.plugins`` from each pinned wheel (0.33.0, 0.34.0),
    which finds specobs through an entry point."""
    plugins = _source("vllm", request.param, "vllm/plugins/__init__.py")
    assert plugins is not None
    (vllm_standins / "vllm/plugins").mkdir(parents=True)
    (vllm_standins / "vllm/plugins/__init__.py").write_text(plugins)
    entry = importlib.metadata.EntryPoint(
        name="specobs", value="specobs.instrument.vllm:vllm_plugin", group="vllm.general_plugins"
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [entry] if group == entry.group else []
    )
    return vllm_standins


def _load_plugins() -> None:
    plugins = importlib.import_module("vllm.plugins")
    plugins.load_general_plugins()
    plugins.load_general_plugins()  # vLLM calls it again in the same process: idempotent


def _snapshot(observer: Any) -> Any:
    assert observer.force_flush(timeout_seconds=5.0)
    return observer.snapshot()


def test_the_plugin_imports_no_runner_and_patches_v2_when_vllm_imports_it(vllm_tree: Any) -> None:
    _load_plugins()
    assert vl_inst.VllmInstrumentor().is_instrumented
    # Loading the plugin (API server, engine core, every process) imports nothing heavy.
    assert vl_inst.V1_MODULE not in sys.modules
    assert vl_inst.V2_MODULE not in sys.modules
    assert vl_inst.WORKER_MODULE not in sys.modules

    module = importlib.import_module(vl_inst.V2_MODULE)  # what the worker's runner choice does
    patched = module.GPUModelRunner.__dict__["sample"]
    assert patched.__specobs_hook__ is vl_inst.around_sample_v2  # patched as it was imported
    original = patched.__wrapped__
    runner = module.GPUModelRunner(_spec("eagle3"))
    runner.execute_model(_step({}), dummy_run=True)  # warm-up / DP padding: never a cycle
    runner.execute_model(_step({}))  # prefill step: nothing to verify
    runner.sample_tokens(None)
    for _ in range(4):  # every speculative step is a cycle, the first one included
        assert runner.execute_model(_step(DRAFTS)) is None
        assert runner.sample_tokens(None) == "async-output"

    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    assert tuple(observer.phases) == ("verify", "bookkeeping", "draft")
    snap = _snapshot(observer)
    assert snap.info["integration"] == "vllm_v2"
    assert snap.cycles_total == 4
    assert snap.draft_tokens_total == 4 * 9
    assert snap.accepted_tokens_total == 4 * (2 + 3 + 0)
    assert snap.accepted_by_position[:3] == (8, 8, 4)  # a and b accept positions 1-2, b 3
    assert not any(snap.errors.values()), snap.errors
    for phase in observer.phases:
        assert snap.phase_count(phase, "host") == 4
        assert snap.phase_seconds_sum(phase, "host") > 0.0
    assert module.CALLS.count("propose") == 5

    vl_inst.VllmInstrumentor().uninstrument()
    assert module.GPUModelRunner.__dict__["sample"] is original


@pytest.mark.parametrize(("method", "order"), [
    ("eagle3", ("verify", "draft", "bookkeeping")),
    ("draft_model", ("verify", "draft", "bookkeeping")),
    ("ngram", ("verify", "bookkeeping", "draft")),
])  # fmt: skip
def test_v1_records_the_first_step_in_the_order_of_its_drafter(
    vllm_tree: Any, method: str, order: tuple[str, ...]
) -> None:
    _load_plugins()
    module = importlib.import_module(vl_inst.V1_MODULE)
    runner = module.GPUModelRunner(_spec(method))
    runner.execute_model(_step({}))
    runner.sample_tokens(None)
    for _ in range(3):
        runner.execute_model(_step(DRAFTS))
        runner.sample_tokens(None)
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    assert tuple(observer.phases) == order
    snap = _snapshot(observer)
    assert snap.info["integration"] == "vllm_v1"
    assert snap.cycles_total == 3  # the first speculative step is no longer lost
    assert snap.draft_tokens_total == 3 * 9
    assert snap.accepted_tokens_total == 3 * (2 + 3 + 0)
    assert not any(snap.errors.values()), snap.errors
    for phase in order:
        assert snap.phase_count(phase, "host") == 3


def test_the_worker_check_names_the_runner_it_times(vllm_tree: Any, caplog: Any) -> None:
    _load_plugins()
    gpu_worker = importlib.import_module(vl_inst.WORKER_MODULE)
    config = types.SimpleNamespace(speculative_config=_spec("eagle3"))
    with caplog.at_level(logging.INFO, logger="specobs.instrument"):
        worker = gpu_worker.Worker(config)
        worker.load_model()
    assert "specobs times vLLM's model runner V2" in caplog.text
    assert vl_inst.VllmInstrumentor().runner_integration(worker.model_runner) == "vllm_v2"
    assert vl_inst.VllmInstrumentor().current_observer is None  # built on the first cycle


def test_a_runner_specobs_cannot_time_is_one_warning_and_says_so_in_the_metrics(
    vllm_tree: Any, caplog: Any
) -> None:
    (vllm_tree / "vllm/v1/worker/other_runner.py").write_text(textwrap.dedent('''
        class OtherRunner:
            def __init__(self, spec_config):
                self.speculative_config = spec_config
            def execute_model(self, scheduler_output):
                return None
    '''))
    _load_plugins()
    gpu_worker = importlib.import_module(vl_inst.WORKER_MODULE)
    gpu_worker.Worker.RUNNER = "vllm.v1.worker.other_runner:OtherRunner"
    config = types.SimpleNamespace(speculative_config=_spec("eagle3"))
    with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
        for _ in range(3):  # one worker loads once, but a warning must never repeat
            gpu_worker.Worker(config).load_model()
    warnings = [r for r in caplog.records if "does not time vllm" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "vllm.v1.worker.other_runner.OtherRunner" in warnings[0].getMessage()
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    snap = _snapshot(observer)
    assert snap.info["integration"] == "unsupported"
    assert snap.errors["unsupported_engine"] == 1
    assert snap.cycles_total == 0


def test_a_subclass_that_overrides_a_seam_is_not_claimed(vllm_tree: Any) -> None:
    _load_plugins()
    module = importlib.import_module(vl_inst.V2_MODULE)

    class Bypass(module.GPUModelRunner):  # type: ignore[name-defined, misc]
        def sample(self, *args: Any) -> Any:  # never calls the hooked method
            return None

    inst = vl_inst.VllmInstrumentor()
    assert inst.runner_integration(module.GPUModelRunner(_spec("eagle3"))) == "vllm_v2"
    assert inst.runner_integration(Bypass(_spec("eagle3"))) is None


def test_only_the_last_pipeline_stage_records(vllm_tree: Any) -> None:
    _load_plugins()
    state = importlib.import_module("vllm.distributed.parallel_state")
    module = importlib.import_module(vl_inst.V2_MODULE)
    state.LAYOUT.update(tp_rank=0, tp_size=2, pp_rank=0, pp_size=2)  # WORLD rank 0, stage 0
    runner = module.GPUModelRunner(_spec("eagle3"))
    for _ in range(3):
        runner.execute_model(_step(DRAFTS))
        runner.sample_tokens(None)
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None and not observer.settings.enabled
    assert vl_inst.topology(runner) == Topology(
        leader=False, rank=0, replica=None, replicas=1
    )
    state.LAYOUT.update(tp_rank=0, pp_rank=1)  # the last stage's TP rank 0 is the leader
    assert vl_inst.topology(runner).leader and vl_inst.topology(runner).rank == 2
    state.LAYOUT.update(tp_rank=1)
    assert not vl_inst.topology(runner).leader


def test_replicas_get_their_own_port_and_a_taken_port_is_one_warning(
    vllm_tree: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    import socket

    pytest.importorskip("prometheus_client")
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    base = blocker.getsockname()[1] - 1  # replica 1's port (base + 1) is taken
    monkeypatch.setenv("SPECOBS_EXPORTERS", "prometheus")
    monkeypatch.setenv("SPECOBS_PROMETHEUS_PORT", str(base))
    monkeypatch.setenv("SPECOBS_PROMETHEUS_ADDR", "127.0.0.1")
    calls = []
    real = specobs.configure

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(specobs, "configure", counting)
    _load_plugins()
    module = importlib.import_module(vl_inst.V2_MODULE)
    runner = module.GPUModelRunner(_spec("eagle3"), dp=(1, 2))
    try:
        with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
            for _ in range(50):
                runner.execute_model(_step(DRAFTS))
                runner.sample_tokens(None)
    finally:
        blocker.close()
    assert len(calls) == 1, "a failed start must not be retried on every step"
    assert calls[0]["replica"] == 1 and calls[0]["replicas"] == 2
    warnings = [r for r in caplog.records if "could not start recording" in r.getMessage()]
    assert len(warnings) == 1
    assert "replica 1/2" in warnings[0].getMessage()
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None and not observer.settings.enabled


def test_replica_labels_and_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    from specobs._observer import _port_offset

    pytest.importorskip("prometheus_client")
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host", rank=0, replica=3,
                            replicas=4)  # fmt: skip
    try:
        assert obs.settings.labels["dp_rank"] == "3"
        assert _port_offset(obs.settings) == 3
    finally:
        obs.shutdown(timeout_seconds=2.0)
    off = specobs.configure(sinks=[specobs.MemorySink()], clock="host", rank=1, leader=False)
    assert not off.settings.enabled
    every = specobs.configure(sinks=[specobs.MemorySink()], clock="host", rank=2, leader=False,
                              replica=1, replicas=4, all_ranks=True)  # fmt: skip
    try:
        assert every.settings.enabled
        assert every.settings.labels == {"dp_rank": "1", "rank": "2"}
        assert _port_offset(every.settings) == 1 + 4 * 2  # leaders keep port + dp_rank
    finally:
        every.shutdown(timeout_seconds=2.0)
    with pytest.raises(specobs.ConfigurationError, match="replica"):
        specobs.configure(sinks=[], replica=4, replicas=4)


@pytest.mark.gpu
def test_v2_acceptance_on_cuda_tensors_is_timed_on_the_gpu_without_a_sync(
    vllm_standins: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The V2 hooks on a real GPU: ``num_sampled`` is a CUDA tensor, phases on CUDA events."""
    import torch

    monkeypatch.setenv("SPECOBS_CLOCK", "cuda")
    vl_inst.vllm_plugin()
    module = importlib.import_module(vl_inst.V2_MODULE)
    module.DEVICE = "cuda"
    # The engine's own tensors, made before the sync check: sampled = accepted + the bonus token.
    module.NUM_SAMPLED = torch.tensor([3, 4, 1], dtype=torch.int32, device="cuda")
    runner = module.GPUModelRunner(_spec("eagle3"))
    torch.cuda.synchronize()
    steps = 40
    torch.cuda.set_sync_debug_mode("error")  # any hidden device sync on the hot path raises
    try:
        for _ in range(steps):
            runner.execute_model(_step(DRAFTS))
            runner.sample_tokens(None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    snap = _snapshot(observer)
    assert snap.cycles_total == steps
    assert snap.accepted_tokens_total == steps * (2 + 3 + 0)
    assert snap.draft_tokens_total == steps * 9
    assert not any(snap.errors.values()), snap.errors
    assert snap.sampled_cycles_total > 0
    for phase in vl_inst.V2_PHASES:
        assert snap.phase_count(phase, "gpu") == snap.sampled_cycles_total


def test_the_cpu_build_counts_as_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU build installs the ``vllm`` import package as the distribution ``vllm-cpu``."""
    installed = {"vllm-cpu": "0.32.0"}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert VLLM_RANGE.installed_version() == "0.32.0"
    assert VLLM_RANGE.tested("0.32.0")
    # What a dependency check (OpenTelemetry's loader) looks up is the installed distribution.
    assert tuple(vl_inst.VllmInstrumentor().instrumentation_dependencies()) == (
        "vllm-cpu >= 0.11",
    )
    installed["vllm"] = "0.33.0"  # both present: the upstream distribution wins
    assert VLLM_RANGE.installed_version() == "0.33.0"
    assert tuple(vl_inst.VllmInstrumentor().instrumentation_dependencies()) == (
        "vllm >= 0.11",
    )
    installed.clear()
    assert VLLM_RANGE.installed_version() is None
    assert tuple(vl_inst.VllmInstrumentor().instrumentation_dependencies()) == (
        "vllm >= 0.11",
    )


# -- host-side counts (V1 without async scheduling) ------------------------------------------------


def _state(prompt: int, out: list[int], *, max_tokens: int | None = 100, eos: int | None = None,
           stops: tuple[int, ...] = ()) -> Any:
    """A runner's ``CachedRequestState`` after ``_bookkeeping_sync`` extended its output."""
    params = types.SimpleNamespace(max_tokens=max_tokens, eos_token_id=eos,
                                   stop_token_ids=list(stops))
    return types.SimpleNamespace(sampling_params=params, output_token_ids=list(out),
                                 num_prompt_tokens=prompt)


@pytest.mark.parametrize(("tokens", "state", "kept"), [
    ([5, 6, 7], _state(10, [1, 2, 5, 6, 7]), 3),  # nothing ends it
    ([5, 6, 7], _state(10, [1, 2, 5, 6, 7], max_tokens=4), 2),  # max_tokens reached at 6
    ([5, 6, 7], _state(10, [1, 2, 5, 6, 7], max_tokens=5), 3),  # reached at the last token
    ([5, 6, 7], _state(10, [1, 2, 5, 6, 7], eos=5), 1),  # EOS first: the rest is dropped
    ([5, 6, 7], _state(10, [1, 2, 5, 6, 7], stops=(6,)), 2),  # a stop token
    ([5, 6, 7], _state(509, [1, 2, 5, 6, 7]), 1),  # 509 + 3 tokens reach max_model_len 512
    ([5], _state(10, [5], max_tokens=1), 1),  # the first token of a fresh request
])  # fmt: skip
def test_kept_tokens_stops_where_vllms_scheduler_does(tokens: list[int], state: Any,
                                                      kept: int) -> None:
    assert vl_inst.kept_tokens(tokens, state, 512) == kept


def test_kept_tokens_stops_at_a_repeating_tail_as_vllms_own_check_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``repetition_detection`` (0.33): vLLM's own ``check_sequence_repetition`` decides, on the
    output as it stood after each appended token, once ``min_tokens`` are out. A stand-in for it
    here (vLLM is not installed): a tail of three equal tokens repeats."""
    seen: list[list[int]] = []

    def check(token_ids: list[int], params: Any) -> bool:
        seen.append(list(token_ids))
        return len(token_ids) >= params.min_count and len(set(token_ids[-params.min_count:])) == 1

    utils = types.ModuleType("vllm.v1.core.sched.utils")
    utils.check_sequence_repetition = check  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.utils", utils)

    def state(min_tokens: int) -> Any:
        st = _state(10, [1, 4, 4, 4, 4, 9])
        st.sampling_params.repetition_detection = types.SimpleNamespace(min_count=3)
        st.sampling_params.min_tokens = min_tokens
        return st

    # Sampled 4, 4, 4, 9 after [1, 4]: the tail repeats once the second 4 is appended.
    assert vl_inst.kept_tokens([4, 4, 4, 9], state(0), 512) == 2
    assert seen == [[1, 4, 4], [1, 4, 4, 4]]
    seen.clear()
    # Not before min_tokens (5): the repeat is tested from the fifth output token on.
    assert vl_inst.kept_tokens([4, 4, 4, 9], state(5), 512) == 3
    assert seen == [[1, 4, 4, 4, 4]]
    # No repetition_detection on the request: vLLM's check is not even looked up.
    seen.clear()
    assert vl_inst.kept_tokens([4, 4, 4, 9], _state(10, [1, 4, 4, 4, 4, 9]), 512) == 4
    assert seen == []


def test_host_counts_leave_out_rows_in_chunked_prefill_and_cut_tokens() -> None:
    requests = {
        "a": _state(10, [1, 5, 6, 7]),  # decoded: 2 of 3 drafts accepted, plus the bonus
        "b": _state(200, []),  # still in chunked prefill: its sampled token was discarded
        "c": _state(10, [1, 2, 3, 9, 9, 9, 9], max_tokens=5),  # 4 sampled, cut after 2
        "d": _state(30, [4]),  # its prefill finished this step: its first token, no drafts
    }
    runner = types.SimpleNamespace(
        input_batch=types.SimpleNamespace(req_ids=["a", "b", "c", "d"]), requests=requests,
        max_model_len=512)
    valid = [[5, 6, 7], [], [9, 9, 9, 9], [4]]
    assert vl_inst.host_counts(runner, valid, [3, 0, 3, 0]) == ([2, 3, 0], [3, 3, 0], 3 + 2 + 1)
    assert vl_inst.host_counts(runner, [], [3, 0, 3, 0]) is None  # async scheduling
    assert vl_inst.host_counts(runner, valid, [3, 0]) is None  # not this batch


# -- async scheduling with structured outputs: drafts a grammar rejected ---------------------------


def _real_code(path: str, nodes: list[ast.stmt], namespace: dict[str, Any]) -> dict[str, Any]:
    """Classes and functions of vLLM's pinned wheel, compiled (not copied) against
    ``namespace``; annotations stay unevaluated."""
    future = ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0)
    module = ast.Module(body=[future, *nodes], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), f"<vllm {VERSION} {path}>", "exec"), namespace)
    return namespace


def _wheel_scheduler() -> dict[str, Any]:
    """0.33.0's own ``GrammarOutput``, ``DraftTokenIds``, ``SpecDecodingStats``,
    ``strip_speculative_padding`` and the three ``Scheduler`` methods that pad, mask and count
    the drafts of a step whose structured-output requests were validated after its launch."""
    import dataclasses

    namespace: dict[str, Any] = {"dataclass": dataclasses.dataclass, "field": dataclasses.field}
    for path, names in (
        ("vllm/v1/core/sched/output.py", ("GrammarOutput",)),
        ("vllm/v1/outputs.py", ("DraftTokenIds",)),
        ("vllm/v1/spec_decode/metrics.py", ("SpecDecodingStats",)),
    ):
        tree = _tree("vllm", VERSION, path)
        assert tree is not None, path
        _real_code(path, [_class(tree, n) for n in names], namespace)
    utils = _tree("vllm", VERSION, "vllm/v1/structured_output/utils.py")
    assert utils is not None
    strip = [
        n for n in utils.body
        if isinstance(n, ast.FunctionDef) and n.name == "strip_speculative_padding"
    ]  # fmt: skip
    _real_code("vllm/v1/structured_output/utils.py", strip, namespace)
    scheduler = _tree("vllm", VERSION, "vllm/v1/core/sched/scheduler.py")
    assert scheduler is not None
    methods = ("update_draft_token_ids_in_output", "get_grammar_bitmask",
               "make_spec_decoding_stats")  # fmt: skip
    _real_code("vllm/v1/core/sched/scheduler.py",
               [_function(scheduler, "Scheduler", m) for m in methods], namespace)  # fmt: skip
    return namespace


class _Request:
    """What the scheduler's methods read of a request; ``grammar_prefix`` is how many leading
    drafts its grammar accepts (``None``: no structured output)."""

    def __init__(self, grammar_prefix: int | None) -> None:
        self.grammar_prefix = grammar_prefix
        self.use_structured_output = grammar_prefix is not None
        self.is_prefill_chunk = False

    def is_finished(self) -> bool:
        return False


class _StructuredOutputs:
    def validate_tokens(self, request: _Request, tokens: list[int]) -> list[int]:
        return tokens[: request.grammar_prefix]

    def grammar_bitmask(self, requests: Any, ids: list[str], spec_tokens: Any) -> Any:
        import numpy as np

        return np.zeros((len(ids), 4), dtype=np.int32)


@pytest.mark.parametrize("runner_module", [vl_inst.V1_MODULE, vl_inst.V2_MODULE])
@pytest.mark.parametrize("in_process", [True, False], ids=["engine-core-process", "own-process"])
def test_async_structured_outputs_drafted_is_what_vllms_scheduler_counts(
    vllm_tree: Any, runner_module: str, in_process: bool
) -> None:
    """Async scheduling with structured outputs: vLLM validates a step's drafts against the
    grammar after the step was launched, pads the rejected ones with -1 in its scheduler output
    and subtracts them from its counts. specobs counts what vLLM's scheduler counts, whether
    the worker shares the engine core's process (it then reads ``num_invalid_spec_tokens``
    from the same scheduler output) or runs in its own (a copy of the scheduler output from
    before the padding; ``GrammarOutput.num_acceptable_drafts`` says the same)."""
    import copy

    real = _wheel_scheduler()
    # a: the grammar accepts the first 2 of 3 drafts; b: no structured output; c: 1 of 3.
    requests = {"a": _Request(2), "b": _Request(None), "c": _Request(1)}
    scheduler = types.SimpleNamespace(
        requests=requests, structured_output_manager=_StructuredOutputs(), log_stats=True,
        num_spec_tokens=3,
    )  # fmt: skip
    for name in ("update_draft_token_ids_in_output", "get_grammar_bitmask",
                 "make_spec_decoding_stats"):  # fmt: skip
        setattr(scheduler, name, types.MethodType(real[name], scheduler))
    # The deferred step as the async scheduler launched it: placeholders for the drafts.
    scheduler_output = types.SimpleNamespace(
        scheduled_spec_decode_tokens={r: [-1, -1, -1] for r in requests},
        num_scheduled_tokens={r: 4 for r in requests}, num_invalid_spec_tokens=None,
        has_structured_output_requests=True, accepted=None,
    )  # fmt: skip
    _load_plugins()
    module = importlib.import_module(runner_module)
    runner = module.GPUModelRunner(_spec("ngram"))
    worker_view = scheduler_output if in_process else copy.deepcopy(scheduler_output)
    steps = 3
    for _ in range(steps):
        scheduler_output.scheduled_spec_decode_tokens = {r: [-1, -1, -1] for r in requests}
        scheduler_output.num_invalid_spec_tokens = None
        runner.execute_model(worker_view)
        # The engine core (step_with_batch_queue): the drafts arrive, are validated and padded,
        # then the grammar bitmask is built and the deferred sampling runs.
        drafts = real["DraftTokenIds"](list(requests), [[7, 8, 9] for _ in requests])
        scheduler.update_draft_token_ids_in_output(drafts, scheduler_output)
        grammar_output = scheduler.get_grammar_bitmask(scheduler_output)
        runner.sample_tokens(grammar_output)

    assert scheduler_output.scheduled_spec_decode_tokens == {
        "a": [7, 8, -1], "b": [7, 8, 9], "c": [7, -1, -1]}  # fmt: skip
    assert scheduler_output.num_invalid_spec_tokens == {"a": 1, "c": 2}
    assert grammar_output.structured_output_request_ids == ["a", "c"]
    assert grammar_output.num_acceptable_drafts == [2, 1]
    # vLLM's counts, as update_from_output makes them: every row drafted 3 tokens as scheduled,
    # accepted 2, 3 and 0 (the runners' stand-in acceptance, within each grammar's prefix).
    stats = None
    for _ in range(steps):
        for req_id, accepted in zip(requests, (2, 3, 0), strict=True):
            stats = scheduler.make_spec_decoding_stats(
                stats, num_draft_tokens=3, num_accepted_tokens=accepted,
                num_invalid_spec_tokens=scheduler_output.num_invalid_spec_tokens,
                request_id=req_id,
            )  # fmt: skip
    assert stats is not None
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (
        steps * 3, steps * (2 + 3 + 1), steps * (2 + 3 + 0))  # fmt: skip

    observer = vl_inst.VllmInstrumentor().current_observer
    assert observer is not None
    snap = _snapshot(observer)
    assert not any(snap.errors.values()), snap.errors
    assert snap.cycles_total == steps
    assert snap.draft_tokens_total == stats.num_draft_tokens
    assert snap.accepted_tokens_total == stats.num_accepted_tokens
    assert snap.accept_length.count == stats.num_drafts
    assert list(snap.accepted_by_position[:3]) == stats.num_accepted_tokens_per_pos
    assert list(snap.drafted_by_position[:3]) == stats.num_draft_tokens_per_pos


def test_valid_draft_lengths_without_structured_outputs_or_async_scheduling() -> None:
    """Nothing to subtract: drafts validated before they were scheduled (no -1 padding), or no
    request with a grammar; a batch the ids do not describe is left as it is."""
    lengths = [3, 3, 0]
    ids = ["a", "b", "c"]
    sync = types.SimpleNamespace(num_invalid_spec_tokens=None)
    grammar = types.SimpleNamespace(structured_output_request_ids=["a"], num_acceptable_drafts=[3])
    assert vl_inst.valid_draft_lengths(lengths, ids, sync, grammar) == lengths
    assert vl_inst.valid_draft_lengths(lengths, ids, sync, None) == lengths
    none_rejected = types.SimpleNamespace(num_invalid_spec_tokens={})
    assert vl_inst.valid_draft_lengths(lengths, ids, none_rejected, grammar) == lengths
    rejected = types.SimpleNamespace(num_invalid_spec_tokens={"b": 2})
    assert vl_inst.valid_draft_lengths(lengths, ids, rejected, None) == [3, 1, 0]
    assert vl_inst.valid_draft_lengths(lengths, ["a"], rejected, None) == lengths


# -- model runner V2: every name the hooks read, and why no V2 step runs on this machine ----------


def _self_stores(cls: ast.ClassDef) -> set[str]:
    return {
        n.attr for n in ast.walk(cls)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name) and n.value.id == "self"
    }  # fmt: skip


@pytest.mark.parametrize("version", V2_VERSIONS)
def test_v2_every_name_the_hooks_read_is_in_the_pinned_release(version: str) -> None:
    """Beyond the seams' signatures: each attribute, field and argument position the V2 hooks
    (and the worker check) read, in 0.33.0's and 0.34.0's source. A V2 step never ran under
    specobs (see the next test), so these and the stand-ins are what stands for it."""
    tree = _tree("vllm", version, V2_FILE)
    assert tree is not None
    runner = _class(tree, vl_inst.RUNNER_CLASS)
    # _start / topology: the runner's configs and stage; the phase order is fixed for V2.
    assert {"speculative_config", "parallel_config", "is_last_pp_rank", "speculator"} <= (
        _self_stores(runner)
    )
    # execute_model(self, scheduler_output, ..., dummy_run=...): args[1] and kwargs["dummy_run"].
    execute = _method(runner, "execute_model")
    assert _params(execute)[1] == "scheduler_output"
    assert "dummy_run" in [a.arg for a in execute.args.args + execute.args.kwonlyargs]
    # sample_tokens(self, grammar_output) calls sample() with the grammar output third, which
    # around_sample_v2 reads as args[3]; input_batch is args[2].
    calls = [
        ast.unparse(n) for n in ast.walk(_method(runner, "sample_tokens"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.sample"
    ]  # fmt: skip
    assert calls == ["self.sample(hidden_states, input_batch, grammar_output)"]
    batch = _tree("vllm", version, "vllm/v1/worker/gpu/input_batch.py")
    assert batch is not None
    assert {"req_ids", "num_draft_tokens_per_req"} <= _fields(_class(batch, "InputBatch"))
    output = _tree("vllm", version, "vllm/v1/core/sched/output.py")
    assert output is not None
    assert {"scheduled_spec_decode_tokens", "num_scheduled_tokens", "num_invalid_spec_tokens"} <= (
        _fields(_class(output, "SchedulerOutput"))
    )
    grammar = _fields(_class(output, "GrammarOutput"))
    assert "structured_output_request_ids" in grammar
    if version < "0.34":
        # The V2 sampler honours num_acceptable_drafts (drafts past it are never accepted), so
        # accepted <= the drafts counted as valid.
        assert "num_acceptable_drafts" in grammar
        assert "grammar_output.num_acceptable_drafts" in ast.unparse(_method(runner, "sample"))
    else:
        # Gone in 0.34 (the grammar bitmask rejects the drafts): valid_draft_lengths reads it
        # with getattr and falls back to the lengths as scheduled; the engine core's own count
        # (num_invalid_spec_tokens) is what settles every counted step.
        assert "num_acceptable_drafts" not in grammar
    config = _tree("vllm", version, "vllm/config/speculative.py")
    assert config is not None
    assert "num_speculative_tokens" in _fields(_class(config, "SpeculativeConfig"))
    worker = _tree("vllm", version, "vllm/v1/worker/gpu_worker.py")
    assert worker is not None
    # _check_runner: the worker's runner, and a config (the worker's, else the runner's).
    assert "model_runner" in _fields(_class(worker, vl_inst.WORKER_CLASS))
    assert "vllm_config" in _self_stores(runner)


def test_why_no_v2_step_runs_on_a_cpu_machine() -> None:
    """docs/integrations.md says why the suite cannot run a real V2 step: V2 needs Triton, and
    vLLM's CPU build counts Triton only with a ``cpu`` backend, which the ``triton`` wheel
    does not ship (and no ``triton-cpu`` distribution is published). vLLM then builds V1, and
    forcing V2 stops the engine at config validation."""
    importing = _source("vllm", VERSION, "vllm/triton_utils/importing.py")
    assert importing is not None
    assert 'if vllm_version_matches_substr("cpu"):' in importing
    assert 'if "cpu" in backends:' in importing
    assert "Triton is installed, but doesn't include CPU backend. " in importing
    tree = _tree("vllm", VERSION, "vllm/config/vllm.py")
    assert tree is not None
    config = _class(tree, "VllmConfig")
    assert "if not HAS_TRITON and (not current_platform.is_unspecified()):" in ast.unparse(
        _method(config, "use_v2_model_runner")
    )
    # VLLM_USE_V2_MODEL_RUNNER=1 without Triton: the worker refuses to start (0.32.0 refused
    # earlier, in VllmConfig._validate_v2_model_runner, with the same message).
    worker = _tree("vllm", VERSION, "vllm/v1/worker/gpu_worker.py")
    assert worker is not None
    init = ast.unparse(_method(_class(worker, vl_inst.WORKER_CLASS), "__init__"))
    assert "if self.use_v2_model_runner and (not HAS_TRITON):" in init
    assert "raise ValueError('Model Runner V2 requires Triton.')" in init
    # Every V2 kernel is Triton; the CPU platform replaces only V1's Triton kernels.
    with zipfile.ZipFile(_wheel("vllm", VERSION)) as wheel:
        v2 = [n for n in wheel.namelist()
              if n.startswith("vllm/v1/worker/gpu/") and n.endswith(".py")]  # fmt: skip
        kernels = sum(wheel.read(n).decode().count("@triton.jit") for n in v2)
    assert kernels > 50, kernels
    assert _use_v2("ngram", env=None, has_triton=False) is False


# -- async scheduling / pipeline parallelism: requests that end while their step is in flight -----


def test_requests_aborted_in_flight_are_skipped_where_vllm_processes_the_output() -> None:
    """The facts behind docs/integrations.md's note on requests aborted while their step was in
    flight (0.33.0): the engine core applies the aborts queued during the step and only then
    processes that step's output, whose loop skips a request no longer there or finished before
    it counts anything -- in the engine core, after the worker's cycle ended. A worker of its
    own learns which rows were counted only from the engine core (the next scheduler output
    lists every finished request alike), which is why the counts travel to it
    (:func:`test_the_counts_of_a_step_reach_a_worker_of_its_own_on_the_next_scheduler_output`)."""
    core = _tree("vllm", VERSION, "vllm/v1/engine/core.py")
    assert core is not None
    queued = ast.unparse(_method(_class(core, "EngineCore"), "step_with_batch_queue"))
    aborts = queued.index("self._process_aborts_queue()")
    assert aborts < queued.index("self.scheduler.update_from_output(scheduler_output, model_")
    assert queued.index("model_output = future.result()") < aborts
    scheduler = _tree("vllm", VERSION, "vllm/v1/core/sched/scheduler.py")
    assert scheduler is not None
    update = ast.unparse(_method(_class(scheduler, "Scheduler"), "update_from_output"))
    skip = update.index("if request is None or request.is_finished():")
    assert skip < update.index("spec_decoding_stats = self.make_spec_decoding_stats(")
    assert update.index("continue", skip) < update.index("self.make_spec_decoding_stats(")
    stale = update.index("if output_is_stale and request.drop_stale_output:")
    assert stale < update.index("self.make_spec_decoding_stats(")
    assert update.index("if failed_kv_load_req_ids and req_id in failed_kv_load_req_ids:") < skip


@pytest.mark.parametrize("version", V2_VERSIONS)
def test_the_counts_of_a_step_reach_a_worker_of_its_own_on_the_next_scheduler_output(
    version: str,
) -> None:
    """What the worker-process path rests on (0.33.0; docs/integrations.md): vLLM counts each
    row of a speculative step by calling ``make_spec_decoding_stats`` with keywords specobs
    reads (grammar-rejected drafts subtracted inside it, a row without drafts not observed);
    ``SchedulerOutput`` is a plain dataclass (no slots), so the engine core can tag it, and
    ``MultiprocExecutor`` pickles it whole to the workers; every step the engine core schedules
    reaches the worker's runner (``Worker.execute_model`` calls it for an empty step too); and
    the engine core schedules once more after a request finished (``finished_req_ids`` keeps
    ``has_requests`` true until a schedule hands them on), so the counts of the last step
    before the engine goes idle have a scheduler output to ride on."""
    scheduler = _tree("vllm", version, "vllm/v1/core/sched/scheduler.py")
    assert scheduler is not None
    cls = _class(scheduler, "Scheduler")
    stats = _method(cls, "make_spec_decoding_stats")
    assert _params(stats) == ["self", "spec_decoding_stats", "num_draft_tokens",
                              "num_accepted_tokens", "num_invalid_spec_tokens", "request_id"]
    body = ast.unparse(stats)
    assert "if not self.log_stats or not num_draft_tokens:" in body
    assert "num_draft_tokens -= num_invalid_spec_tokens.get(request_id, 0)" in body
    calls = [c for c in ast.walk(_method(cls, "update_from_output"))
             if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
             and c.func.attr == "make_spec_decoding_stats"]  # fmt: skip
    assert len(calls) == 1
    assert [k.arg for k in calls[0].keywords] == ["num_draft_tokens", "num_accepted_tokens",
                                                  "num_invalid_spec_tokens", "request_id"]
    assert "self.finished_req_ids.add(request_id)" in ast.unparse(_method(cls, "_free_request"))
    assert "if self.finished_req_ids:" in ast.unparse(_method(cls, "has_finished_requests"))
    assert "finished_req_ids=self.finished_req_ids" in ast.unparse(_method(cls, "schedule"))
    interface = _tree("vllm", version, "vllm/v1/core/sched/interface.py")
    assert interface is not None
    has = ast.unparse(_method(_class(interface, "SchedulerInterface"), "has_requests"))
    assert "self.has_unfinished_requests() or self.has_finished_requests()" in has
    has = ast.unparse(_method(cls, "has_requests"))
    assert "self.has_unfinished_requests()" in has and "self.has_finished_requests()" in has

    output = _tree("vllm", version, "vllm/v1/core/sched/output.py")
    assert output is not None
    dataclass = _class(output, "SchedulerOutput")
    assert [ast.unparse(d) for d in dataclass.decorator_list] == ["dataclass"]
    assert {"finished_req_ids", "num_scheduled_tokens",
            "scheduled_spec_decode_tokens"} <= _fields(dataclass)  # fmt: skip

    multiproc = _tree("vllm", version, "vllm/v1/executor/multiproc_executor.py")
    assert multiproc is not None
    executor = _class(multiproc, "MultiprocExecutor")
    assert "args=(scheduler_output,)" in ast.unparse(_method(executor, "execute_model"))
    rpc = ast.unparse(_method(executor, "collective_rpc"))
    assert "self.rpc_broadcast_mq.enqueue((send_method, args, kwargs, output_rank))" in rpc
    shm = _tree("vllm", version, "vllm/distributed/device_communicators/shm_broadcast.py")
    assert shm is not None
    enqueue = ast.unparse(_method(_class(shm, "MessageQueue"), "enqueue"))
    assert "pickler.dump(obj)" in enqueue and "pickle.Pickler(" in enqueue

    worker = _tree("vllm", version, "vllm/v1/worker/gpu_worker.py")
    assert worker is not None
    execute = _method(_class(worker, "Worker"), "execute_model")
    runs = [n for n in execute.body
            if "self.model_runner.execute_model(" in ast.unparse(n)]  # fmt: skip
    assert runs and isinstance(runs[0], ast.With), "the runner runs for every step"

    core = _tree("vllm", version, "vllm/v1/engine/core.py")
    assert core is not None
    step = ast.unparse(_method(_class(core, "EngineCore"), "step"))
    assert step.index("if not self.scheduler.has_requests():") < step.index(
        "self.model_executor.execute_model(scheduler_output, non_block=True)")
