#!/usr/bin/env bash
# What a stream whose client stopped reading holds while its upstream streams fast: N clients
# each read only the head of a stream the fake sends as fast as it can (x-fake-interval-ms:
# 0), with budgets and send_timeout far beyond the wait, so nothing ends them; the gateway's
# RSS once it has stopped growing (30 s), less its RSS before, divided by N. Backpressure
# holds the upstream; what is left is the buffers on both sides of the gateway.
#
#   scripts/stalled-memory.sh                    # the release build of this tree
#   scripts/stalled-memory.sh a/hourglass b/hourglass
#   N=200 scripts/stalled-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n=${N:-100}
. scripts/lib/gateway-run.sh
binaries "$@"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cat >"$work/stall.py" <<'PY'
import socket, sys, time
port, pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def rss(): return int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0])
body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
       b"x-fake-chunks: 100000000\r\nx-fake-interval-ms: 0\r\n"
       b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
before, held = rss(), []
for _ in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.connect(("127.0.0.1", port))
    s.sendall(req)
    held.append(s)
time.sleep(30)
after = rss()
print(f"{n} stalled streams: RSS {before} -> {after} KiB, {(after - before) / n:.0f} KiB a stream")
PY
for bin in "${bins[@]}"; do
  fake_and_route "$bin" 600s
  sed -i 's/^shutdown_grace = "1s"$/shutdown_grace = "1s"\nsend_timeout = "10m"/' "$work/hourglass.toml"
  "$bin" --config "$work/hourglass.toml" >/dev/null 2>&1 &
  gw=$!
  for _ in $(seq 50); do
    curl -fs "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  printf '%s: ' "$bin"
  python3 "$work/stall.py" "$gw_port" "$gw" "$n"
  kill "$gw" 2>/dev/null; wait "$gw" 2>/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
done
