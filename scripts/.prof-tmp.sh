#!/usr/bin/env bash
# Instructions Hourglass executes per non-streaming request and per streamed chunk, counted by
# valgrind's callgrind: deterministic, so two builds can be compared on a noisy machine where
# wall-clock numbers move by 30% between runs (see BENCHMARKS.md).
#
#   scripts/bench-instructions.sh                 # the release build of this tree
#   scripts/bench-instructions.sh path/to/hourglass [another/hourglass ...]   # A/B
#
# Each figure is the difference of two runs of the same gateway (N1 and N2 requests, or
# streams of C1 and C2 chunks), so start-up and shutdown cancel out. User-space
# instructions only: the syscalls themselves are the same per request as nginx's.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/gateway-run.sh
need valgrind valgrind
binaries "$@"
fake_and_route "${bins[0]}" 60s
# One keep-alive connection, requests one after another; every answer is checked. With a
# fourth argument, a new connection for each request (what a new stream costs).
cat >"$work/client.py" <<'EOF'
import http.client, json, sys
port, n, chunks = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fresh = len(sys.argv) > 4
c = http.client.HTTPConnection("127.0.0.1", port)
body = json.dumps({"model": "m", "stream": chunks > 0, "messages": [{"role": "user", "content": "hi"}]})
headers = {"content-type": "application/json", "x-fake-headers-first": "1"}
if chunks:
    headers.update({"x-fake-chunks": str(chunks), "x-fake-interval-ms": "0"})
for _ in range(n):
    if fresh:
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    data = r.read()
    assert r.status == 200, (r.status, data[:200])
EOF
# Total instructions of one gateway process serving N requests of C chunks (0: not streamed).
count() {
  local bin=$1 n=$2 chunks=$3 fresh=${4:-} out="$work/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --config "$work/hourglass.toml" \
    --workers 1 --log-format json >"$work/gateway.log" 2>&1 &
  local vg=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$admin_port/healthz" && break
    sleep 0.2
  done
  python3 "$work/client.py" "$gw_port" "$n" "$chunks" $fresh
  kill -INT "$vg"
  wait "$vg" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
for bin in "${bins[@]}"; do
  count "$bin" 1200 0 >/dev/null; cp "$work/callgrind.out" /tmp/cg-$(basename $bin).out
done
