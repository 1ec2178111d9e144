"""``specobs engines`` and the hook contracts behind it, against real wheels and small trees.

1. Real releases: vllm 0.34.0, vllm 0.33.0 and sglang 0.5.23 installed with ``pip install
   --no-deps --target`` (wheels fetched once into ``SPECOBS_CONTRACTS_CACHE``, as
   tests/test_instrument_contracts.py does; skipped when the package index cannot be reached) and
   checked by ``specobs engines --path DIR --json`` in a subprocess; a copy with one hook point
   renamed is refused and the output names that point.
2. The checker on synthetic trees: a method inherited through ``from X import Y``, a renamed
   parameter, a missing field.
3. The instrumentor: ``VllmInstrumentor().instrument()`` against a stand-in ``vllm`` 0.34.0 /
   0.35.0 distribution (a dist-info directory on ``sys.path``) attaches, warns once when the
   release is newer than the tested range, and refuses naming the missing point.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from specobs.instrument import _contract
from specobs.instrument import sglang as sg_inst
from specobs.instrument import vllm as vl_inst
from specobs.instrument._package_sglang import CONTRACT as SGLANG_CONTRACT
from specobs.instrument._package_vllm import CONTRACT as VLLM_CONTRACT
from specobs.instrument._package_vllm import PACKAGE as VLLM_RANGE
from specobs.mixin import _splice, check_all, render_regions, write_all
from tests._pinned_wheels import wheel as _wheel
from tests.test_instrument_contracts import CACHE

ROOT = Path(__file__).resolve().parent.parent


# -- 1. real releases ------------------------------------------------------------------------------


def _installed(dist: str, version: str) -> Path:
    """``pip install --no-deps --target`` of the pinned wheel, kept in the cache between runs."""
    target = CACHE / "targets" / f"{dist}-{version}"
    if (target / f"{dist}-{version}.dist-info").is_dir():
        return target
    wheel = _wheel(dist, version)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
         "--target", str(partial), str(wheel)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _engines(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "specobs.cli", "engines", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def _entry(output: str, engine: str) -> dict[str, Any]:
    data = json.loads(output)
    assert data["schema"] == 1
    return next(e for e in data["engines"] if e["engine"] == engine)


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_vllm_release_is_attachable_with_every_method_supported(version: str) -> None:
    target = _installed("vllm", version)
    rc, out = _engines("--path", str(target), "--json")
    assert rc == 0, out
    entry = _entry(out, "vLLM")
    assert (entry["distribution"], entry["version"]) == ("vllm", version)
    assert entry["verdict"] == "attachable" and entry["problems"] == []
    assert entry["methods"] and all(m["status"] == "supported" for m in entry["methods"])
    points = {p["name"]: p["status"] for p in entry["hook_points"]}
    assert points[f"{vl_inst.V2_MODULE}.GPUModelRunner.sample_tokens"] == "found"
    v1 = f"{vl_inst.V1_MODULE}.GPUModelRunner._bookkeeping_sync"
    assert points[v1] == ("absent" if version == "0.34.0" else "found")
    # The other engines are not in the directory: listed, never failing.
    assert _entry(out, "SGLang")["verdict"] == "not_installed"


def test_sglang_release_is_attachable_and_its_workers_are_listed() -> None:
    rc, out = _engines("--path", str(_installed("sglang", "0.5.23")), "--json")
    assert rc == 0, out
    entry = _entry(out, "SGLang")
    assert entry["verdict"] == "attachable"
    methods = {m["name"]: m for m in entry["methods"]}
    for worker in ("EAGLEWorkerV2", "StandaloneWorkerV2", "MultiLayerEagleWorkerV2",
                   "FrozenKVMTPWorkerV2", "NGRAMWorker"):
        assert methods[worker]["status"] == "supported", methods[worker]
    for worker in ("DFlashWorkerV2", "UnoWorkerV2", "DSparkWorkerV2"):
        # What the SGLang instrumentor says now (it may learn to time them).
        reason = sg_inst.UNSUPPORTED_WORKERS.get(worker)
        if reason is None:
            assert methods[worker]["status"] == "supported", methods[worker]
        else:
            assert (methods[worker]["status"], methods[worker]["reason"]) == ("unsupported",
                                                                              reason)
    assert methods["EAGLEWorker"]["status"] == "absent"  # the V1 worker left in 0.5.13
    points = {p["name"]: p for p in entry["hook_points"]}
    standalone = points["sglang.srt.speculative.standalone_worker_v2.StandaloneWorkerV2."
                        "forward_batch_generation"]
    assert standalone["where"].startswith("sglang/srt/speculative/eagle_worker_v2.py:")


def _python_copy(source: Path, destination: Path) -> Path:
    """The ``.py`` files and the metadata of an installed target: enough for the check."""

    def ignore(folder: str, names: list[str]) -> list[str]:
        if folder.endswith(".dist-info"):
            return []
        return [n for n in names if not (n.endswith(".py") or (Path(folder) / n).is_dir())]

    shutil.copytree(source, destination, ignore=ignore)
    return destination


def test_a_renamed_hook_point_is_refused_and_named(tmp_path: Path) -> None:
    copy = _python_copy(_installed("vllm", "0.34.0"), tmp_path / "site")
    runner = copy / "vllm/v1/worker/gpu/model_runner.py"
    text = runner.read_text()
    assert text.count("    def sample_tokens(") == 1
    runner.write_text(text.replace("    def sample_tokens(", "    def sample_next_tokens("))
    rc, out = _engines("--path", str(copy), "--json")
    assert rc == 1, out
    entry = _entry(out, "vLLM")
    name = f"{vl_inst.V2_MODULE}.GPUModelRunner.sample_tokens"
    assert entry["verdict"] == "refused"
    assert entry["problems"] == [f"{name} (method sample_tokens missing)"]
    assert name in entry["message"]
    rc, text_out = _engines("--path", str(copy))
    assert rc == 1 and name in text_out and "REFUSED" in text_out


# -- 2. the checker on synthetic trees -------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


_ENGINE_FILES = {
    "eng/__init__.py": "",
    "eng/base.py": '''
        class Base:
            size: int

            def __init__(self):
                self.depth = 3

            def step(self, batch, *, mode=None):
                pass
    ''',
    "eng/worker.py": '''
        import eng.base as base_module
        from .base import Base as Parent

        class Worker(Parent):
            def verify(self, batch, grammar):
                pass

        class Other(base_module.Base):
            pass
    ''',
}


def _contract_of(*points: _contract.HookPoint) -> _contract.Contract:
    return _contract.Contract("eng", _contract.PackageRange("eng", "1.0", "2.0"), (
        _contract.Variant("v", _contract.REQUIRED, points),
    ))


def _dist_info(root: Path, name: str, version: str) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_checker_follows_bases_through_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, _ENGINE_FILES)
    _dist_info(root, "eng", "1.5")
    contract = _contract_of(
        _contract.HookPoint("eng.worker", "Worker", "step", ("batch", "mode"), ("size", "depth")),
        _contract.HookPoint("eng.worker", "Other", "step", ("batch",)),
        _contract.HookPoint("eng.worker", "Worker", "verify", ("grammar",)),
    )
    report = _contract.check(contract, [root])
    assert report.verdict == _contract.ATTACHABLE, report.problems
    assert [p.where for p in report.points] == ["eng/base.py:8", "eng/base.py:8",
                                                "eng/worker.py:6"]


def test_checker_names_a_renamed_parameter_and_a_missing_field(tmp_path: Path) -> None:
    root = _tree(tmp_path, _ENGINE_FILES)
    _dist_info(root, "eng", "2.1")
    contract = _contract_of(
        _contract.HookPoint("eng.worker", "Worker", "verify", ("batch", "grammar_output")),
        _contract.HookPoint("eng.worker", "Worker", fields=("size", "width")),
        _contract.HookPoint("eng.worker", "Gone", "step"),
        _contract.HookPoint("eng.absent", "Worker", "step", optional=True),
    )
    report = _contract.check(contract, [root])
    assert report.verdict == _contract.REFUSED
    assert report.problems == (
        "eng.worker.Worker.verify (parameter grammar_output missing)",
        "eng.worker.Worker (field width missing)",
        "eng.worker.Gone.step (class Gone missing from eng/worker.py)",
    )
    assert [p.status for p in report.points] == ["missing"] * 3 + ["missing_optional"]
    assert "eng.worker.Worker.verify (parameter grammar_output missing)" in report.message()


def test_checker_verdicts_by_version(tmp_path: Path) -> None:
    root = _tree(tmp_path, _ENGINE_FILES)
    contract = _contract_of(_contract.HookPoint("eng.worker", "Worker", "step"))
    assert _contract.check(contract, [root]).verdict == _contract.NOT_INSTALLED
    # No files to read: the tested range alone decides.
    assert _contract.check(contract, version="1.2").verdict == _contract.ATTACHABLE
    assert _contract.check(contract, version="2.1").verdict == _contract.REFUSED
    _dist_info(root, "eng", "1.0")
    for version, verdict in (("0.9", _contract.BELOW_FLOOR), ("1.9.3", _contract.ATTACHABLE),
                             ("2.0.0rc1", _contract.ATTACHABLE_UNTESTED)):
        assert _contract.check(contract, [root], version=version).verdict == verdict


# -- 3. the instrumentor attaches by contract ------------------------------------------------------


def _vllm_standin(root: Path, version: str, *, drop: str = "") -> Path:
    """A ``vllm`` distribution with every required point of the declared table, written from the
    table itself (runner V2 only, as 0.34 has), minus the method ``drop``."""
    _dist_info(root, "vllm", version)
    classes: dict[tuple[str, str], list[_contract.HookPoint]] = {}
    for variant, point in VLLM_CONTRACT.points():
        if variant.requirement != _contract.WHERE_PRESENT or variant.name == "runner V2":
            classes.setdefault((point.module, point.owner), []).append(point)
    files: dict[str, list[str]] = {}
    for (module, owner), points in classes.items():
        body = [f"    {f}: object" for p in points for f in p.fields]
        body += [f"    def {p.method}(self, {', '.join(p.params)}): pass"
                 for p in points if p.method and p.method != drop]
        files.setdefault(module, []).append(f"class {owner}:\n" + "\n".join(body or ["    pass"]))
    for module, classes_text in files.items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(classes_text) + "\n")
    return root


@pytest.fixture
def vllm_instrumentor(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    inst = vl_inst.VllmInstrumentor()
    inst.uninstrument()
    monkeypatch.setattr(inst, "_warned", False)
    monkeypatch.setattr(vl_inst.VllmInstrumentor, "package", VLLM_RANGE)
    yield inst
    inst.uninstrument()
    inst._observer = None


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "specobs.instrument"]


@pytest.mark.parametrize(("version", "untested"), [("0.34.0", False), ("0.35.0", True)])
def test_vllm_instrumentor_attaches_by_contract(
    version: str, untested: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, vllm_instrumentor: Any,
) -> None:
    monkeypatch.syspath_prepend(str(_vllm_standin(tmp_path, version)))
    assert VLLM_RANGE.tested(version) is not untested
    with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
        assert vllm_instrumentor.instrument() is True
        vllm_instrumentor.uninstrument()
        assert vllm_instrumentor.instrument() is True
    messages = _warnings(caplog)
    if untested:
        assert len(messages) == 1
        assert f"vllm {version}" in messages[0]
        assert "newer than those it was tested" in messages[0]
    else:
        assert messages == []


def test_vllm_instrumentor_refuses_a_release_missing_a_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    vllm_instrumentor: Any,
) -> None:
    monkeypatch.syspath_prepend(str(_vllm_standin(tmp_path, "0.34.0", drop="sample_tokens")))
    with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
        assert vllm_instrumentor.instrument() is False
        assert vllm_instrumentor.instrument() is False
    assert not vllm_instrumentor.is_instrumented
    messages = _warnings(caplog)
    assert len(messages) == 1
    assert f"{vl_inst.V2_MODULE}.GPUModelRunner.sample_tokens (method sample_tokens missing)" in (
        messages[0])
    assert "vllm 0.34.0" in messages[0]
    # skip_dep_check (opentelemetry-instrument, after its own version check) skips the version
    # check, not the hook points: the engine stays untouched, and no second warning is logged.
    with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
        assert vllm_instrumentor.instrument(skip_dep_check=True) is False
    assert not vllm_instrumentor.is_instrumented
    assert len(_warnings(caplog)) == 1


def test_skip_dep_check_lets_an_engine_it_cannot_find_or_an_untested_one_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vllm_instrumentor: Any,
) -> None:
    assert vllm_instrumentor.contract_report().verdict == _contract.NOT_INSTALLED
    assert vllm_instrumentor.instrument(skip_dep_check=True) is True
    vllm_instrumentor.uninstrument()
    monkeypatch.syspath_prepend(str(_vllm_standin(tmp_path, "0.35.0")))
    assert vllm_instrumentor.instrument(skip_dep_check=True) is True


# -- the declared tables against the code, and the generated table ---------------------------------


def _declared(contract: _contract.Contract) -> set[tuple[str, str, str]]:
    return {(p.module, p.owner, p.method) for _, p in contract.points() if p.method}


def test_every_patched_vllm_method_is_declared() -> None:
    declared = _declared(VLLM_CONTRACT)
    patched = {(module, vl_inst.RUNNER_CLASS, method)
               for module, hooks in vl_inst.RUNNERS.items() for method in hooks}
    patched |= {(vl_inst.WORKER_MODULE, vl_inst.WORKER_CLASS, "load_model")}
    patched |= {(vl_inst.SCHEDULER_MODULE, vl_inst.SCHEDULER_CLASS, method) for method in
                ("update_from_output", "make_spec_decoding_stats", "schedule")}
    assert patched <= declared, patched - declared


def test_every_patched_sglang_method_is_declared() -> None:
    declared = _declared(SGLANG_CONTRACT)
    patched = {(t.module, t.owner, t.method) for t in sg_inst.HOOK_TARGETS}
    patched |= {(module, owner, "create_worker") for module, owner in sg_inst.WORKER_FACTORIES}
    assert patched <= declared, patched - declared
    workers = {m.name for m in SGLANG_CONTRACT.methods}
    assert set(sg_inst.HOOKED_WORKERS) | set(sg_inst.UNSUPPORTED_WORKERS) <= workers


def test_every_transformers_seam_is_declared() -> None:
    from specobs.instrument import transformers as tf_inst
    from specobs.instrument._package_transformers import CONTRACT

    declared = _declared(CONTRACT)
    source = Path(tf_inst.__file__).read_text()
    seams = {
        ("transformers.generation.utils", "GenerationMixin", "_assisted_decoding"),
        ("transformers.generation.utils", "GenerationMixin", "_get_candidate_generator"),
        ("transformers.generation.candidate_generator", "CandidateGenerator", "get_candidates"),
        ("transformers.generation.candidate_generator", "CandidateGenerator",
         "update_candidate_strategy"),
    }
    for _, _, method in seams:
        assert method in source  # the instrumentor still patches it
    assert seams <= declared


def test_the_support_table_is_generated_and_drift_is_caught(tmp_path: Path) -> None:
    region = render_regions()["docs/integrations.md"]
    current = (ROOT / "docs/integrations.md").read_text()
    assert _splice(current, region) == current, "run: python3 -m specobs.cli generate"
    for name in ("EAGLEWorkerV2", "runner V2", "floor **0.11**", ">= 0.11, < 0.35"):
        assert name in region
    host = tmp_path / "docs/integrations.md"
    host.parent.mkdir()
    host.write_text(current.replace("| eagle3 (EAGLE-3 draft head) | timed |",
                                    "| eagle3 (EAGLE-3 draft head) | maybe |"))
    assert "docs/integrations.md" in check_all(tmp_path)
    assert "docs/integrations.md" in write_all(tmp_path)
    assert host.read_text() == current
    assert "docs/integrations.md" not in check_all(tmp_path)
