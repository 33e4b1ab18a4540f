#!/usr/bin/env bash
# Makes docs/dashboard.png: runs the fake provider, a gateway with the demo's routes (and one
# with a retry and a fallback) and a real Prometheus (scraping every second) on free loopback
# ports, sends DASHBOARD_LOAD_SECONDS (default 120) of varied traffic with
# scripts/dashboard-load.py (config reloads and the fallback's primary going down included),
# then draws every panel of the Grafana dashboard from that Prometheus with
# scripts/dashboard-png.py (matplotlib, from PyPI into
# ${HOURGLASS_DASHBOARD_VENV:-target/dashboard-venv}), which fails if a panel shows no data or
# only zeros. Uses the release build (HOURGLASS_PROFILE=debug or HOURGLASS_BIN=PATH to change).
# Stops everything it started.
#   bash scripts/dashboard-png.sh [OUT_PNG]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/hourglass-stack.sh"
cd "$STACK_ROOT"
OUT="${1:-docs/dashboard.png}"
VENV="${HOURGLASS_DASHBOARD_VENV:-target/dashboard-venv}"
SECONDS_OF_LOAD="${DASHBOARD_LOAD_SECONDS:-120}"
export HOURGLASS_PROFILE="${HOURGLASS_PROFILE:-release}"
STACK_ON_EXIT=dashboard_on_exit
dashboard_on_exit() { [ "$1" -eq 0 ] || stack_show_logs; }
stack_init
started=$SECONDS

if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check 'matplotlib>=3.8,<4'
fi
ensure_prometheus
build_hourglass
# Route chat-ha's primary upstream: dashboard-load.py runs a fake provider there and takes it
# down for the incident third (retries and fallbacks); it also edits the gateway's config
# (reloads, one with an error).
PRIMARY="127.0.0.1:$(free_ports 1)"
with_fallback_route "$PRIMARY"
start_gateway
start_prometheus 1s
echo "gateway http://$GW, admin http://$ADMIN, Prometheus http://$PROM; ${SECONDS_OF_LOAD}s of traffic"
python3 scripts/dashboard-load.py "$GW" "$SECONDS_OF_LOAD" "$WORK/phases.json" \
    --config "$WORK/gateway.toml" --primary "$BIN" "$PRIMARY"
sleep 3 # the last scrape
mkdir -p "$(dirname "$OUT")"
# The demo's runs live in the memory store, which never fails: that panel may read zero.
"$VENV/bin/python" scripts/dashboard-png.py "$PROM" "$WORK/phases.json" "$OUT" --zero-ok "Run store errors"
echo "dashboard-png: took $((SECONDS - started))s"
