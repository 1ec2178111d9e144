#!/usr/bin/env bash
# Everything specobs claims about GPUs, run on the device machine (an H200):
#   core      build the native core (specobs/_core/) with this machine's Python, then its tests
#             (the differential test against the pure-Python ring, handles, memory checks) and
#             the GPU tests on the pure-Python ring
#   tests     the GPU tests (tests/test_gpu.py) and the transformers instrumentor's CUDA tests
#   overhead  benchmarks/gpu_overhead.py (throughput ratios and per-phase accuracy)
#   host      benchmarks/cpu_overhead.py and export_overhead.py on the GPU host's CPU
#   engines   `specobs demo` from a cold weight cache, the demo engine benchmark, and
#             transformers assisted generation, on the GPU
#   demotests the demo engine's CUDA-graph test (tests/test_demo_engine.py -k cuda)
#   recipes   benchmarks/demo_recipes.py: the demo's shipped training recipe over 8 seeds on the
#             host's CPU cores (how far wrong-hidden-layers drops acceptance, seed by seed)
#   advisor   benchmarks/advisor_k.py at k = 1..8 on the GPU and on one pinned host core at once
#   profile   benchmarks/diag/resolver_profile.py: where the resolver's time goes inside the GPU
#             loop (each CUDA call timed, a cProfile of its thread, py-spy if it can attach)
# Usage: OUT=dir benchmarks/gpu_run.sh [tests] [overhead] [host] [engines] [demotests]
#        [recipes]   (default: all)
# Wheels for packages the device image lacks travel in .whl/ (pytest, prometheus_client,
# opentelemetry, grpcio, protobuf, fastapi/starlette/pydantic/uvicorn for the demo's server; see
# benchmarks/RESULTS.md for the command that fetches them).
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site PATH=/tmp/site/bin:$PATH
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/device.txt"
python3 -c 'import torch, sys, os; print("torch", torch.__version__, "python", sys.version.split()[0], "cpus", os.cpu_count())' | tee -a "$OUT/device.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/device.txt"
parts=${*:-core tests overhead host engines demotests recipes}
# Every part measures the native core: build it first on a fresh machine (a run of `overhead`
# alone there once measured the pure-Python ring).
if ! python3 -c 'import sys; from specobs import _ring; sys.exit(0 if _ring.NATIVE else 1)' 2>/dev/null; then
  python3 setup.py build_ext --inplace > "$OUT/core_build.log" 2>&1 || tail -n 20 "$OUT/core_build.log"
fi
for part in $parts; do
  case $part in
    core)
      python3 setup.py build_ext --inplace > "$OUT/core_build.log" 2>&1 || tail -n 20 "$OUT/core_build.log"
      python3 -c 'from specobs import _ring; print("native core:", _ring.NATIVE)' | tee -a "$OUT/device.txt"
      python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_ring.py tests/test_handles.py tests/test_native_copy.py tests/test_native_events.py tests/test_nogil_drain.py \
        tests/test_core_memory.py tests/test_pump.py 2>&1 | tee "$OUT/core_tests.log" | tail -n 5
      SPECOBS_CORE=python python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu.py \
        2>&1 | tee "$OUT/gpu_tests_pycore.log" | tail -n 5 ;;
    tests)
      python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu.py \
        tests/test_instrument_transformers.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 15
      # The vLLM V2 hooks on CUDA tensors (stand-in runner; no vLLM wheel on the device).
      python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_instrument_vllm.py \
        -k cuda_tensors 2>&1 | tee "$OUT/gpu_vllm_tests.log" | tail -n 5 ;;
    overhead)
      python3 benchmarks/gpu_overhead.py ${OVERHEAD_ARGS:-} --json "$OUT/gpu_overhead.json" \
        2>&1 | tee "$OUT/gpu_overhead.log" ;;
    host)
      python3 benchmarks/cpu_overhead.py --cycles 100000 --repeats 3 2>&1 | tee "$OUT/cpu_overhead.log"
      python3 benchmarks/export_overhead.py --seconds 10 --repeats 3 2>&1 | tee "$OUT/export_overhead.log" ;;
    engines)
      export SPECOBS_CACHE_DIR=$(mktemp -d)  # cold: the demo trains its models first
      start=$SECONDS
      python3 -m specobs.cli demo --device cuda --duration 30 --plain --port 18000 \
        --metrics-port 19477 2>&1 | tee "$OUT/demo_cli.log" | tail -n 25
      echo "specobs demo: $((SECONDS - start)) s wall, cold cache, --duration 30" | tee -a "$OUT/demo_cli.log"
      python3 benchmarks/demo_engine.py --device cuda --seconds 8 2>&1 | tee "$OUT/demo_engine.log" | tail -n 8
      python3 benchmarks/transformers_overhead.py --device cuda --rounds 9 2>&1 | tee "$OUT/transformers_overhead.log" | tail -n 6 ;;
    demotests)  # the demo engine's CUDA-graph test (trains its own models into a fresh cache)
      SPECOBS_CACHE_DIR=$(mktemp -d) python3 -m pytest -q --noconftest -p no:cacheprovider \
        tests/test_demo_engine.py tests/test_demo_baseline.py -k "cuda" 2>&1 \
        | tee "$OUT/demo_gpu_tests.log" | tail -n 5 ;;
    profile)
      python3 benchmarks/diag/resolver_profile.py --workloads ${PROFILE_WORKLOADS:-small-graph,small-graph-cudaacc} \
        --cycles 3000 --pyspy 5 --out "$OUT" 2>&1 | tee "$OUT/resolver_profile.log" ;;
    advisor)  # SPEC-ADVICE-K against measured tokens/s: the demo at k = 1..8 on the GPU and, at
      # the same time, on one host core whose SMT siblings run nothing else (one torch thread)
      gpu_cpus=$(cat /sys/devices/system/cpu/cpu{0,1}/topology/thread_siblings_list | paste -sd,)
      cpu_cpu=$(python3 -c 'import os,sys; busy=set(); [busy.update(int(x) for x in open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read().replace("-",",").split(",")) for c in (0,1)]; free=[c for c in sorted(os.sched_getaffinity(0)) if c not in busy]; print(free[len(free)//2])')
      echo "GPU run on CPUs $gpu_cpus, CPU run on CPU $cpu_cpu (siblings $(cat /sys/devices/system/cpu/cpu$cpu_cpu/topology/thread_siblings_list))" | tee "$OUT/advisor_pins.txt"
      taskset -c "$cpu_cpu" python3 benchmarks/advisor_k.py --device cpu --ks 1,2,3,4,5,6,7,8 \
        --steps ${ADVISOR_CPU_STEPS:-100} --rounds ${ADVISOR_CPU_ROUNDS:-12} --builds ${ADVISOR_BUILDS:-1} --threads 1 \
        --time running --speed median --json "$OUT/advisor_cpu.json" > "$OUT/advisor_cpu.log" 2>&1 &
      cpu_pid=$!
      taskset -c "$gpu_cpus" python3 benchmarks/advisor_k.py --device cuda --ks 1,2,3,4,5,6,7,8 \
        --steps ${ADVISOR_STEPS:-400} --rounds ${ADVISOR_ROUNDS:-8} --builds ${ADVISOR_BUILDS:-1} \
        --json "$OUT/advisor_gpu.json" 2>&1 | tee "$OUT/advisor_gpu.log" | tail -n 30
      wait $cpu_pid; tail -n 30 "$OUT/advisor_cpu.log" ;;
    schedule)  # the k for each band of batch sizes against a sweep of every k at each batch
      python3 benchmarks/advisor_schedule.py --device cuda --batches ${SCHEDULE_BATCHES:-1,4,16,32} \
        --ks 1,2,3,4,5,6,7,8 --start-k 4 --steps ${SCHEDULE_STEPS:-200} --rounds ${SCHEDULE_ROUNDS:-2} \
        --json "$OUT/advisor_schedule.json" 2>&1 | tee "$OUT/advisor_schedule.log" | tail -n 30 ;;
    recipes)
      python3 benchmarks/demo_recipes.py --jobs 8 --threads 2 --seeds 0 1 2 3 4 5 6 7 \
        --recipe shipped '{}' 2>&1 | tee "$OUT/demo_recipes.jsonl" ;;
  esac
done
