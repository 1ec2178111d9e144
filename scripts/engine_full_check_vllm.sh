#!/usr/bin/env bash
# The real vLLM release, fully installed, against specobs's plugin (not part of the CI suite:
# ~12 min and ~10 GB; its result is recorded in benchmarks/RESULTS.md).
#
#   scripts/engine_full_check_vllm.sh [VLLM_VERSION]      (default 0.33.0)
#
# In a throwaway venv: pip install vllm==VERSION (its CUDA torch; it imports on a CPU machine),
# install specobs as a real distribution, then in fresh interpreters:
#   1. vLLM's own load_general_plugins() finds specobs through its entry point, and loading it
#      imports no model runner (time and modules added, against importing the V1 runner module
#      as specobs did before);
#   2. when vLLM imports its runners and worker, the hooks land on model runner V1 and V2,
#      Worker.load_model, and the CPU runners that subclass them;
#   3. vLLM's real VllmConfig.use_v2_model_runner picks V2 for eagle, eagle3, ngram,
#      draft_model and mtp (stub configs; VLLM_USE_V2_MODEL_RUNNER=0 picks V1), and the class
#      the worker would build is one specobs times.
# The venv is removed at the end unless KEEP_VENV=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${1:-0.33.0}
VENV=${VENV:-$(mktemp -d "${TMPDIR:-/tmp}/specobs-vllm-full.XXXXXX")}
cleanup() { if [[ ${KEEP_VENV:-0} != 1 ]]; then rm -rf "$VENV"; fi; }
trap cleanup EXIT

start=$SECONDS
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "vllm==$VERSION"
"$VENV/bin/pip" install -q --no-deps "$ROOT"
"$VENV/bin/pip" install -q "wrapt>=1.14" "prometheus-client>=0.20"
echo "install: $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
cd "$VENV"  # never import specobs from the checkout: the installed distribution is under test

export SPECOBS_VLLM=1 VLLM_PLUGINS=specobs
"$VENV/bin/python" - <<'PY'
import sys, time
n0, t0 = len(sys.modules), time.perf_counter()
from vllm.plugins import load_general_plugins
n1, t1 = len(sys.modules), time.perf_counter()
load_general_plugins()
n2, t2 = len(sys.modules), time.perf_counter()
from specobs.instrument.vllm import V1_MODULE, V2_MODULE, WORKER_MODULE, VllmInstrumentor
print(f"plugin loaded through the entry point: instrumented={VllmInstrumentor().is_instrumented}")
print(f"import vllm.plugins: {t1 - t0:.2f} s, +{n1 - n0} modules")
print(f"load_general_plugins() with specobs: {t2 - t1:.3f} s, +{n2 - n1} modules; "
      f"runner modules imported: {[m for m in (V1_MODULE, V2_MODULE, WORKER_MODULE) if m in sys.modules]}")
t3 = time.perf_counter()
import vllm.v1.worker.gpu_model_runner  # noqa: F401  (what the plugin used to import)
print(f"for comparison, importing {V1_MODULE} (the plugin's old cost): "
      f"{time.perf_counter() - t3:.2f} s, +{len(sys.modules) - n2} modules")
PY

"$VENV/bin/python" - <<'PY'
import importlib, types
from vllm.plugins import load_general_plugins
load_general_plugins()
from specobs.instrument import vllm as v
inst = v.VllmInstrumentor()
ok = True
for module, hooks in v.RUNNERS.items():
    cls = getattr(importlib.import_module(module), v.RUNNER_CLASS)
    for method, hook in hooks.items():
        got = getattr(getattr(cls, method, None), "__specobs_hook__", None)
        ok &= got is hook
        print(f"{module}.{v.RUNNER_CLASS}.{method}: {'hooked' if got is hook else 'NOT HOOKED'}")
worker = getattr(importlib.import_module(v.WORKER_MODULE), v.WORKER_CLASS)
hooked = getattr(worker.load_model, "__specobs_hook__", None) is not None
ok &= hooked
print(f"{v.WORKER_MODULE}.{v.WORKER_CLASS}.load_model: {'hooked' if hooked else 'NOT HOOKED'}")
for module, name in (("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
                     ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
                     ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
                     ("vllm.v1.worker.cpu.model_runner", "CPUModelRunner")):
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as exc:
        print(f"{module}.{name}: cannot import on this machine ({exc!r})")
        continue
    kind = inst.runner_integration(object.__new__(cls))
    ok &= kind is not None
    print(f"{module}.{name}: timed as {kind}")

from vllm.config import VllmConfig
import vllm.envs as envs
prop = VllmConfig.use_v2_model_runner.fget
def config(method):
    c = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None), watermark_config=None,
        speculative_config=types.SimpleNamespace(method=method, parallel_drafting=False,
                                                 use_heterogeneous_vocab=False),
        parallel_config=types.SimpleNamespace(distributed_executor_backend="mp",
                                              pipeline_parallel_size=1, use_ubatching=False))
    c._get_v2_model_runner_unsupported_features = types.MethodType(
        VllmConfig._get_v2_model_runner_unsupported_features, c)
    return c
for method in ("eagle", "eagle3", "ngram", "draft_model", "mtp", "suffix"):
    v2 = prop(config(method))
    module = v.V2_MODULE if v2 else v.V1_MODULE
    print(f"use_v2_model_runner[{method}] = {v2} -> builds {module}.GPUModelRunner, "
          f"timed: {module in v.RUNNERS}")
envs.__dict__["VLLM_USE_V2_MODEL_RUNNER"] = False
try:
    print(f"VLLM_USE_V2_MODEL_RUNNER=0: use_v2_model_runner[eagle3] = {prop(config('eagle3'))}")
except Exception as exc:
    print(f"VLLM_USE_V2_MODEL_RUNNER=0: could not evaluate ({exc!r})")
print("RESULT:", "PASS" if ok else "FAIL")
raise SystemExit(0 if ok else 1)
PY
echo "total: $((SECONDS - start)) s"
