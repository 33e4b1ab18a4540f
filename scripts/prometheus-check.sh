#!/usr/bin/env bash
# Hourglass against a real Prometheus (Debian's package, installed when absent):
#   1. the fake provider and a gateway with the demo's routes (and one with a retry and a
#      fallback, so that every series the dashboard reads exists) on free loopback ports;
#   2. a few requests: a stream, a frozen stream cut by the idle limit, bad budgets;
#   3. `promtool check metrics` on a live scrape of /metrics, `promtool check config` on
#      docker/prometheus.yml (the compose setup's);
#   4. a real Prometheus scraping the admin listener; metrics queried back over its HTTP API;
#   5. every query of the Grafana dashboard evaluated by that Prometheus.
# Run from anywhere: `bash scripts/prometheus-check.sh`. Uses the debug build (what `cargo test`
# already built; HOURGLASS_PROFILE=release or HOURGLASS_BIN=PATH to change). Every process it
# starts is stopped on exit; every wait is bounded. Last line: `prometheus: N passed, M failed`,
# exit status 0 only when M is 0.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/hourglass-stack.sh"
cd "$STACK_ROOT"

pass=0
fail=0
reported=0
check() { # check NAME CONDITION [DETAIL]
    if eval "$2"; then
        pass=$((pass + 1))
        echo "ok: $1"
    else
        fail=$((fail + 1))
        echo "FAILED: $1"
        [ -z "${3:-}" ] || printf '%s\n' "$3" | sed 's/^/    /'
    fi
}
on_exit() {
    if [ "$reported" -eq 0 ]; then
        echo "prometheus: setup failed (exit $1)" >&2
        stack_show_logs
        echo "prometheus: $pass passed, $((fail + 1)) failed"
    fi
}
STACK_ON_EXIT=on_exit
stack_init
started=$SECONDS

ensure_prometheus
promtool --version 2>&1 | head -n 1
build_started=$SECONDS
build_hourglass
echo "hourglass built in $((SECONDS - build_started))s: $BIN"
# Its primary upstream is a port nothing listens on; no request here asks for its models.
with_fallback_route "127.0.0.1:$(free_ports 1)"
start_gateway
echo "gateway http://$GW, admin http://$ADMIN, fake provider http://$FAKE"

# --- traffic: the frozen stream takes the idle limit (2s in config/demo.toml); run it aside.
url="http://$GW/v1/chat/completions"
curl -sN -m 15 "$url" -H 'x-fake-freeze-after: 2' -d '{"model":"demo","stream":true}' >"$WORK/frozen.out" &
frozen_pid=$!
out=$(curl -sN -m 10 "$url" -H 'x-fake-chunks: 3' -d '{"model":"demo","stream":true}')
check "a stream ends with [DONE]" '[[ "$out" == *"data: [DONE]"* ]]'
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$url" -H 'x-request-budget-ms: abc' -d '{}')
check "a malformed budget is refused with 400" '[ "$code" = 400 ]'
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$url" -H 'x-request-budget-ms: 1' -d '{}')
check "a 1 ms budget fails fast with 504" '[ "$code" = 504 ]'
wait "$frozen_pid" || true
check "a frozen stream is cut with an idle_timeout event" \
    'grep -q "idle_timeout" "$WORK/frozen.out"' "$(tail -c 400 "$WORK/frozen.out")"

# --- promtool on a live scrape, and on the compose setup's Prometheus config.
curl -sf -m 5 "http://$ADMIN/metrics" >"$WORK/metrics.txt"
lint=$(promtool check metrics <"$WORK/metrics.txt" 2>&1) && lint_rc=0 || lint_rc=$?
check "promtool check metrics: a live scrape of /metrics is clean" '[ "$lint_rc" = 0 ] && [ -z "$lint" ]' "$lint"
cfg=$(promtool check config docker/prometheus.yml 2>&1) && cfg_rc=0 || cfg_rc=$?
check "promtool check config docker/prometheus.yml" '[ "$cfg_rc" = 0 ]' "$cfg"

# --- a real Prometheus scraping the admin listener.
if start_prometheus 1s; then prom_up=1; else prom_up=0; fi
check "Prometheus on http://$PROM scrapes the admin listener (up == 1)" '[ "$prom_up" = 1 ]'
idle=""
if [ "$prom_up" = 1 ]; then
    for _ in $(seq 100); do # the first scrape may predate the frozen stream's end: up to 10 s
        idle=$(prom_value 'sum(hourglass_cancellations_total{origin="idle"})' || true)
        [ -n "$idle" ] && [ "${idle%%.*}" -ge 1 ] && break
        sleep 0.1
    done
fi
check "queried back: sum(hourglass_cancellations_total{origin=\"idle\"}) = ${idle:-nothing} >= 1" \
    '[ -n "$idle" ] && [ "${idle%%.*}" -ge 1 ]'
errors=$(prom_value 'sum(hourglass_requests_total{outcome="error"})' || true)
check "queried back: sum(hourglass_requests_total{outcome=\"error\"}) = ${errors:-nothing} >= 1" \
    '[ -n "$errors" ] && [ "${errors%%.*}" -ge 1 ]'
fast=$(prom_value 'sum(hourglass_cancellations_total{origin="insufficient_budget"})' || true)
check "queried back: sum(hourglass_cancellations_total{origin=\"insufficient_budget\"}) = ${fast:-nothing} >= 1" \
    '[ -n "$fast" ] && [ "${fast%%.*}" -ge 1 ]'
ttft=$(prom_value 'sum(hourglass_time_to_first_token_seconds_count{route="chat"})' || true)
check "queried back: time-to-first-token count on route chat = ${ttft:-nothing} >= 2" \
    '[ -n "$ttft" ] && [ "${ttft%%.*}" -ge 2 ]'

# --- the dashboard's queries, against the data just scraped (rate() needs two samples).
if [ "$prom_up" = 1 ]; then sleep 2; fi
dq=$(python3 scripts/dashboard-queries.py check "$PROM" "$WORK/metrics.txt" 2>&1) && dq_rc=0 || dq_rc=$?
printf '%s\n' "$dq" | grep -E '^FAILED|^    |^dashboard queries' || true
check "every Grafana dashboard query is valid PromQL, reads metrics this Hourglass exports and returns data" \
    '[ "$dq_rc" = 0 ]'

reported=1
echo "prometheus: took $((SECONDS - started))s"
echo "prometheus: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
