#!/usr/bin/env bash
# Runs the README's first command and a few of its walk-through requests against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/debug/hourglass
cargo build --quiet
# Another process on the demo's ports (a demo left running) would answer in its place,
# ready before this one has even tried to bind: refused before the demo starts.
for port in 8080 8089 9090; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is already in use: the demo needs 8080, 8089 and 9090 free"
    exit 1
  fi
done
log=$(mktemp)
"$bin" demo >"$log" 2>&1 &
pid=$!
held=$(mktemp)
trap 'kill $pid 2>/dev/null || true; rm -f "$log" "$held"' EXIT
for _ in $(seq 100); do curl -sf localhost:9090/readyz >/dev/null && break; sleep 0.1; done
if ! kill -0 $pid 2>/dev/null; then
  echo "the demo exited before serving (are ports 8080, 8089 and 9090 free?):"
  cat "$log"
  exit 1
fi
fail=0; pass=0
check() { if eval "$2"; then pass=$((pass+1)); echo "ok: $1"; else fail=$((fail+1)); echo "FAILED: $1"; fi; }
out=$(curl -sN localhost:8080/v1/chat/completions -H 'x-fake-chunks: 3' -d '{"model":"demo","stream":true}')
check "stream ends with [DONE]" '[[ "$out" == *"data: [DONE]"* ]]'
out=$(curl -sN localhost:8080/v1/chat/completions -H 'x-fake-freeze-after: 2' -d '{"model":"demo","stream":true}')
check "frozen stream gets idle_timeout event" '[[ "$out" == *"event: error"*"idle_timeout"* ]]'
out=$(curl -sN localhost:8080/v1/responses -H 'x-fake-chunks: 3' -d '{"model":"demo","input":"hi","stream":true}')
check "Responses API stream ends with response.completed" '[[ "$out" == "event: response.created"*"response.output_text.delta"*"event: response.completed"* ]]'
out=$(curl -s localhost:8080/v1/responses -d '{"model":"demo","input":"hi"}')
check "Responses API answer is a response object" '[[ "$out" == *"\"object\":\"response\""*"\"status\":\"completed\""* ]]'
code=$(curl -s -o /dev/null -w '%{http_code}' localhost:8080/v1/chat/completions -H 'x-request-budget-ms: 1' -d '{}')
check "budget of 1 ms fails fast with 504" '[[ "$code" == 504 ]]'
out=$(curl -s -D - localhost:8080/v1/chat/completions -H 'x-fake-freeze-after: 2' -d '{"model":"demo"}')
check "a frozen non-streaming call is cut by the idle limit, with what came" '[[ "$out" == *"x-hourglass-partial: idle_timeout"*"\"finish_reason\":\"length\""* ]]'
hdrs=$(curl -s -D - -o /dev/null localhost:8080/v1/chat/completions -H 'x-request-budget-ms: 1500' -H 'x-fake-chunks: 600' -H 'x-fake-interval-ms: 100' -d '{"model":"demo"}')
check "a deadline mid-answer gives a partial answer" '[[ "$hdrs" == *"x-hourglass-partial: deadline_exceeded"* ]]'
for i in 1 2 3; do
  curl -s localhost:8080/v1/chat/completions -H 'x-run-id: smoke-loop' -H 'x-fake-tool-call: get_weather' -d "{\"model\":\"demo\",\"user\":\"$i\"}" >/dev/null
done
out=$(curl -s localhost:8080/v1/chat/completions -H 'x-run-id: smoke-loop' -H 'x-fake-tool-call: get_weather' -d '{"model":"demo","user":"4"}')
check "the fourth same tool call of a run is refused as a loop" '[[ "$out" == *"\"code\":\"run_loop_detected\""* ]]'
curl -sN localhost:8080/v1/chat/completions -H 'x-fake-chunks: 10' -H 'x-fake-interval-ms: 50' -d '{"model":"demo","stream":true}' >"$held" &
held_pid=$!
sleep 0.2
kill -HUP $pid
wait $held_pid || true
check "a SIGHUP leaves the demo serving, its stream whole" '[[ "$(cat "$held")" == *"data: [DONE]"* ]] && kill -0 $pid && grep -q "no config file to reload" "$log"'
metrics=$(curl -s localhost:9090/metrics)
check "metrics count the idle cancellations" '[[ "$metrics" == *"hourglass_cancellations_total{origin=\"idle\",route=\"chat\"} 2"* ]]'
check "metrics count the loop refusal" '[[ "$metrics" == *"hourglass_run_refusals_total{reason=\"loop\",route=\"chat\"} 1"* ]]'
echo "demo: $pass passed, $fail failed"
if [ "$fail" -ne 0 ]; then
  echo "--- the gateway's output:"
  cat "$log"
  exit 1
fi
