#!/usr/bin/env bash
# What one held stream keeps on the heap, by allocation site: heaptrack (Debian's package) on
# the gateway while a client holds N1 and then N2 slow streams over HTTP/1.1, each read until
# its first event; the site-by-site difference of the two heap peaks, divided by N2 - N1.
# The streams open ten at a time, so what a request allocates only while its head is awaited
# (which the harness's 256-at-once ramp also leaves behind as holes) is not counted.
#
#   scripts/heap-per-stream.sh                    # the release build of this tree
#   scripts/heap-per-stream.sh path/to/hourglass  # another build
#   N1=200 N2=600 ROWS=40 scripts/heap-per-stream.sh
#   HTTP2=always scripts/heap-per-stream.sh       # HTTP/2 (h2c) to the upstream
#
# Prints the total heap a stream keeps, then the largest sites (the first frames outside the
# allocator, std and tokio's task plumbing). The RSS the harness reports is another figure:
# it also counts the freed memory those holes keep mapped (see docs/benchmarks-log.md).
set -euo pipefail
cd "$(dirname "$0")/.."
n1=${N1:-200} n2=${N2:-600} rows=${ROWS:-30} http2=${HTTP2:-auto}
. scripts/lib/gateway-run.sh
need heaptrack heaptrack
binaries "$@"
bin=${bins[0]}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fake_and_route "$bin" 600s "http2 = \"$http2\""
cat >"$work/hold.py" <<'EOF'
import asyncio, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
       b"x-fake-chunks: 100000\r\nx-fake-interval-ms: 1000\r\nx-fake-headers-first: 1\r\n"
       b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
async def one(ready):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(req)
    await w.drain()
    got = b""
    while b"data:" not in got:
        chunk = await r.read(4096)
        if not chunk:
            raise SystemExit("a stream ended before its first event")
        got += chunk
    ready.append(1)
    while await r.read(4096):
        pass
async def main():
    ready, tasks = [], []
    for i in range(n):
        tasks.append(asyncio.create_task(one(ready)))
        if i % 10 == 9:
            while len(ready) < i + 1:
                await asyncio.sleep(0.002)
    while len(ready) < n:
        await asyncio.sleep(0.01)
    print("held", flush=True)
    await asyncio.sleep(3)
asyncio.run(main())
EOF
# The heap of a gateway that held N streams, as folded stacks weighted by their bytes at the
# peak.
profile() {
  local n=$1 out="$work/heap-$1"
  heaptrack -o "$out" "$bin" --config "$work/hourglass.toml" --workers 1 >/dev/null 2>&1 &
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$admin_port/healthz" && break
    sleep 0.2
  done
  python3 "$work/hold.py" "$gw_port" "$n" >"$work/hold.out" &
  local hold=$!
  for _ in $(seq 600); do grep -q held "$work/hold.out" && break; sleep 0.2; done
  grep -q held "$work/hold.out" || { echo "the streams did not open" >&2; exit 1; }
  sleep 1
  # SIGINT: the gateway shuts down and heaptrack writes its data out.
  pkill -INT -f -- "--config $work/hourglass.toml" || true
  wait "$hold" 2>/dev/null || true
  for _ in $(seq 100); do pgrep -f -- "--config $work/hourglass.toml" >/dev/null || break; sleep 0.1; done
  heaptrack_print -f "$out.zst" --flamegraph-cost-type peak -F "$work/peak-$n.folded" >/dev/null 2>&1
}
profile "$n1"
profile "$n2"
python3 - "$work/peak-$n1.folded" "$work/peak-$n2.folded" "$((n2 - n1))" "$rows" <<'EOF'
import collections, re, sys
plumbing = re.compile(r"^(alloc::|core::|std::|_RNv|__rust|malloc|<alloc|<core|bytes::bytes_mut::"
                      r"|tokio::runtime::task::(core|raw|harness|new_task|list)"
                      r"|tokio::runtime::scheduler::.*::bind)")
# Legacy-mangled names as heaptrack prints them, made readable.
ESCAPES = {"$LT$": "<", "$GT$": ">", "$C$": ",", "$u20$": " ", "$u7b$": "{", "$u7d$": "}",
           "$RF$": "&", "$BP$": "*", "$LP$": "(", "$RP$": ")"}
def readable(frame):
    frame = re.sub(r"::h[0-9a-f]{16}", "", frame)
    for escape, text in ESCAPES.items():
        frame = frame.replace(escape, text)
    return frame.replace("..", "::").replace("_{", "{").lstrip("_")
def load(path):
    sites, total = collections.Counter(), 0
    for line in open(path):
        stack, _, cost = line.rstrip().rpartition(" ")
        total += int(cost)
        frames = [f for f in reversed(stack.split(";")) if f and not plumbing.match(f)]
        site = " <- ".join(readable(f) for f in frames[:2])
        sites[site] += int(cost)
    return sites, total
(a, ta), (b, tb) = load(sys.argv[1]), load(sys.argv[2])
n, rows = int(sys.argv[3]), int(sys.argv[4])
print(f"heap a held stream keeps: {(tb - ta) / n:,.0f} bytes")
per = {k: (b[k] - a[k]) / n for k in set(a) | set(b)}
for site, bytes_ in sorted(per.items(), key=lambda kv: -abs(kv[1]))[:rows]:
    if abs(bytes_) >= 8:
        print(f"{bytes_:9,.0f}  {site[:160]}")
EOF
