#!/usr/bin/env bash
# The benchmark harness of issue 3 (see BENCHMARKS.md), one command:
#
#   scripts/bench.sh            full run, a few minutes: bench-results/{results.json,results.md,*.png}
#   scripts/bench.sh --quick    smoke run, seconds: target/bench-quick/, no verdicts
#   scripts/bench.sh --quick --debug-build    the same on `cargo test`'s debug build (CI)
#
# Installs what it needs when absent (Debian's nginx-light and haproxy; matplotlib in a venv
# under target/; LiteLLM in target/litellm-venv and Portkey in target/portkey), runs every
# scenario against a direct connection, Hourglass (both runtime flavours), nginx, haproxy, two
# bare hyper proxies (the floor of the stack Hourglass is built on), LiteLLM and Portkey,
# prints the table and draws the plots. Other arguments go to the harness:
# --targets direct,hourglass,... --scenarios nonstream,streams,leave,memory,limits,cpu --out DIR.
# LiteLLM and Portkey take minutes to install: a --quick run leaves them out unless --targets
# names them. One that cannot be installed or started is skipped, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

debug=0 quick=0 partial=0 out= targets=
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
    --targets) partial=1; targets=$a ;;
    --scenarios) partial=1 ;;
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

# LiteLLM and Portkey: in a full run, or when named in --targets. Pinned versions, so that a
# run can be compared with the last; a failed install is reported and the harness skips the
# target with its reason.
wants() { if [ -n "$targets" ]; then [[ ",$targets," == *",$1,"* ]]; else [ $quick = 0 ]; fi; }
litellm_version=1.106.12
if wants litellm && [ ! -x target/litellm-venv/bin/litellm ]; then
  # 1.107.0 was a compromised release (withdrawn); the `proxy` extra of 1.108 and later
  # needs litellm-proxy packages that the registry does not serve: 1.106.12 installs whole.
  echo "[bench] installing litellm[proxy]==$litellm_version in target/litellm-venv (a few minutes)"
  python3 -m venv target/litellm-venv &&
    target/litellm-venv/bin/pip install -q --disable-pip-version-check \
      "litellm[proxy]==$litellm_version" >target/litellm-install.log 2>&1 ||
    echo "[bench] LiteLLM did not install (target/litellm-install.log): it is skipped" >&2
fi
portkey_entry=target/portkey/node_modules/@portkey-ai/gateway/build/start-server.js
if wants portkey && [ ! -f "$portkey_entry" ]; then
  if command -v npm >/dev/null; then
    echo "[bench] installing @portkey-ai/gateway in target/portkey"
    mkdir -p target/portkey
    # From 1.14.2 on (Portkey's ^1.3.3 resolves to 1.19), @hono/node-server hands Portkey
    # the upstream fetch's immutable headers for a streamed answer, Portkey's header update
    # throws and every stream answers 500 (docs/benchmarks-log.md). 1.14.1 copies them.
    (cd target/portkey &&
      printf '%s\n' '{"name":"hourglass-bench-portkey","private":true,' \
        '"dependencies":{"@portkey-ai/gateway":"1.15.2"},' \
        '"overrides":{"@hono/node-server":"1.14.1"}}' >package.json &&
      npm install --no-audit --no-fund --loglevel=error >../portkey-install.log 2>&1) ||
      echo "[bench] Portkey did not install (target/portkey-install.log): it is skipped" >&2
  else
    echo "[bench] npm is missing: Portkey is skipped" >&2
  fi
fi

if [ $debug = 1 ]; then
  cargo test --bench gateway -- ${args[@]+"${args[@]}"}
else
  cargo bench --bench gateway -- ${args[@]+"${args[@]}"}
fi
"$venv/bin/python" scripts/bench_plot.py "$out/results.json" "$out"
