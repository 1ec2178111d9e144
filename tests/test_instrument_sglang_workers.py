"""SGLang 0.5.23's DFLASH, UNO and DSPARK workers: their seams, phases and exact counts.

1. AST contracts against the pinned 0.5.23 wheel (fetched by tests/test_instrument_contracts.py's
   cache): every class, method, parameter and field the hooks read exists with the signature they
   read, and each decode step calls the seams in the order the phase order assumes.
2. Behaviour: stand-ins mirroring those signatures and each step's call order, driven through
   ``SGLangInstrumentor``; each stand-in records the phase specobs is in when it runs a piece of
   work, so the tests see that the draft is timed as draft, the verify as verify and the commit
   as bookkeeping. Counts are read back per cycle from an in-memory observer, directly and
   through 0.5.23's own ``SchedulerBatchResultProcessor`` compiled from the wheel.
"""

from __future__ import annotations

import ast
import enum
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from specobs.instrument import sglang as sg_inst
from tests.test_instrument_contracts import (
    _Batch,
    _class,
    _fields,
    _method,
    _package,
    _params,
    _snapshot,
    _tree,
)
from tests.test_instrument_sglang import (
    LATEST,
    _class_in,
    _host_only,
    _instrument,
    _instrumented_observer,
    _memory_observer,
    _module_path,
    _returned_classes,
    _speculative_package,
)
from tests.test_instrument_sglang import fresh_instrumentors as fresh_instrumentors
from tests.test_instrument_sglang_overlap import (
    _BatchResult,
    _processor_class,
    _req_class,
    _ScheduleBatch,
)

SG = "sglang/srt/speculative/"
NEW = {
    "DFlashWorkerV2": sg_inst.DFLASH_MODULE,
    "UnoWorkerV2": sg_inst.UNO_MODULE,
    "DSparkWorkerV2": sg_inst.DSPARK_MODULE,
}


# -- AST: the seams in the 0.5.23 wheel ------------------------------------------------------------


def _calls(fn: ast.AST) -> list[tuple[int, str]]:
    """Every call in ``fn`` as ``(line, callee source)``, in source order."""
    return sorted((n.lineno, ast.unparse(n.func)) for n in ast.walk(fn) if isinstance(n, ast.Call))


def _line(fn: ast.AST, callee: str, after: int = 0) -> int:
    """The line of the first call of ``callee`` after line ``after``."""
    for line, name in _calls(fn):
        if name == callee and line > after:
            return line
    raise AssertionError(f"{callee}() is not called after line {after}")


def _in_order(fn: ast.AST, *callees: str) -> list[int]:
    """The lines of ``callees``' calls, each the first after the previous one (else fails)."""
    lines, after = [], 0
    for callee in callees:
        after = _line(fn, callee, after)
        lines.append(after)
    return lines


def _keywords(fn: ast.AST, callee: str) -> list[dict[str, str]]:
    """The keyword arguments (as source) of every call of ``callee`` in ``fn``."""
    calls = sorted(
        (n.lineno, {k.arg: ast.unparse(k.value) for k in n.keywords if k.arg})
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == callee
    )
    return [keywords for _, keywords in calls]


def _top_level_calls(fn: ast.FunctionDef) -> set[str]:
    """Callees called by a statement of ``fn``'s own body (not under an ``if``)."""
    out = set()
    for stmt in fn.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            out.add(ast.unparse(stmt.value.func))
    return out


def _imports(tree: ast.Module) -> dict[str, str]:
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def _kwonly(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.kwonlyargs]


def test_the_three_workers_are_hooked_and_none_reported_unsupported() -> None:
    spec_info = _tree("sglang", LATEST, SG + "spec_info.py")
    assert spec_info is not None
    returned = _returned_classes(spec_info)
    for name, module in NEW.items():
        assert returned[name] == module, (name, returned.get(name))
        assert name in sg_inst.HOOKED_WORKERS
        assert name not in sg_inst.UNSUPPORTED_WORKERS
        steps = [t for t in sg_inst.HOOK_TARGETS if (t.module, t.owner, t.method) == (
            module, name, "forward_batch_generation")]  # fmt: skip
        assert len(steps) == 1 and sg_inst._is_cycle(steps[0].hook), name
    # The table other code reads at run time stays a dict.
    assert isinstance(sg_inst.UNSUPPORTED_WORKERS, dict)
    assert set(returned) <= set(sg_inst.HOOKED_WORKERS)


def test_every_new_hook_target_exists_with_the_parameters_its_hook_reads() -> None:
    modules = {*NEW.values(), sg_inst.DFLASH_INFO_MODULE, sg_inst.DSPARK_DRAFT_MODULE}
    targets = [t for t in sg_inst.HOOK_TARGETS if t.module in modules]
    assert len(targets) == 11, [t.dotted for t in targets]
    for target in targets:
        tree = _tree("sglang", LATEST, _module_path(target.module))
        assert tree is not None, target.dotted
        if not target.owner:
            # A function of another module, bound in this one by ``from ... import``: the name
            # this module's code looks up when it calls it.
            source = _imports(tree)[target.method]
            other = _tree("sglang", LATEST, _module_path(source))
            assert other is not None
            fn = next(n for n in other.body
                      if isinstance(n, ast.FunctionDef) and n.name == target.method)  # fmt: skip
            assert _params(fn)[0] == "batch", target.dotted
            continue
        fn = _method(_class(tree, target.owner), target.method)
        assert _params(fn)[0] == "self", target.dotted
        if target.method == "forward_batch_generation":
            assert _params(fn)[1] == "batch"
            assert ast.unparse(fn.args.args[1].annotation or ast.Constant("")) == "ScheduleBatch"
        if target.method == "_forward_dp_spec_prefill_coordination":
            assert _params(fn)[:2] == ["self", "batch"]
        if target.method == "_make_forward_batch":
            assert "spec_input_type" in _kwonly(fn)  # the hook reads it by keyword
    # The drafted count reads these worker fields (set in __init__).
    assert "block_size" in _fields(_class_in(LATEST, sg_inst.DFLASH_MODULE, "DFlashWorkerV2"))
    uno = _fields(_class_in(LATEST, sg_inst.UNO_MODULE, "UnoWorkerV2"))
    assert {"tree_mode", "forward_width", "verify_width"} <= uno
    dspark = _fields(_class_in(LATEST, sg_inst.DSPARK_MODULE, "DSparkWorkerV2"))
    assert "verify_num_draft_tokens" in dspark
    # The result fields the counts read, and how the processing derives the accepted drafts.
    utils = _tree("sglang", LATEST, "sglang/srt/managers/utils.py")
    assert utils is not None
    result = _class(utils, "GenerationBatchResult")
    assert {"accept_lens", "cap_lens", "num_non_draft_tokens_per_req",
            "num_correct_drafts_per_req_cpu"} <= _fields(result)  # fmt: skip
    default = next(n for n in result.body if isinstance(n, ast.AnnAssign)
                   and ast.unparse(n.target) == "num_non_draft_tokens_per_req")  # fmt: skip
    assert ast.unparse(default) == "num_non_draft_tokens_per_req: int = 1"
    resolve = ast.unparse(_method(_class_in(
        LATEST, sg_inst.RESULT_PROCESSOR_MODULE, "SchedulerBatchResultProcessor"),
        "_resolve_spec_v2_tokens"))  # fmt: skip
    assert "num_non_draft = result.num_non_draft_tokens_per_req" in resolve
    assert "[length - num_non_draft for length in accept_lens]" in resolve
    assert "cap_lens = result.cap_lens.tolist() if result.cap_lens is not None else None" in (
        resolve
    )
    assert "req.spec_num_cap_tokens += cap_lens[i]" in resolve
    copy = ast.unparse(_method(result, "copy_to_cpu"))
    assert "self.cap_lens = _async_d2h(self.cap_lens)" in copy  # on the host when settled


def test_dflash_step_drafts_then_verifies_then_commits() -> None:
    tree = _tree("sglang", LATEST, SG + "dflash_worker_v2.py")
    assert tree is not None
    assert _imports(tree)["DFlashVerifyInput"] == sg_inst.DFLASH_INFO_MODULE
    worker = _class(tree, "DFlashWorkerV2")
    step = _method(worker, "forward_batch_generation")
    assert "if batch.forward_mode.is_extend() or batch.is_extend_in_batch:" in ast.unparse(step)
    draft, verify, target, accept, mamba, commit = _in_order(
        step,
        "self.draft_model_runner.forward",  # the block's one draft forward
        "verify_input.prepare_for_verify",  # verify starts: the hook on DFlashVerifyInput
        "self.target_worker.forward_batch_generation",
        "self._accept_block",
        "self._update_target_mamba_state_after_verify",  # hybrid targets only
        "self._append_target_hidden_to_draft_kv_by_loc",  # every decode step
    )
    assert _line(step, "DFlashVerifyInput", draft) < verify
    # The draft's sampling finishes before verify starts (every branch of it).
    for sampler in ("self._greedy_sample_from_vocab_parallel_head",
                    "self._propose_selector_block", "domino_greedy_rollout"):  # fmt: skip
        assert draft < _line(step, sampler) < verify
    (result,) = [k for k in _keywords(step, "GenerationBatchResult") if "logits_output" in k
                 and k["logits_output"] == "logits_output"]  # fmt: skip
    assert result["accept_lens"] == "commit_lens"
    assert result["speculative_num_draft_tokens"] == "int(self.block_size)"
    assert "num_non_draft_tokens_per_req" not in result and "cap_lens" not in result
    accept_fn = next(n for n in tree.body
                     if isinstance(n, ast.FunctionDef) and n.name == "_commit_accept")  # fmt: skip
    assert "return (out_tokens, accept_len.to(torch.int32) + 1)" in ast.unparse(accept_fn)
    info = _class_in(LATEST, sg_inst.DFLASH_INFO_MODULE, "DFlashVerifyInput")
    assert _params(_method(info, "prepare_for_verify"))[:3] == ["self", "batch", "target_worker"]
    for private in ("_append_target_hidden_to_draft_kv_by_loc",
                    "_update_target_mamba_state_after_verify"):  # fmt: skip
        assert _params(_method(worker, private)) == ["self"]  # keyword-only: nothing read
    # No adaptive tiers for DFLASH: its block size is fixed at start-up.
    assert ast.unparse(_method(worker, "__init__")).count("self.block_size =") == 2
    del mamba, commit, target, accept


def test_uno_step_drafts_then_verifies_linear_and_tree() -> None:
    tree = _tree("sglang", LATEST, SG + "uno_worker_v2.py")
    assert tree is not None
    assert _imports(tree)["run_eagle_verify"] == "sglang.srt.speculative.eagle_worker_common"
    worker = _class(tree, "UnoWorkerV2")
    step = ast.unparse(_method(worker, "forward_batch_generation"))
    assert "if batch.forward_mode == ForwardMode.DECODE:" in step
    assert "return self._forward_decode(batch, on_publish)" in step
    linear = _method(worker, "_forward_decode")
    assert ast.unparse(linear.body[0]).startswith(
        "if self.tree_mode:\n    return self._forward_decode_tree(batch, on_publish)"
    )
    kinds = [k["spec_input_type"] for k in _keywords(linear, "self._make_forward_batch")]
    assert kinds == ["SpecInputType.UNO_DRAFT", "SpecInputType.UNO_VERIFY"]
    draft, sample, verify, target, accept = _in_order(
        linear,
        "self._run_draft_block",
        "sample_uno_candidates",  # sampled proposals: still the draft
        "self._make_forward_batch",  # the UNO_VERIFY pass: verify starts (the hook)
        "self._run_target_block",
        "self._accept_and_pack",
    )
    assert _line(linear, "self._make_forward_batch") < draft  # the UNO_DRAFT pass comes first
    # The draft block is itself a target forward with the LoRA drafter: _run_target_block is
    # called inside it, so that method is not where verify starts.
    assert "self._run_target_block" in {c for _, c in _calls(_method(worker, "_run_draft_block"))}
    tree_step = _method(worker, "_forward_decode_tree")
    _in_order(tree_step, "self._run_draft_block", "build_uno_tree_proposal",
              "build_eagle_verify_input", "run_eagle_verify", "pack_uno_tree_result")  # fmt: skip
    assert not [k for k in _keywords(tree_step, "self._make_forward_batch")
                if k["spec_input_type"] == "SpecInputType.UNO_VERIFY"]  # fmt: skip
    for fn in (linear, tree_step):
        (result,) = _keywords(fn, "GenerationBatchResult")
        assert result["num_non_draft_tokens_per_req"] == "2"
        assert result["speculative_num_draft_tokens"] == "self.forward_width"
    # Linear: accepted proposals + the clean root + the correction; tree: EAGLE's + the root.
    assert "accept_lens = accepted_specs + 2" in ast.unparse(_method(worker, "_accept_and_pack"))
    uno_utils = _tree("sglang", LATEST, SG + "uno_utils.py")
    assert uno_utils is not None
    pack = ast.unparse(next(
        n for n in uno_utils.body
        if isinstance(n, ast.FunctionDef) and n.name == "pack_uno_tree_result"
    ))  # fmt: skip
    assert "accept_lens=eagle_accept_lens + 1" in pack
    init = ast.unparse(_method(worker, "__init__"))
    assert "self.num_speculative_proposals = self.forward_width - 1" in init
    assert "self.verify_width = int(get_spec().speculative_num_draft_tokens)" in init
    del sample, verify, target, accept


def test_dspark_step_drafts_plans_verifies_then_commits() -> None:
    tree = _tree("sglang", LATEST, SG + "dspark_components/dspark_worker_v2.py")
    assert tree is not None
    assert _imports(tree)["DraftBlockProposer"] == sg_inst.DSPARK_DRAFT_MODULE
    worker = _class(tree, "DSparkWorkerV2")
    assert "self._proposer = DraftBlockProposer(" in ast.unparse(_method(worker, "__init__"))
    step = _method(worker, "forward_batch_generation")
    assert _kwonly(step) == ["pp_proxy_tensors"]
    src = ast.unparse(step)
    assert "if batch.forward_mode.is_extend() or batch.is_extend_in_batch:" in src
    assert "self._forward_dp_spec_prefill_coordination(batch, plan, on_publish" in src
    assert "return self._forward_decode(batch, on_publish, grammar_barrier)" in src
    coordinated = ast.unparse(_method(worker, "_forward_dp_spec_prefill_coordination"))
    assert "if not batch.forward_mode.is_extend():" in coordinated  # a decode rank: its step
    assert "return self._forward_decode(batch, on_publish, grammar_barrier, coordination_plan=" in (
        coordinated
    )
    decode = _method(worker, "_forward_decode")
    propose, _, layout, verify, accept, commit, hidden = _in_order(
        decode,
        "self._proposer.propose",  # the draft ends where it returns (the hook)
        "self._verify_planner.resolve_verify_token_budget",
        "self._verify_planner.schedule_layout",  # the ragged verify's per-request windows
        "self._verify_executor.run_non_compact",
        "self._verify_executor.accept_and_finalize",
        "self._commit_target_mamba_states_after_verify",  # bookkeeping starts (the hook)
        "self._verify_executor.commit_hidden",
    )
    assert propose < _line(decode, "self._verify_executor.run_compact") < accept
    # Called by the step's own body in every decode step (it returns early when not hybrid).
    assert "self._commit_target_mamba_states_after_verify" in _top_level_calls(decode)
    (result,) = [k for k in _keywords(decode, "GenerationBatchResult") if "cap_lens" in k]
    assert result["accept_lens"] == "accept.commit_lens"
    caps = "layout.verify_lens.to(torch.int32) if layout is not None else None"
    assert result["cap_lens"] == caps  # each row's admitted window, anchor included
    assert "num_non_draft_tokens_per_req" not in result
    draft = _class_in(LATEST, sg_inst.DSPARK_DRAFT_MODULE, "DraftBlockProposer")
    assert "batch" in _kwonly(_method(draft, "propose"))
    # A ragged row's window counts the anchor; the full window is gamma drafts + the anchor.
    ragged = ast.unparse(_class_in(LATEST, "sglang.srt.speculative.ragged_verify",
                                   "RaggedVerifyLayout"))  # fmt: skip
    assert "every request must verify the anchor (verify_len >= 1)" in ragged
    config = _tree("sglang", LATEST, SG + "dspark_components/dspark_config.py")
    assert config is not None
    assert "verify_num_draft_tokens=gamma + 1" in ast.unparse(config)
    del layout, verify, commit, hidden


def test_adaptive_steps_never_reach_the_three_workers() -> None:
    """SGLang's adaptive tiers (which may set steps to 0) run for EAGLE/EAGLE3 only: the three
    workers' widths are fixed per server; their zero-draft cycles are UNO with width 1 and
    DSPARK rows whose window is the anchor alone."""
    adaptive = _tree("sglang", LATEST, SG + "adaptive_spec_params.py")
    assert adaptive is not None
    reason = ast.unparse(next(n for n in adaptive.body if isinstance(n, ast.FunctionDef)
                              and n.name == "adaptive_unsupported_reason"))  # fmt: skip
    assert "if cfg.speculative_algorithm not in ('EAGLE', 'EAGLE3'):" in reason
    hook = ast.unparse(_tree("sglang", LATEST, "sglang/srt/arg_groups/speculative_hook.py")
                       or ast.Module(body=[], type_ignores=[]))  # fmt: skip
    assert "if verify_width is None or int(verify_width) < 1:" in hook  # UNO: width 1 allowed


# -- behaviour: stand-ins mirroring 0.5.23's call order --------------------------------------------


def _phase() -> str | None:
    """The phase specobs is in on this thread (``None`` outside a cycle)."""
    tracker = sg_inst._local.__dict__.get("tracker")
    return None if tracker is None else tracker.phase


def _torch() -> Any:
    return pytest.importorskip("torch")


class _OnDevice:
    """A CUDA tensor as the hooks see it: reading its values would synchronize."""

    is_cuda = True

    def __sub__(self, other: int) -> _OnDevice:
        return self

    def tolist(self) -> list[int]:
        raise AssertionError("read a device tensor on the worker's thread")


def _dflash(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, str | None]]) -> Any:
    _speculative_package(monkeypatch)
    info = _package(monkeypatch, sg_inst.DFLASH_INFO_MODULE, path=False)
    module = _package(monkeypatch, sg_inst.DFLASH_MODULE, path=False)

    class DFlashVerifyInput:
        def __init__(self, draft_token: Any, draft_token_num: int) -> None:
            self.draft_token, self.draft_token_num = draft_token, draft_token_num

        def prepare_for_verify(
            self, batch: Any, target_worker: Any, *, defer_metadata_init: bool = False
        ) -> Any:
            calls.append(("prepare_for_verify", _phase()))
            return "verify-batch", False

    class DFlashWorkerV2:
        def __init__(self, accept: list[int], block_size: int = 8, mamba: bool = False) -> None:
            self.block_size = block_size
            self.speculative_num_draft_tokens = block_size
            self._need_mamba_verify_commit = mamba
            self._accept = accept

        def _update_target_mamba_state_after_verify(self, **kwargs: Any) -> None:
            calls.append(("mamba", _phase()))

        def _append_target_hidden_to_draft_kv_by_loc(self, **kwargs: Any) -> None:
            calls.append(("draft-kv", _phase()))

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
            pp_proxy_tensors: Any = None,
        ) -> Any:  # fmt: skip
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                self._append_target_hidden_to_draft_kv_by_loc(target_hidden=None)  # prompt KV
                return _BatchResult()
            calls.append(("draft-forward", _phase()))
            calls.append(("draft-sample", _phase()))
            verify_input = DFlashVerifyInput("tokens", self.block_size)
            verify_input.prepare_for_verify(batch, None, defer_metadata_init=False)
            calls.append(("target-verify", _phase()))
            calls.append(("accept", _phase()))
            commit_lens = _torch().tensor([a + 1 for a in self._accept], dtype=torch_int32())
            if self._need_mamba_verify_commit:
                self._update_target_mamba_state_after_verify(commit_lens=commit_lens)
            self._append_target_hidden_to_draft_kv_by_loc(target_hidden=None, cache_loc=None)
            return _BatchResult(accept_lens=commit_lens,
                                speculative_num_draft_tokens=self.block_size)  # fmt: skip

    info.DFlashVerifyInput = DFlashVerifyInput
    module.DFlashVerifyInput = DFlashVerifyInput
    module.DFlashWorkerV2 = DFlashWorkerV2
    return module


def torch_int32() -> Any:
    return _torch().int32


class _SpecInputType(enum.IntEnum):
    UNO_DRAFT = enum.auto()
    UNO_VERIFY = enum.auto()


def _uno(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, str | None]]) -> Any:
    _speculative_package(monkeypatch)
    module = _package(monkeypatch, sg_inst.UNO_MODULE, path=False)

    def run_eagle_verify(batch: Any, *, target_worker: Any, **kwargs: Any) -> Any:
        calls.append(("eagle-verify", _phase()))
        return None

    class UnoWorkerV2:
        """accept: proposals accepted per row; script: the tokens each row emits per step."""

        def __init__(self, accept: list[int], width: int = 4, topk: int = 1, q: int = 4) -> None:
            self.tree_mode = topk > 1
            self.forward_width = width
            self.verify_width = q
            self.num_speculative_proposals = width - 1
            self.speculative_num_draft_tokens = q
            self.speculative_num_steps = width - 1 if self.tree_mode else 1
            self.topk = topk
            self._accept = accept
            self.script: list[list[int]] | None = None

        def _make_forward_batch(
            self, *, spec_input_type: Any, input_ids: Any, **kwargs: Any
        ) -> Any:
            calls.append((spec_input_type.name, _phase()))
            return spec_input_type

        def _run_target_block(self, forward_batch: Any, *, need_top1: bool = True) -> Any:
            calls.append(("target-forward", _phase()))
            return None, None

        def _run_draft_block(self, forward_batch: Any, *, need_top1: bool = True) -> Any:
            return self._run_target_block(forward_batch, need_top1=need_top1)  # LoRA drafter

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None
        ) -> Any:
            if batch.forward_mode.is_extend():
                return _BatchResult()
            return self._forward_decode(batch, on_publish)

        def _forward_decode(self, batch: Any, on_publish: Any) -> Any:
            if self.tree_mode:
                return self._forward_decode_tree(batch, on_publish)
            draft = self._make_forward_batch(spec_input_type=_SpecInputType.UNO_DRAFT,
                                             input_ids=None)  # fmt: skip
            self._run_draft_block(draft, need_top1=False)
            calls.append(("sample-candidates", _phase()))
            verify = self._make_forward_batch(spec_input_type=_SpecInputType.UNO_VERIFY,
                                              input_ids=None)  # fmt: skip
            self._run_target_block(verify)
            calls.append(("accept", _phase()))
            return self._result()

        def _forward_decode_tree(self, batch: Any, on_publish: Any) -> Any:
            draft = self._make_forward_batch(spec_input_type=_SpecInputType.UNO_DRAFT,
                                             input_ids=None)  # fmt: skip
            self._run_draft_block(draft, need_top1=False)
            calls.append(("tree-proposal", _phase()))
            module.run_eagle_verify(batch, target_worker=None)  # the module's global name
            calls.append(("pack", _phase()))
            return self._result()

        def _result(self) -> Any:
            torch = _torch()
            stride = self.forward_width + 1
            lens = [a + 2 for a in self._accept]  # the clean root and the correction
            tokens: list[int] = []
            for i, n in enumerate(lens):
                run = self.script[i][:n] if self.script else [10 + t for t in range(n)]
                tokens += run + [0] * (stride - n)
            return _BatchResult(
                next_token_ids=torch.tensor(tokens), accept_lens=torch.tensor(lens),
                speculative_num_draft_tokens=self.forward_width, speculative_output_stride=stride,
                num_non_draft_tokens_per_req=2,
            )  # fmt: skip

        def on_verify_complete_cpu(self, drafts: list[int], batch_size: int) -> None:
            pass

    module.run_eagle_verify = run_eagle_verify
    module.SpecInputType = _SpecInputType
    module.UnoWorkerV2 = UnoWorkerV2
    return module


def _dspark(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, str | None]]) -> Any:
    _speculative_package(monkeypatch)
    _package(monkeypatch, "sglang.srt.speculative.dspark_components")
    draft_module = _package(monkeypatch, sg_inst.DSPARK_DRAFT_MODULE, path=False)
    module = _package(monkeypatch, sg_inst.DSPARK_MODULE, path=False)

    class DraftBlockProposer:
        def propose(self, *, batch: Any, draft_input: Any = None, **kwargs: Any) -> Any:
            calls.append(("draft-block", _phase()))
            return types.SimpleNamespace(confidence=None)

    class DSparkWorkerV2:
        """caps: each row's verify window (anchor included) or None (static: the full one)."""

        def __init__(self, accept: list[int], caps: list[int] | None = None, gamma: int = 4,
                     on_device: bool = False) -> None:  # fmt: skip
            self.verify_num_draft_tokens = gamma + 1
            self.speculative_num_draft_tokens = gamma + 1
            self.gamma = gamma
            self._proposer = DraftBlockProposer()
            self._accept, self._caps, self._on_device = accept, caps, on_device

        def forward_batch_generation(
            self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None, *,
            pp_proxy_tensors: Any = None,
        ) -> Any:  # fmt: skip
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                if batch.is_extend_in_batch:
                    return self._forward_dp_spec_prefill_coordination(
                        batch, "plan", on_publish, grammar_barrier, pp_proxy_tensors
                    )
                return _BatchResult()
            return self._forward_decode(batch, on_publish, grammar_barrier)

        def _forward_dp_spec_prefill_coordination(
            self, batch: Any, plan: Any, on_publish: Any, grammar_barrier: Any,
            pp_proxy_tensors: Any,
        ) -> Any:  # fmt: skip
            if not batch.forward_mode.is_extend():
                return self._forward_decode(batch, on_publish, grammar_barrier)
            calls.append(("prefill", _phase()))
            return _BatchResult()

        def _commit_target_mamba_states_after_verify(self, *, batch: Any, **kwargs: Any) -> None:
            calls.append(("commit-state", _phase()))

        def _forward_decode(self, batch: Any, on_publish: Any, grammar_barrier: Any = None) -> Any:
            self._proposer.propose(batch=batch, draft_input=None)
            calls.append(("plan-verify", _phase()))
            calls.append(("target-verify", _phase()))
            calls.append(("accept", _phase()))
            self._commit_target_mamba_states_after_verify(batch=batch)
            calls.append(("commit-draft-kv", _phase()))
            torch = _torch()
            commit = [a + 1 for a in self._accept]
            caps: Any = None
            if self._caps is not None:
                caps = _OnDevice() if self._on_device else torch.tensor(self._caps)
            tokens: list[int] = []
            for n in commit:
                tokens += [10 + t for t in range(n)] + [0] * (self.verify_num_draft_tokens - n)
            return _BatchResult(
                next_token_ids=torch.tensor(tokens), accept_lens=torch.tensor(commit),
                cap_lens=caps, block_accept_lens=torch.tensor(commit),
                speculative_num_draft_tokens=self.verify_num_draft_tokens,
                speculative_output_stride=None,
            )  # fmt: skip

        def on_verify_complete_cpu(self, drafts: list[int], batch_size: int) -> None:
            pass

    draft_module.DraftBlockProposer = DraftBlockProposer
    module.DraftBlockProposer = DraftBlockProposer
    module.DSparkWorkerV2 = DSparkWorkerV2
    return module


def _cycle(observer: Any, step: Callable[[], Any]) -> dict[str, Any]:
    """What one call of ``step`` added to the observer's totals."""
    before = _snapshot(observer)
    step()
    after = _snapshot(observer)
    phases = ("draft", "verify", "bookkeeping")
    return {
        "cycles": after.cycles_total - before.cycles_total,
        "drafted": after.draft_tokens_total - before.draft_tokens_total,
        "accepted": after.accepted_tokens_total - before.accepted_tokens_total,
        "emitted": after.emitted_tokens_total - before.emitted_tokens_total,
        "rows": int(after.batch_size.sum - before.batch_size.sum),
        # Rows that drafted something (a row with nothing drafted has no accept length).
        "scored": after.accept_length.count - before.accept_length.count,
        "by_position": tuple(
            a - b
            for a, b in zip(after.drafted_by_position, before.drafted_by_position, strict=True)
        ),
        "phases": tuple(
            after.phase_count(p, "host") - before.phase_count(p, "host") for p in phases
        ),
    }


def _positions(widths: list[int], k: int) -> tuple[int, ...]:
    """Drafted tokens per position (1-based) for rows of these widths, ``k`` positions wide."""
    return tuple(sum(1 for w in widths if w > p) for p in range(k))


# DFLASH


@pytest.mark.parametrize("mamba", [False, True], ids=["dense", "hybrid"])
def test_dflash_cycle_phases_and_counts(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any, mamba: bool
) -> None:
    calls: list[tuple[str, str | None]] = []
    dflash = _dflash(monkeypatch, calls)
    _host_only(monkeypatch)
    observer = _memory_observer()
    inst = _instrument(monkeypatch, observer)
    assert sg_inst.is_hooked(dflash.DFlashWorkerV2)
    worker = dflash.DFlashWorkerV2(accept=[0, 7, 3], block_size=8, mamba=mamba)
    prefill = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("extend", 3)))
    assert prefill["cycles"] == 0 and calls == [("draft-kv", None)]  # the prompt's draft KV
    calls.clear()
    for _ in range(2):
        got = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("decode", 3)))
        assert got["cycles"] == 1 and got["phases"] == (1, 1, 1)
        assert got["drafted"] == 3 * 7  # the block of 8 holds the last real token and 7 drafts
        assert (got["accepted"], got["emitted"], got["rows"]) == (10, 10 + 3, 3)
    commit = [("mamba", "bookkeeping")] if mamba else []
    assert calls == [
        ("draft-forward", "draft"), ("draft-sample", "draft"),
        ("prepare_for_verify", "verify"), ("target-verify", "verify"), ("accept", "verify"),
        *commit, ("draft-kv", "bookkeeping"),
    ] * 2  # fmt: skip
    assert not any(_snapshot(observer).errors.values())
    inst.uninstrument()
    observer.shutdown(timeout_seconds=5.0)


# UNO


@pytest.mark.parametrize(
    ("width", "topk", "q", "accept", "drafted", "verify_seam"),
    [
        (4, 1, 4, [0, 3, 1], 3, ("UNO_VERIFY", "verify")),
        (1, 1, 1, [0, 0], 0, ("UNO_VERIFY", "verify")),
        (4, 2, 6, [3, 0, 2], 5, ("eagle-verify", "verify")),
    ],
    ids=["linear", "width-1", "tree"],
)
def test_uno_emits_two_tokens_per_row_beyond_its_accepted_proposals(
    monkeypatch: pytest.MonkeyPatch,
    fresh_instrumentors: Any,
    width: int,
    topk: int,
    q: int,
    accept: list[int],
    drafted: int,
    verify_seam: tuple[str, str],
) -> None:
    calls: list[tuple[str, str | None]] = []
    uno = _uno(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    assert sg_inst.is_hooked(uno.UnoWorkerV2)
    worker = uno.UnoWorkerV2(accept=accept, width=width, topk=topk, q=q)
    assert _cycle(observer, lambda: worker.forward_batch_generation(_Batch("extend", 2)))[
        "cycles"
    ] == 0
    rows = len(accept)
    for _ in range(2):
        got = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("decode", rows)))
        assert got["cycles"] == 1 and got["phases"] == (1, 1, 1)
        assert got["drafted"] == rows * drafted  # width 1: a cycle with nothing drafted
        assert got["accepted"] == sum(accept)
        assert got["emitted"] == sum(accept) + 2 * rows  # the clean root and the correction
        assert got["by_position"][:drafted + 1] == _positions([drafted] * rows, drafted + 1)
    draft = [("UNO_DRAFT", "draft"), ("target-forward", "draft")]
    if topk > 1:
        tail = [("tree-proposal", "draft"), verify_seam, ("pack", "verify")]
    else:
        tail = [("sample-candidates", "draft"), verify_seam, ("target-forward", "verify"),
                ("accept", "verify")]  # fmt: skip
    assert calls == (draft + tail) * 2
    assert not any(_snapshot(observer).errors.values()), _snapshot(observer).errors
    observer.shutdown(timeout_seconds=5.0)


def test_uno_accept_lens_on_the_device_keep_the_times_without_a_sync(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    """Outside the scheduler's result processing (which copies them to the host), UNO's
    accept_lens are a CUDA tensor: counting 2 non-draft tokens per row exactly would need them
    read on the worker's thread, so the cycle keeps its times and counts no tokens."""
    calls: list[tuple[str, str | None]] = []
    uno = _uno(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    worker = uno.UnoWorkerV2(accept=[1, 2])
    worker._result = lambda: _BatchResult(accept_lens=_OnDevice(), num_non_draft_tokens_per_req=2)
    got = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("decode", 2)))
    assert (got["cycles"], got["phases"], got["drafted"], got["emitted"]) == (1, (1, 1, 1), 0, 0)
    assert not any(_snapshot(observer).errors.values())
    observer.shutdown(timeout_seconds=5.0)


def _uno_reqs(req_cls: type) -> list[Any]:
    # Per step, each row's emitted run: accepted proposals + 2 (no EOS, far from the length).
    return [
        req_cls("a", 100, [[11, 12], [13, 14, 15, 16, 17]]),
        req_cls("b", 100, [[21, 22, 23, 24], [25, 26]]),
    ]


def test_uno_through_sglangs_own_result_processing(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    """Settled in 0.5.23's own ``process_batch_result_decode``: accepted drafts are what it
    counts per request (accept_lens less its 2 non-draft tokens), emitted what the outputs grew
    by -- 2 more per row than accepted."""
    calls: list[tuple[str, str | None]] = []
    uno = _uno(monkeypatch, calls)
    processor_cls = _processor_class(monkeypatch)
    observer = _instrumented_observer(monkeypatch)
    reqs = _uno_reqs(_req_class())
    worker = uno.UnoWorkerV2(accept=[], width=4)
    processor = processor_cls(worker)
    for step, accept in enumerate(([0, 2], [3, 0])):
        worker._accept = accept
        worker.script = [r.script[step] for r in reqs]
        batch = _ScheduleBatch(reqs)

        def run(batch: Any = batch) -> None:
            processor.process_batch_result_decode(batch, worker.forward_batch_generation(batch))

        got = _cycle(observer, run)
        assert (got["cycles"], got["rows"], got["phases"]) == (1, 2, (1, 1, 1))
        assert got["drafted"] == 2 * 3
        assert got["accepted"] == sum(accept)
        assert got["emitted"] == sum(accept) + 2 * 2
    assert sum(r.spec_num_correct_drafts for r in reqs) == 5  # SGLang's own per-request count
    assert sum(len(r.output_ids) - 1 for r in reqs) == 5 + 2 * 4  # less the prefill token
    snap = _snapshot(observer)
    assert (snap.accepted_tokens_total, snap.emitted_tokens_total) == (5, 13)
    assert snap.dropped["unsettled"] == 0 and not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


# DSPARK


@pytest.mark.parametrize(
    ("caps", "accept", "widths"),
    [
        (None, [4, 0, 2], [4, 4, 4]),  # static verify: every row's full window
        ([3, 1, 5], [2, 0, 3], [2, 0, 4]),  # ragged: each row's admitted window less the anchor
        ([1, 1], [0, 0], [0, 0]),  # every window the anchor alone: nothing drafted
    ],
    ids=["static", "ragged", "anchor-only"],
)
def test_dspark_counts_the_drafts_each_row_verified(
    monkeypatch: pytest.MonkeyPatch,
    fresh_instrumentors: Any,
    caps: list[int] | None,
    accept: list[int],
    widths: list[int],
) -> None:
    calls: list[tuple[str, str | None]] = []
    dspark = _dspark(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    assert sg_inst.is_hooked(dspark.DSparkWorkerV2)
    worker = dspark.DSparkWorkerV2(accept=accept, caps=caps, gamma=4)
    rows = len(accept)
    assert _cycle(observer, lambda: worker.forward_batch_generation(_Batch("extend", rows)))[
        "cycles"
    ] == 0
    got = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("decode", rows)))
    assert got["cycles"] == 1 and got["phases"] == (1, 1, 1)
    assert got["drafted"] == sum(widths)
    assert got["by_position"][:5] == _positions(widths, 5)  # per row, not only in total
    assert (got["accepted"], got["emitted"], got["rows"]) == (sum(accept), sum(accept) + rows,
                                                              rows)  # fmt: skip
    assert got["scored"] == sum(1 for w in widths if w)
    assert calls == [
        ("draft-block", "draft"), ("plan-verify", "verify"), ("target-verify", "verify"),
        ("accept", "verify"), ("commit-state", "bookkeeping"), ("commit-draft-kv", "bookkeeping"),
    ]  # fmt: skip
    assert not any(_snapshot(observer).errors.values()), _snapshot(observer).errors
    observer.shutdown(timeout_seconds=5.0)


def test_dspark_windows_on_the_device_are_not_read_on_the_workers_thread(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[tuple[str, str | None]] = []
    dspark = _dspark(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    worker = dspark.DSparkWorkerV2(accept=[1, 1], caps=[3, 3], on_device=True)
    got = _cycle(observer, lambda: worker.forward_batch_generation(_Batch("decode", 2)))
    # Times kept; the configured width is not counted in place of the admitted ones.
    assert (got["cycles"], got["phases"], got["drafted"], got["accepted"]) == (1, (1, 1, 1), 0, 0)
    observer.shutdown(timeout_seconds=5.0)


def test_dspark_coordinated_decode_rank_is_one_cycle(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[tuple[str, str | None]] = []
    dspark = _dspark(monkeypatch, calls)
    observer = _instrumented_observer(monkeypatch)
    worker = dspark.DSparkWorkerV2(accept=[2, 0], caps=None, gamma=3)
    decode = _Batch("decode", 2)
    decode.is_extend_in_batch = True  # a peer of its DP-attention group prefills
    got = _cycle(observer, lambda: worker.forward_batch_generation(decode))
    assert (got["cycles"], got["phases"], got["drafted"], got["accepted"]) == (1, (1, 1, 1), 6, 2)
    prefill = _Batch("extend", 2)
    prefill.is_extend_in_batch = True
    assert _cycle(observer, lambda: worker.forward_batch_generation(prefill))["cycles"] == 0
    assert calls[-1] == ("prefill", None)
    observer.shutdown(timeout_seconds=5.0)


def test_dspark_through_sglangs_own_result_processing(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    """Settled in 0.5.23's own processing: drafted is what SGLang's per-request cap counter
    added (each row's window) less one anchor per verify; accepted and emitted as it counts."""
    calls: list[tuple[str, str | None]] = []
    dspark = _dspark(monkeypatch, calls)
    processor_cls = _processor_class(monkeypatch)
    observer = _instrumented_observer(monkeypatch)
    base = _req_class()

    def init(self: Any, rid: str, max_new_tokens: int, script: list[list[int]]) -> None:
        base.__init__(self, rid, max_new_tokens, script)  # type: ignore[misc]
        self.spec_num_block_accept_tokens = self.spec_num_cap_tokens = 0
        self.cap_histogram: list[int] = []

    req_cls = type("Req", (base,), {
        "__init__": init,
        "update_spec_cap_lens_histogram": lambda self, n: self.cap_histogram.append(n),
    })  # fmt: skip
    reqs = [req_cls("a", 100, []), req_cls("b", 100, []), req_cls("c", 100, [])]
    worker = dspark.DSparkWorkerV2(accept=[], gamma=4)
    processor = processor_cls(worker)
    for caps, accept in (([3, 1, 5], [2, 0, 4]), ([5, 2, 1], [1, 1, 0])):
        worker._accept, worker._caps = accept, caps
        batch = _ScheduleBatch(reqs)

        def run(batch: Any = batch) -> None:
            processor.process_batch_result_decode(batch, worker.forward_batch_generation(batch))

        got = _cycle(observer, run)
        widths = [c - 1 for c in caps]
        assert (got["cycles"], got["rows"], got["phases"]) == (1, 3, (1, 1, 1))
        assert got["drafted"] == sum(widths)
        assert got["by_position"][:5] == _positions(widths, 5)
        assert (got["accepted"], got["emitted"]) == (sum(accept), sum(accept) + 3)
    snap = _snapshot(observer)
    verified = sum(r.spec_verify_ct for r in reqs)
    assert snap.draft_tokens_total == sum(r.spec_num_cap_tokens for r in reqs) - verified
    # The drafts the planner left out of each window: gamma (4) less the window, per row.
    assert snap.draft_tokens_unverified == (2 + 4 + 0) + (0 + 3 + 4)
    assert snap.draft_tokens_total + snap.draft_tokens_unverified == 4 * verified
    assert snap.accepted_tokens_total == sum(r.spec_num_correct_drafts for r in reqs)
    assert snap.emitted_tokens_total == sum(len(r.output_ids) - 1 for r in reqs)
    assert snap.dropped["unsettled"] == 0 and not any(snap.errors.values()), snap.errors
    observer.shutdown(timeout_seconds=5.0)


# -- uninstrument ----------------------------------------------------------------------------------


def test_uninstrument_restores_every_new_hook(
    monkeypatch: pytest.MonkeyPatch, fresh_instrumentors: Any
) -> None:
    calls: list[tuple[str, str | None]] = []
    modules = [_dflash(monkeypatch, calls), _uno(monkeypatch, calls), _dspark(monkeypatch, calls)]
    owners: list[Any] = [
        modules[0].DFlashWorkerV2, modules[0].DFlashVerifyInput, modules[1].UnoWorkerV2,
        modules[2].DSparkWorkerV2, modules[2].DraftBlockProposer,
    ]  # fmt: skip
    before = [dict(vars(owner)) for owner in owners]
    uno_verify = modules[1].run_eagle_verify
    _host_only(monkeypatch)
    observer = _memory_observer()
    inst = _instrument(monkeypatch, observer)
    patched = {t.dotted for t in sg_inst.HOOK_TARGETS if t.module in {
        sg_inst.DFLASH_MODULE, sg_inst.DFLASH_INFO_MODULE, sg_inst.UNO_MODULE,
        sg_inst.DSPARK_MODULE, sg_inst.DSPARK_DRAFT_MODULE}}  # fmt: skip
    assert len(patched) == 11
    assert modules[1].run_eagle_verify is not uno_verify
    assert all(dict(vars(owner)) != old for owner, old in zip(owners, before, strict=True))
    inst.uninstrument()
    assert [dict(vars(owner)) for owner in owners] == before
    assert modules[1].run_eagle_verify is uno_verify
    assert not sg_inst.is_hooked(modules[0].DFlashWorkerV2)
    # Unhooked, a step runs untouched and records nothing.
    modules[2].DSparkWorkerV2(accept=[1]).forward_batch_generation(_Batch("decode", 1))
    assert _snapshot(observer).cycles_total == 0
    observer.shutdown(timeout_seconds=5.0)
    assert "sglang" in sys.modules
