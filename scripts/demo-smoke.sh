#!/usr/bin/env bash
# Runs the README's first command and a few of its walk-through requests against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/debug/hourglass
cargo build --quiet
log=$(mktemp)
"$bin" demo >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do curl -sf localhost:9090/readyz >/dev/null && break; sleep 0.1; done
fail=0; pass=0
check() { if eval "$2"; then pass=$((pass+1)); echo "ok: $1"; else fail=$((fail+1)); echo "FAILED: $1"; fi; }
out=$(curl -sN localhost:8080/v1/chat/completions -H 'x-fake-chunks: 3' -d '{"model":"demo","stream":true}')
check "stream ends with [DONE]" '[[ "$out" == *"data: [DONE]"* ]]'
out=$(curl -sN localhost:8080/v1/chat/completions -H 'x-fake-freeze-after: 2' -d '{"model":"demo","stream":true}')
check "frozen stream gets idle_timeout event" '[[ "$out" == *"event: error"*"idle_timeout"* ]]'
code=$(curl -s -o /dev/null -w '%{http_code}' localhost:8080/v1/chat/completions -H 'x-request-budget-ms: 1' -d '{}')
check "budget of 1 ms fails fast with 504" '[[ "$code" == 504 ]]'
metrics=$(curl -s localhost:9090/metrics)
check "metrics count the idle cancellation" '[[ "$metrics" == *"hourglass_cancellations_total{origin=\"idle\",route=\"chat\"} 1"* ]]'
echo "demo: $pass passed, $fail failed"
if [ "$fail" -ne 0 ]; then
  echo "--- the gateway's output:"
  cat "$log"
  exit 1
fi
