#!/usr/bin/env bash
# The specobs monitoring stack without Docker: Debian's `prometheus` and `prometheus-alertmanager`
# on loopback, loaded with the generated rules, scraping a running specobs endpoint.
# Run `scripts/stack-local.sh --help` for the options; docs/deploy.md for the whole picture.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/stack-local.sh [OPTIONS] [-- DEMO_ARGS...]

Start Prometheus (generated rules, exemplar storage) and Alertmanager on 127.0.0.1, scraping a
specobs /metrics endpoint (job "specobs"), print their URLs, and stop them on Ctrl-C or exit.
No Docker needed: the binaries come from Debian's packages
(apt-get install prometheus prometheus-alertmanager).

By default it scrapes an already running `specobs demo` (exporter on 127.0.0.1:9477); --demo
starts one itself.

Options:
  --target HOST:PORT        specobs endpoint to scrape; repeat for several
                            (default 127.0.0.1:9477, or $SPECOBS_STACK_TARGETS, comma-separated)
  --demo SECONDS            also run `specobs demo --duration SECONDS`, its exporter on the port
                            of the first --target; arguments after `--` go to it
  --prometheus-port PORT    Prometheus web/API port (default 9090)
  --alertmanager-port PORT  Alertmanager web/API port (default 9093)
  --no-alertmanager         run Prometheus only
  --scrape-interval DUR     scrape and rule evaluation interval (default 5s)
  --dir DIR                 keep config, TSDB and logs in DIR (default: a temporary directory,
                            removed on exit)
  -h, --help                show this help and exit

Examples:
  specobs demo & scripts/stack-local.sh
  scripts/stack-local.sh --demo 600
  scripts/stack-local.sh --target 127.0.0.1:9477 --target 10.0.0.7:9477 --dir /tmp/specobs-stack

Environment: PROMETHEUS, ALERTMANAGER override the binaries (default: `prometheus` and
`prometheus-alertmanager` or `alertmanager` from PATH).
EOF
}

die() {
    echo "stack-local.sh: $*" >&2
    exit 2
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TEMPLATE="$ROOT/deploy/prometheus/prometheus-local.yml"
RULES="$ROOT/deploy/prometheus/rules/specobs-rules.yml"
AM_CONFIG="$ROOT/deploy/alertmanager/alertmanager.yml"

targets=()
demo_seconds=""
demo_args=()
prometheus_port=9090
alertmanager_port=9093
with_alertmanager=1
scrape_interval=5s
state_dir=""

while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --target) (($# >= 2)) || die "--target needs HOST:PORT"; targets+=("$2"); shift 2 ;;
        --target=*) targets+=("${1#*=}"); shift ;;
        --demo) (($# >= 2)) || die "--demo needs SECONDS"; demo_seconds=$2; shift 2 ;;
        --demo=*) demo_seconds=${1#*=}; shift ;;
        --prometheus-port) (($# >= 2)) || die "--prometheus-port needs PORT"; prometheus_port=$2; shift 2 ;;
        --prometheus-port=*) prometheus_port=${1#*=}; shift ;;
        --alertmanager-port) (($# >= 2)) || die "--alertmanager-port needs PORT"; alertmanager_port=$2; shift 2 ;;
        --alertmanager-port=*) alertmanager_port=${1#*=}; shift ;;
        --no-alertmanager) with_alertmanager=0; shift ;;
        --scrape-interval) (($# >= 2)) || die "--scrape-interval needs a duration"; scrape_interval=$2; shift 2 ;;
        --scrape-interval=*) scrape_interval=${1#*=}; shift ;;
        --dir) (($# >= 2)) || die "--dir needs DIR"; state_dir=$2; shift 2 ;;
        --dir=*) state_dir=${1#*=}; shift ;;
        --) shift; demo_args=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

if ((${#targets[@]} == 0)); then
    IFS=, read -r -a targets <<<"${SPECOBS_STACK_TARGETS:-127.0.0.1:9477}"
fi
for t in "${targets[@]}"; do
    [[ $t =~ ^[A-Za-z0-9._-]+:[0-9]{1,5}$ ]] \
        || die "--target expects HOST:PORT such as 127.0.0.1:9477, got '$t'"
done
for p in "$prometheus_port" "$alertmanager_port"; do
    [[ $p =~ ^[0-9]{1,5}$ ]] && ((p > 0 && p < 65536)) || die "a port must be 1-65535, got '$p'"
done
[[ $scrape_interval =~ ^([0-9]+(ms|s|m|h))+$ ]] \
    || die "--scrape-interval expects a Prometheus duration such as 5s, got '$scrape_interval'"
[[ -z $demo_seconds || $demo_seconds =~ ^[0-9]+([.][0-9]+)?$ ]] \
    || die "--demo expects SECONDS, got '$demo_seconds'"
((${#demo_args[@]} == 0)) || [[ -n $demo_seconds ]] || die "arguments after -- are for --demo"

PROMETHEUS=${PROMETHEUS:-$(command -v prometheus || true)}
[[ -n $PROMETHEUS ]] || die "prometheus not found; install it: apt-get install prometheus"
if ((with_alertmanager)); then
    ALERTMANAGER=${ALERTMANAGER:-$(command -v prometheus-alertmanager || command -v alertmanager || true)}
    [[ -n $ALERTMANAGER ]] \
        || die "alertmanager not found; apt-get install prometheus-alertmanager, or --no-alertmanager"
fi
if [[ -n $demo_seconds ]]; then
    command -v specobs >/dev/null || die "--demo needs the specobs command: pip install -e '.[demo]'"
fi
[[ -f $RULES ]] || die "$RULES is missing; run: specobs generate"

own_dir=0
if [[ -z $state_dir ]]; then
    state_dir=$(mktemp -d "${TMPDIR:-/tmp}/specobs-stack.XXXXXX")
    own_dir=1
fi
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)

pids=()
names=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    local i
    for i in "${!pids[@]}"; do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
    done
    for i in "${!pids[@]}"; do
        # Prometheus flushes its head block on SIGTERM; give it a moment, then insist.
        local waited=0
        while kill -0 "${pids[$i]}" 2>/dev/null && ((waited < 100)); do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        wait "${pids[$i]}" 2>/dev/null || true
    done
    if ((${#pids[@]})); then
        echo "stack-local.sh: stopped ${names[*]}"
    fi
    if ((own_dir)); then
        rm -rf "$state_dir"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() { # name logfile argv...
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 &
    pids+=("$!")
    names+=("$name")
}

fail_with_log() { # message logfile
    echo "stack-local.sh: $1; last lines of $2:" >&2
    tail -n 30 "$2" >&2 || true
    exit 1
}

wait_ready() { # name pid url logfile
    local deadline=$((SECONDS + 60))
    until curl -fs -o /dev/null --max-time 2 "$3"; do
        kill -0 "$2" 2>/dev/null || fail_with_log "$1 exited during start-up" "$4"
        ((SECONDS < deadline)) || fail_with_log "$1 not ready at $3 after 60s" "$4"
        sleep 0.2
    done
}

# -- Prometheus config: the checked-in template with its marked lines rewritten ------------------
target_list=$(printf '"%s", ' "${targets[@]}")
target_list="[${target_list%, }]"
config="$state_dir/prometheus.yml"
sed -E \
    -e "s|^( *scrape_interval: ).*(# stack-local.sh: --scrape-interval)$|\1${scrape_interval}  \2|" \
    -e "s|^( *scrape_timeout: ).*(# stack-local.sh: --scrape-interval)$|\1${scrape_interval}  \2|" \
    -e "s|^( *evaluation_interval: ).*(# stack-local.sh: --scrape-interval)$|\1${scrape_interval}  \2|" \
    -e "s|^( *- ).*(# stack-local.sh: absolute path of the generated rules)$|\1${RULES}  \2|" \
    -e "s|^( *- targets: ).*(# stack-local.sh: --alertmanager-port)$|\1[\"127.0.0.1:${alertmanager_port}\"]  \2|" \
    -e "s|^( *- targets: ).*(# stack-local.sh: --target \(repeatable\))$|\1${target_list}  \2|" \
    "$TEMPLATE" >"$config"
# Every marked line must have been rewritten, or the template and this script have drifted apart.
for expected in "${scrape_interval}  # stack-local.sh: --scrape-interval" \
    "${RULES}  # stack-local.sh: absolute" \
    "127.0.0.1:${alertmanager_port}\"]  # stack-local.sh: --alertmanager-port" \
    "${target_list}  # stack-local.sh: --target"; do
    grep -qF -- "$expected" "$config" \
        || die "could not rewrite $TEMPLATE (looked for: $expected); the template changed?"
done
if ((!with_alertmanager)); then
    # No Alertmanager: drop the alerting block so Prometheus does not retry a dead address.
    sed -i '/^alerting:/,/^$/d' "$config"
fi
if command -v promtool >/dev/null; then
    promtool check config "$config" >"$state_dir/promtool.log" 2>&1 \
        || fail_with_log "the Prometheus config does not check" "$state_dir/promtool.log"
fi

# -- start --------------------------------------------------------------------------------------
if ((with_alertmanager)); then
    # --cluster.listen-address= : no gossip port (it would bind 0.0.0.0:9094).
    start alertmanager "$state_dir/alertmanager.log" "$ALERTMANAGER" \
        --config.file="$AM_CONFIG" \
        --storage.path="$state_dir/alertmanager" \
        --web.listen-address="127.0.0.1:$alertmanager_port" \
        --cluster.listen-address=
    wait_ready alertmanager "${pids[-1]}" "http://127.0.0.1:$alertmanager_port/-/ready" \
        "$state_dir/alertmanager.log"
fi

start prometheus "$state_dir/prometheus.log" "$PROMETHEUS" \
    --config.file="$config" \
    --storage.tsdb.path="$state_dir/data" \
    --web.listen-address="127.0.0.1:$prometheus_port" \
    --enable-feature=exemplar-storage \
    --web.enable-lifecycle
prometheus_pid=${pids[-1]}
wait_ready prometheus "$prometheus_pid" "http://127.0.0.1:$prometheus_port/-/ready" \
    "$state_dir/prometheus.log"

if [[ -n $demo_seconds ]]; then
    demo_port=${targets[0]##*:}
    SPECOBS_PROMETHEUS_PORT=$demo_port SPECOBS_PROMETHEUS_ADDR=127.0.0.1 \
        start demo "$state_dir/demo.log" specobs demo --duration "$demo_seconds" "${demo_args[@]}"
fi

cat <<EOF
specobs local stack is up (Ctrl-C stops it)
  Prometheus    http://127.0.0.1:$prometheus_port   (targets: /targets, rules: /rules, alerts: /alerts)
EOF
if ((with_alertmanager)); then
    echo "  Alertmanager  http://127.0.0.1:$alertmanager_port"
fi
echo "  scraping      ${targets[*]} (job \"specobs\", every $scrape_interval)"
if [[ -n $demo_seconds ]]; then
    echo "  demo          specobs demo --duration $demo_seconds (log: $state_dir/demo.log)"
fi
echo "  state         $state_dir$( ((own_dir)) && echo ' (removed on exit)')"
echo "  try           specobs top http://${targets[0]}/metrics"

# -- run until Ctrl-C, or until Prometheus or Alertmanager dies -----------------------------------
while true; do
    wait -n "${pids[@]}" 2>/dev/null || true
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            if [[ ${names[$i]} == demo ]]; then
                echo "stack-local.sh: the demo finished; Prometheus keeps running until Ctrl-C"
                unset 'pids[i]' 'names[i]'
            else
                fail_with_log "${names[$i]} exited" "$state_dir/${names[$i]}.log"
            fi
        fi
    done
done
