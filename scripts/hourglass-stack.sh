# Sourced by scripts/prometheus-check.sh and scripts/dashboard-png.sh: runs the fake provider,
# a gateway with the demo's routes and a real Prometheus scraping it, all on free loopback
# ports, and stops every process it started when the calling script exits.
#
#   source scripts/hourglass-stack.sh
#   stack_init                      # temp dir, exit trap
#   ensure_prometheus               # apt-get install prometheus when promtool/prometheus are absent
#   build_hourglass                 # sets BIN (debug build; HOURGLASS_PROFILE=release for release)
#   with_fallback_route ADDR        # optional: the next gateway also has route chat-ha, see below
#   start_gateway                   # sets GW ADMIN FAKE (host:port)
#   start_prometheus 1s             # sets PROM (host:port); scrapes ADMIN at that interval
#   prom_query 'EXPR'               # prints the API's JSON answer of an instant query
#
# Every wait is bounded. Logs are in $WORK (printed by stack_show_logs on failure).

STACK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_PIDS=()
WORK=""

stack_init() {
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/hourglass-stack.XXXXXX")"
    trap stack_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# Stops the processes this script started (and only those), newest first.
stack_stop_all() {
    local i pid
    for ((i = ${#STACK_PIDS[@]} - 1; i >= 0; i--)); do
        pid="${STACK_PIDS[$i]}"
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${STACK_PIDS[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    STACK_PIDS=()
}

stack_cleanup() {
    local rc=$?
    trap - EXIT
    stack_stop_all
    if [ -n "${STACK_ON_EXIT:-}" ]; then "$STACK_ON_EXIT" "$rc" || true; fi
    [ -n "$WORK" ] && [ -z "${KEEP_WORK:-}" ] && rm -rf "$WORK"
    exit "$rc"
}

stack_show_logs() {
    local f
    for f in "$WORK"/*.log; do
        [ -s "$f" ] || continue
        echo "---- last lines of $(basename "$f") ----" >&2
        tail -n 30 "$f" >&2
    done
}

# Starts a command in the background with its output in $WORK/NAME.log and remembers its pid.
start_bg() {
    local name="$1"
    shift
    "$@" >"$WORK/$name.log" 2>&1 &
    STACK_PIDS+=("$!")
}

# Prints N ports that were free a moment ago (bound to port 0 on 127.0.0.1, then released).
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# wait_http URL SECONDS: until URL answers 2xx, at most SECONDS.
wait_http() {
    local deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        curl -sf -m 2 -o /dev/null "$1" && return 0
        sleep 0.1
    done
    return 1
}

ensure_prometheus() {
    if command -v promtool >/dev/null && command -v prometheus >/dev/null; then return 0; fi
    echo "installing Prometheus from Debian's packages" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >&2
    command -v promtool >/dev/null && command -v prometheus >/dev/null
}

build_hourglass() {
    local profile="${HOURGLASS_PROFILE:-debug}" target="${CARGO_TARGET_DIR:-$STACK_ROOT/target}"
    if [ -n "${HOURGLASS_BIN:-}" ]; then
        BIN="$HOURGLASS_BIN"
        return 0
    fi
    if [ "$profile" = release ]; then
        (cd "$STACK_ROOT" && cargo build --quiet --release --bin hourglass)
    else
        (cd "$STACK_ROOT" && cargo build --quiet --bin hourglass)
    fi
    BIN="$target/$profile/hourglass"
    [ -x "$BIN" ]
}

# with_fallback_route ADDR: the gateway start_gateway starts also has route "chat-ha" (requests
# for "ha-*" models on /v1/chat/completions, ahead of the demo's routes): upstream "primary" at
# ADDR, one retry, then a fallback to the demo's "fake". So the retry and fallback series exist,
# and taking ADDR down (nothing listening there) makes every such request retry and fall back.
# Also route "chat-teams" ("team-*" models), whose clients need keys.
with_fallback_route() {
    # Route "chat-teams" asks clients for keys; the file names their clients (team-b's two
    # keys: one replacing the other). The keys are only this throwaway stack's.
    printf '%s\n' 'team-a stack-key-team-a-0001' 'team-b stack-key-team-b-0001' \
        'team-b stack-key-team-b-0002' >"$WORK/team-keys"
    chmod 600 "$WORK/team-keys"
    cat >"$WORK/extra-routes.toml" <<EOF
# Added by scripts/hourglass-stack.sh (with_fallback_route).
[[routes]]
name = "chat-teams"
path_prefix = "/v1/chat/completions"
models = ["team-*"]
upstream = "fake"
client_keys_file = "$WORK/team-keys"

[upstreams.primary]
url = "http://$1"
auth = "none"

[[routes]]
name = "chat-ha"
path_prefix = "/v1/chat/completions"
models = ["ha-*"]
upstream = "primary"
retries = 1
fallbacks = ["fake"]

EOF
}

# The fake provider and a gateway serving config/demo.toml (the routes `hourglass demo` runs),
# moved to free ports so nothing else on the machine (a demo, a test) is in the way.
start_gateway() {
    local ports gp ap fp
    ports="$(free_ports 3)"
    read -r gp ap fp <<<"$ports"
    GW="127.0.0.1:$gp" ADMIN="127.0.0.1:$ap" FAKE="127.0.0.1:$fp"
    sed -e "s/127\.0\.0\.1:8080/$GW/; s/127\.0\.0\.1:9090/$ADMIN/; s/127\.0\.0\.1:8089/$FAKE/" \
        "$STACK_ROOT/config/demo.toml" >"$WORK/gateway.toml"
    local addr
    for addr in "$GW" "$ADMIN" "$FAKE"; do
        grep -q "$addr" "$WORK/gateway.toml" || {
            echo "config/demo.toml no longer has the addresses this script moves" >&2
            return 1
        }
    done
    if [ -f "$WORK/extra-routes.toml" ]; then
        # Before the first route: routes match in file order.
        python3 - "$WORK/gateway.toml" "$WORK/extra-routes.toml" <<'EOF'
import sys
path, extra = sys.argv[1], open(sys.argv[2]).read()
text = open(path).read()
at = text.index("[[routes]]")
open(path, "w").write(text[:at] + extra + text[at:])
EOF
    fi
    start_bg fake "$BIN" fake-upstream --listen "$FAKE"
    start_bg gateway "$BIN" --config "$WORK/gateway.toml" ${HOURGLASS_LOG_FORMAT:+--log-format "$HOURGLASS_LOG_FORMAT"}
    wait_http "http://$FAKE/v1/models" 20 && wait_http "http://$ADMIN/readyz" 20
}

# start_prometheus INTERVAL: a real Prometheus on a free loopback port with a throwaway TSDB,
# scraping the gateway's admin listener every INTERVAL. Waits until it has scraped once.
start_prometheus() {
    local interval="$1" pp
    pp="$(free_ports 1)"
    PROM="127.0.0.1:$pp"
    cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: $interval
  evaluation_interval: $interval
scrape_configs:
  - job_name: hourglass
    static_configs:
      - targets: ["$ADMIN"]
EOF
    start_bg prometheus prometheus --config.file="$WORK/prometheus.yml" \
        --storage.tsdb.path="$WORK/tsdb" --web.listen-address="$PROM" --log.level=warn
    wait_http "http://$PROM/-/ready" 30 || return 1
    local deadline=$((SECONDS + 30))
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ "$(prom_value 'up{job="hourglass"}')" = 1 ] && return 0
        sleep 0.2
    done
    return 1
}

# prom_query EXPR [EXTRA curl args]: the JSON answer of the HTTP API's instant query.
prom_query() {
    local expr="$1"
    shift
    curl -sf -m 5 "http://$PROM/api/v1/query" --data-urlencode "query=$expr" "$@"
}

# prom_value EXPR: the value of the first sample of an instant query, or nothing.
prom_value() {
    prom_query "$1" | python3 -c '
import json, sys
try:
    r = json.load(sys.stdin)["data"]["result"]
    print(r[0]["value"][1] if r else "")
except Exception:
    print("")' 2>/dev/null
}
