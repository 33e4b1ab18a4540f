#!/usr/bin/env bash
# What the features of one request cost the gateway, counted by callgrind (instructions: the
# same for the same binary and inputs however busy the machine is) and, for the shared run
# store, timed on loopback:
#   - a call of an agent run (x-run-id, with run limits), on the memory store and on Redis;
#   - a non-streaming call on a route with stream_upstream (the stream assembled into the
#     document) against the same call passed through.
# Each figure is the difference of two runs of the same gateway (N1 and N2 requests), so
# start-up and shutdown cancel out.
#
#   scripts/bench-features.sh [path/to/hourglass]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/gateway-run.sh
need valgrind valgrind
need redis-server redis-server
binaries "$@"
bin=${bins[0]}
redis_port=$(port)
"$bin" fake-upstream --listen "127.0.0.1:$fake_port" >/dev/null 2>&1 &
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
config() { # $1: the [runs] store
  cat <<TOML
[server]
listen = "127.0.0.1:$gw_port"
admin_listen = "127.0.0.1:$admin_port"
shutdown_grace = "1s"
[runs]
store = "$1"
store_timeout = "1s"
[defaults]
budget = "60s"
[upstreams.fake]
url = "http://127.0.0.1:$fake_port"
[[routes]]
name = "assembled"
path_prefix = "/v1/chat/completions"
models = ["assembled"]
upstream = "fake"
stream_upstream = true
[[routes]]
name = "basic"
path_prefix = "/v1/chat/completions"
models = ["basic"]
upstream = "fake"
run_max_calls = 1000000
run_budget = "1h"
[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
run_max_calls = 1000000
run_max_tokens = 1000000000
run_max_repeats = 1000
run_budget = "1h"
TOML
}
config memory >"$work/memory.toml"
config "redis://127.0.0.1:$redis_port/0" >"$work/redis.toml"
# One keep-alive connection, requests one after another; every answer is checked. $4: a run
# id for every request (each its own body, as an agent's grow), or "-" for none.
cat >"$work/client.py" <<'PY'
import http.client, json, sys, time
port, n, model, run = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port)
lat = []
for i in range(n):
    body = json.dumps({"model": model, "user": f"turn {i}", "messages": [{"role": "user", "content": "hi"}]})
    headers = {"content-type": "application/json", "x-fake-chunks": "5", "x-fake-interval-ms": "0"}
    if run != "-":
        headers["x-run-id"] = run
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    data = r.read()
    lat.append(time.perf_counter() - t)
    assert r.status == 200, (r.status, data[:300])
lat.sort()
print(f"{lat[len(lat)//2]*1e6:.0f} {lat[int(len(lat)*0.99)]*1e6:.0f}")
PY
wait_ready() {
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$admin_port/healthz" && return; sleep 0.2; done
  echo "the gateway did not start" >&2; exit 1
}
# Instructions of one gateway process serving N requests ($1 config, $2 N, $3 model, $4 run).
count() {
  local out="$work/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --config "$1" \
    --workers 1 --log-format json >"$work/gateway.log" 2>&1 &
  local vg=$!
  wait_ready
  python3 "$work/client.py" "$gw_port" "$2" "$3" "$4" >/dev/null
  kill -INT "$vg"; wait "$vg" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
per_request() { # config model run
  local a b
  a=$(count "$1" 200 "$2" "$3"); b=$(count "$1" 1200 "$2" "$3")
  echo $(((b - a) / 1000))
}
# Latency on the real binary (no valgrind): p50 and p99 of 2000 calls after 200 to warm up.
latency() { # config model run
  "$bin" --config "$1" --workers 1 --log-format json >/dev/null 2>&1 &
  local gw=$!
  wait_ready
  python3 "$work/client.py" "$gw_port" 200 "$2" "$3" >/dev/null
  python3 "$work/client.py" "$gw_port" 2000 "$2" "$3"
  kill -INT "$gw"; wait "$gw" || true
}
printf '%-52s %14s\n' "non-streaming request (5 tokens)" "instructions"
plain=$(per_request "$work/memory.toml" m -)
printf '%-52s %14d\n' "no run" "$plain"
pct() { python3 -c "print(f'{($1-$2)/$2*100:+.1f}%')"; }
basic=$(per_request "$work/memory.toml" basic run-b)
printf '%-52s %14d  (%s)\n' "a call of a run: calls and deadline, memory store" "$basic" "$(pct "$basic" "$plain")"
mem=$(per_request "$work/memory.toml" m run-m)
printf '%-52s %14d  (%s)\n' "a call of a run: every limit, memory store" "$mem" "$(pct "$mem" "$plain")"
red=$(per_request "$work/redis.toml" m run-r)
printf '%-52s %14d  (%s)\n' "a call of a run: every limit, Redis (gateway only)" "$red" "$(pct "$red" "$plain")"
asm=$(per_request "$work/memory.toml" assembled -)
printf '%-52s %14d  (%s)\n' "stream_upstream: the stream assembled" "$asm" "$(pct "$asm" "$plain")"
echo
printf '%-52s %10s %10s\n' "latency on loopback, microseconds" p50 p99
for row in "no run|memory|-" "a call of a run, memory store|memory|run-lm" "a call of a run, Redis store|redis|run-lr"; do
  IFS='|' read -r name store run <<<"$row"
  latency "$work/$store.toml" m "$run" >"$work/lat"
  read -r p50 p99 <"$work/lat"
  printf '%-52s %10s %10s\n' "$name" "$p50" "$p99"
done
