#!/usr/bin/env bash
# Everything specobs claims about GPUs, in one call on the device machine (an H200):
#   the GPU tests, the overhead benchmark, and (when present) the demo engine and the
#   transformers instrumentation benchmarks. Results land in $OUT (or ./gpu-results).
# Wheels for packages the device image lacks travel in .whl/ (see benchmarks/RESULTS.md).
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/device.txt"
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])' | tee -a "$OUT/device.txt"
what=${1:-all}
if [[ $what == all || $what == tests ]]; then
  python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu.py ${GPU_EXTRA_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [[ $what == all || $what == overhead ]]; then
  python3 benchmarks/gpu_overhead.py ${OVERHEAD_ARGS:-} --json "$OUT/gpu_overhead.json" 2>&1 | tee "$OUT/gpu_overhead.log"
fi
for extra in ${GPU_EXTRA_BENCH:-}; do
  python3 "$extra" --device cuda 2>&1 | tee "$OUT/$(basename "$extra" .py).log"
done
