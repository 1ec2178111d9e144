#!/usr/bin/env bash
# Does `specobs demo --device cuda` exit 0 after its summary, cold and warm? (issue 16, item 9:
# a cold-cache run used to end with "terminate called without an active exception", status 134.)
# Two runs on a fresh, empty SPECOBS_CACHE_DIR (the draft head trains in a background thread;
# the second cold run uses its own empty directory too), then one warm run on the first run's
# cache. Each run is bounded by `timeout` (first-run training included); prints each exit status.
#   bash benchmarks/diag/gpu_exit.sh            # from the repository root, on the GPU machine
set -u
DURATION=${DURATION:-20}
LIMIT=${LIMIT:-420}
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-.}
status=0
run() {  # label cache_dir port metrics_port
    local log
    log=$(mktemp)
    SPECOBS_CACHE_DIR=$2 timeout -k 10 "$LIMIT" "$PY" -m specobs.cli demo --device cuda \
        --duration "$DURATION" --plain --port "$3" --metrics-port "$4" >"$log" 2>&1
    local rc=$?
    local aborts
    aborts=$(grep -c "terminate called" "$log")
    echo "$1: exit status $rc, 'terminate called' lines: $aborts"
    tail -n 4 "$log" | sed 's/^/    /'
    [ "$rc" -eq 0 ] && [ "$aborts" -eq 0 ] || status=1
    rm -f "$log"
}
cold1=$(mktemp -d)
cold2=$(mktemp -d)
run "cold run 1" "$cold1" 18101 19501
run "cold run 2" "$cold2" 18102 19502
run "warm run  " "$cold1" 18103 19503
rm -rf "$cold1" "$cold2"
echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
