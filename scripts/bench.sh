#!/usr/bin/env bash
# The benchmark harness of issue 3 (see BENCHMARKS.md), one command:
#
#   scripts/bench.sh            full run, a few minutes: bench-results/{results.json,results.md,*.png}
#   scripts/bench.sh --quick    smoke run, seconds: target/bench-quick/, no verdicts
#   scripts/bench.sh --quick --debug-build    the same on `cargo test`'s debug build (CI)
#
# Installs what it needs when absent (Debian's nginx-light and haproxy; matplotlib in a venv
# under target/), runs every scenario against a direct connection, Hourglass (both runtime
# flavours), nginx, haproxy and two bare hyper proxies (the floor of the stack Hourglass is
# built on), prints the table and draws the plots. Other arguments go to the harness:
# --targets direct,hourglass,... --scenarios nonstream,streams,leave,memory,limits,cpu --out DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

debug=0 quick=0 partial=0 out=
args=()
prev=
for a in "$@"; do
  case $a in
    # CI: build the harness and the gateway in the debug profile that `cargo test` already
    # built, instead of a release build of everything (the numbers then mean nothing).
    --debug-build) debug=1; prev=$a; continue ;;
    --quick) quick=1 ;;
  esac
  case $prev in
    --out) out=$a ;;
    --targets|--scenarios) partial=1 ;;
  esac
  args+=("$a")
  prev=$a
done
# Only a full run of everything lands in bench-results/ (the committed results).
if [ -z "$out" ]; then
  if [ $quick = 1 ]; then out=target/bench-quick
  elif [ $partial = 1 ]; then out=target/bench-partial
  else out=bench-results
  fi
  args+=(--out "$out")
fi

need=()
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || need+=(nginx-light)
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null || need+=(haproxy)
command -v taskset >/dev/null && command -v prlimit >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[bench] installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "[bench] missing ${need[*]}: install them (as root) or those targets are skipped" >&2
  fi
fi

venv=target/bench-venv
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  echo "[bench] creating $venv with matplotlib"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check matplotlib
fi

if [ $debug = 1 ]; then
  cargo test --bench gateway -- ${args[@]+"${args[@]}"}
else
  cargo bench --bench gateway -- ${args[@]+"${args[@]}"}
fi
"$venv/bin/python" scripts/bench_plot.py "$out/results.json" "$out"
