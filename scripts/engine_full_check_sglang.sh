#!/usr/bin/env bash
# The real SGLang release, fully installed, against specobs's plugin (not part of the CI suite:
# 4-10 min and ~11 GB; its result is recorded in benchmarks/RESULTS.md).
#
#   scripts/engine_full_check_sglang.sh [SGLANG_VERSION]      (default 0.5.23)
#
# In a throwaway venv: pip install sglang==VERSION (it pins a CUDA torch; it imports on a CPU
# machine), install specobs as a real distribution, then in fresh interpreters:
#   1. import cost per process: SGLang's own load_plugins() with SGLANG_PLUGINS=specobs, without
#      and with SPECOBS_SGLANG=1 (time and modules added; which worker modules got imported),
#      against importing eagle_worker_v2 (what HookRegistry.apply_hooks() made the plugin import
#      in every process before specobs patched on import);
#   2. SGLang's real HookRegistry.apply_hooks() runs after it, and when SGLang imports its
#      worker modules, which worker classes carry specobs's hooks, which are reported as
#      unsupported, and that uninstrument() takes every hook off again.
# VENV=DIR REUSE=1 reuses an existing venv that already has sglang (no install). The venv is
# removed at the end unless KEEP_VENV=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${1:-0.5.23}
VENV=${VENV:-$(mktemp -d "${TMPDIR:-/tmp}/specobs-sglang-full.XXXXXX")}
cleanup() { if [[ ${KEEP_VENV:-0} != 1 ]]; then rm -rf "$VENV"; fi; }
trap cleanup EXIT

start=$SECONDS
if [[ ${REUSE:-0} != 1 ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "sglang==$VERSION"
fi
"$VENV/bin/pip" install -q --no-deps --force-reinstall "$ROOT"
"$VENV/bin/pip" install -q "wrapt>=1.14" "prometheus-client>=0.20"
echo "install: $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1); sglang $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')"
cd "$VENV"  # never import specobs from the checkout: the installed distribution is under test

export SGLANG_PLUGINS=specobs
measure() {  # $1: SPECOBS_SGLANG value; prints seconds and modules added by load_plugins()
  SPECOBS_SGLANG=$1 "$VENV/bin/python" - <<'PY'
import os, sys, time
from sglang.srt.plugins import load_plugins
n0, t0 = len(sys.modules), time.perf_counter()
load_plugins()
n1, t1 = len(sys.modules), time.perf_counter()
workers = sorted(m for m in sys.modules if m.startswith("sglang.srt.speculative.") and "worker" in m)
print(f"  SPECOBS_SGLANG={os.environ['SPECOBS_SGLANG'] or 'unset'}: load_plugins() "
      f"{t1 - t0:.3f} s, +{n1 - n0} modules; worker modules imported: {workers}")
if os.environ["SPECOBS_SGLANG"] == "1":
    t2 = time.perf_counter()
    import sglang.srt.speculative.eagle_worker_v2  # noqa: F401  (what the plugin used to import)
    print(f"  for comparison, importing eagle_worker_v2 (the plugin's cost before): "
          f"{time.perf_counter() - t2:.2f} s, +{len(sys.modules) - n1} modules")
PY
}
echo "1. import cost per process (each line a fresh interpreter):"
measure ""
measure 1
measure 1

echo "2. hooks on the real classes:"
SPECOBS_SGLANG=1 "$VENV/bin/python" - <<'PY'
import importlib, logging, sys
logging.basicConfig(level=logging.WARNING)
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
HookRegistry.apply_hooks()
from specobs.instrument import sglang as s
print(f"  plugin loaded through the entry point: instrumented={s.SGLangInstrumentor().is_instrumented}")
classes = {
    "eagle_worker_v2": ["EAGLEWorkerV2", "EagleDraftWorker"],
    "standalone_worker_v2": ["StandaloneWorkerV2"],
    "multi_layer_eagle_worker_v2": ["MultiLayerEagleWorkerV2", "MultiLayerEagleDraftWorker"],
    "frozen_kv_mtp_worker_v2": ["FrozenKVMTPWorkerV2", "FrozenKVMTPDraftWorker"],
    "ngram_worker": ["NGRAMWorker"],
    "dflash_worker_v2": ["DFlashWorkerV2"],
    "uno_worker_v2": ["UnoWorkerV2"],
    "dspark_components.dspark_worker_v2": ["DSparkWorkerV2"],
}
loaded = {}
for module, names in classes.items():
    try:
        mod = importlib.import_module("sglang.srt.speculative." + module)
    except Exception as exc:
        print(f"  {module}: cannot be imported here ({type(exc).__name__}: {str(exc)[:100]})")
        continue
    for name in names:
        cls = getattr(mod, name)
        loaded[name] = cls
        hooked = sorted(
            m for m in ("forward_batch_generation", "verify", "draft", "_draft_extend_for_decode",
                        "_prepare_for_speculative_decoding", "_update_ngram_corpus")
            if hasattr(getattr(cls, m, None), "__wrapped__")
        )
        step = "cycle hooked" if s.is_hooked(cls) else (
            "reported unsupported on first step" if name in s.UNSUPPORTED_WORKERS else "-")
        print(f"  {module}.{name}: {step}; wrapped methods: {hooked}")
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from specobs.instrument._base import hook_of
print(f"  SpeculativeAlgorithm.create_worker wrapped: {hasattr(SpeculativeAlgorithm.create_worker, '__wrapped__')}")
for name in s.UNSUPPORTED_WORKERS:
    if name in loaded:
        s.SGLangInstrumentor()._report_on_first_step(loaded[name])
        print(f"  {name}: unsupported reporter installed: "
              f"{hook_of(loaded[name].forward_batch_generation) is s._around_first_step_reporting}")
s.SGLangInstrumentor().uninstrument()
left = [n for n, c in loaded.items() if s.is_hooked(c)
        or hook_of(getattr(c, "forward_batch_generation", None)) is not None]
print(f"  after uninstrument(): classes still wrapped: {left}; create_worker wrapped: "
      f"{hasattr(SpeculativeAlgorithm.create_worker, '__wrapped__')}")
PY
echo "total: $((SECONDS - start)) s"
