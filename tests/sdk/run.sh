#!/usr/bin/env bash
# End-to-end test with the official OpenAI and Anthropic SDKs, Python and Node, as real clients.
#
# Runs the fake provider and the gateway on free loopback ports, then tests/sdk/sdk_test.py,
# tests/sdk/node_test.mjs and tests/sdk/agent_test.py against them (the first two also ask the
# fake directly, to compare). Run from anywhere: `bash tests/sdk/run.sh`. The venv
# with the Python SDKs is kept at ${HOURGLASS_SDK_VENV:-target/sdk-venv} and reused when it
# already has both; the Node SDKs are installed from tests/sdk/package-lock.json into
# ${HOURGLASS_SDK_NODE_DIR:-target/sdk-node} (both relative to the repo root) and reinstalled
# when the lockfile changes. Last line: `sdk: N passed, M failed` over both; exit status 0 only
# when M is 0.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

VENV="${HOURGLASS_SDK_VENV:-target/sdk-venv}"
# Pinned majors: the SDKs' streaming error handling is what this test is about, so a new major
# version is a deliberate update here, not a surprise in CI.
OPENAI_REQ='openai>=3,<4'
ANTHROPIC_REQ='anthropic>=2,<3'
# The agent framework of agent_test.py, on the same openai major.
AGENTS_REQ='openai-agents>=0.24,<0.25'

WORK="$(mktemp -d "${TMPDIR:-/tmp}/hourglass-sdk.XXXXXX")"
FAKE_PID=""
GW_PID=""
REPORTED=0

stop() {
    local pid="$1"
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT
    stop "$GW_PID"
    stop "$FAKE_PID"
    if [ "$rc" -ne 0 ] && [ "$REPORTED" -eq 0 ]; then
        echo "sdk: setup failed (exit $rc)" >&2
        show_logs
        echo "sdk: 0 passed, 1 failed"
        rc=1
    fi
    rm -rf "$WORK"
    exit "$rc"
}

show_logs() {
    for f in fake.log gateway.log; do
        if [ -s "$WORK/$f" ]; then
            echo "---- last lines of $f ----" >&2
            tail -n 40 "$WORK/$f" >&2
        fi
    done
}

trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "sdk: $*" >&2; }

# ---- the venv with both SDKs ------------------------------------------------------------------
PY="$VENV/bin/python"
have_sdks() {
    # Package metadata, not imports: importing openai alone takes seconds. sdk_test.py prints
    # the versions it runs with.
    [ -x "$PY" ] && "$PY" - <<'EOF' 2>/dev/null
from importlib.metadata import version
assert version("openai").split(".")[0] == "3"
assert version("anthropic").split(".")[0] == "2"
assert version("openai-agents").startswith("0.24")
EOF
}
if ! have_sdks; then
    if [ ! -x "$PY" ]; then
        log "creating venv $VENV"
        python3 -m venv "$VENV"
    fi
    log "installing $OPENAI_REQ $ANTHROPIC_REQ $AGENTS_REQ"
    "$PY" -m pip install --quiet --disable-pip-version-check "$OPENAI_REQ" "$ANTHROPIC_REQ" "$AGENTS_REQ"
    have_sdks || { log "the SDKs are not installed after pip install"; exit 1; }
fi

# ---- the Node SDKs, from the lockfile, into target/sdk-node -----------------------------------
NODE_DIR="${HOURGLASS_SDK_NODE_DIR:-target/sdk-node}"
command -v node >/dev/null && command -v npm >/dev/null \
    || { log "node and npm are needed for the Node SDK checks (Debian: apt-get install nodejs npm)"; exit 1; }
mkdir -p "$NODE_DIR"
if ! cmp -s tests/sdk/package-lock.json "$NODE_DIR/installed-lock.json"; then
    log "installing the Node SDKs from tests/sdk/package-lock.json into $NODE_DIR"
    cp tests/sdk/package.json tests/sdk/package-lock.json "$NODE_DIR/"
    (cd "$NODE_DIR" && npm ci --silent --no-audit --no-fund)
    cp tests/sdk/package-lock.json "$NODE_DIR/installed-lock.json"
fi

# ---- the binary -------------------------------------------------------------------------------
cargo build --quiet
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
BIN="$TARGET_DIR/debug/hourglass"
[ -x "$BIN" ] || { log "no binary at $BIN"; exit 1; }

# ---- ports and config -------------------------------------------------------------------------
# All three sockets are held open together, so the ports differ; the OS does not hand a port it
# just gave out straight back, so the short gap before our servers bind is harmless in practice.
read -r FAKE_PORT GW_PORT ADMIN_PORT < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
EOF
)

CONFIG="$WORK/gateway.toml"
cat >"$CONFIG" <<EOF
[server]
listen = "127.0.0.1:$GW_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"

[defaults]
budget = "30s"
idle_timeout = "20s"
first_token_timeout = "3s"

[upstreams.fake]
url = "http://127.0.0.1:$FAKE_PORT"
auth = "none"

# Non-streaming clients watched by streaming upstream (model "watched"), and given what was
# generated when a limit cuts it (model "partial"): the checks compare their answers with the
# fake's own, asked directly. Their own routes, so that the idle counts of the plain routes
# below stay what the other checks expect.
[[routes]]
name = "chat-watched"
path_prefix = "/v1/chat/completions"
models = ["watched"]
upstream = "fake"
stream_upstream = true
idle_timeout = "1s"

[[routes]]
name = "chat-partial"
path_prefix = "/v1/chat/completions"
models = ["partial"]
upstream = "fake"
stream_upstream = true
partial_answers = true

[[routes]]
name = "messages-watched"
path_prefix = "/v1/messages"
models = ["watched"]
upstream = "fake"
stream_upstream = true

[[routes]]
name = "responses-watched"
path_prefix = "/v1/responses"
models = ["watched"]
upstream = "fake"
stream_upstream = true

# The Node SDKs' idle check: their X-Stainless-Timeout ends with the head, so what cuts a
# silent stream is the route's own idle limit.
[[routes]]
name = "chat-quick"
path_prefix = "/v1/chat/completions"
models = ["quick"]
upstream = "fake"
idle_timeout = "2s"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "fake"

# The agent runs of agent_test.py, each on its own limits.
[[routes]]
name = "agent-loop"
path_prefix = "/v1/responses"
models = ["agent-loop"]
upstream = "fake"
run_max_repeats = 3

[[routes]]
name = "agent-calls"
path_prefix = "/v1/responses"
models = ["agent-calls"]
upstream = "fake"
run_max_calls = 2

[[routes]]
name = "agent-deadline"
path_prefix = "/v1/responses"
models = ["agent-deadline"]
upstream = "fake"
run_budget = "2s"

[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "fake"
EOF
"$BIN" check --config "$CONFIG" >"$WORK/check.log" 2>&1 || {
    cat "$WORK/check.log" >&2
    log "the generated config does not validate"
    exit 1
}

# ---- start both servers -----------------------------------------------------------------------
NO_COLOR=1 "$BIN" fake-upstream --listen "127.0.0.1:$FAKE_PORT" >"$WORK/fake.log" 2>&1 &
FAKE_PID=$!
NO_COLOR=1 "$BIN" --config "$CONFIG" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!

wait_port() {
    local port="$1" pid="$2" name="$3"
    for _ in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { log "$name exited before listening on $port"; return 1; }
        sleep 0.05
    done
    log "$name is not listening on $port after 10 s"
    return 1
}
wait_port "$FAKE_PORT" "$FAKE_PID" "fake provider"
wait_port "$GW_PORT" "$GW_PID" "gateway"
wait_port "$ADMIN_PORT" "$GW_PID" "gateway admin listener"

# ---- the checks -------------------------------------------------------------------------------
RESULT="$WORK/result"
set +e
HOURGLASS_SDK_BASE_URL="http://127.0.0.1:$GW_PORT" \
HOURGLASS_SDK_ADMIN_URL="http://127.0.0.1:$ADMIN_PORT" \
HOURGLASS_SDK_FAKE_URL="http://127.0.0.1:$FAKE_PORT" \
HOURGLASS_SDK_RESULT="$RESULT" \
    timeout --kill-after=5 100 "$PY" -u tests/sdk/sdk_test.py
PY_RC=$?
set -e

PASSED=0
FAILED=0
# Adds one script's "PASSED FAILED" line to the totals; a script that died (or was timed out)
# before it could report a failure itself counts as one.
tally() {
    local name="$1" rc="$2" p=0 f=0
    if [ -s "$RESULT" ]; then
        read -r p f <"$RESULT"
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        log "$name exited with status $rc"
        f=1
    fi
    PASSED=$((PASSED + p))
    FAILED=$((FAILED + f))
    rm -f "$RESULT"
}
tally sdk_test.py "$PY_RC"

# The Node SDKs against the same gateway: the Python checks' counts are already in /metrics,
# so node_test.mjs counts from where it starts.
set +e
HOURGLASS_SDK_BASE_URL="http://127.0.0.1:$GW_PORT" \
HOURGLASS_SDK_ADMIN_URL="http://127.0.0.1:$ADMIN_PORT" \
HOURGLASS_SDK_FAKE_URL="http://127.0.0.1:$FAKE_PORT" \
HOURGLASS_SDK_NODE_MODULES="$ROOT/$NODE_DIR/node_modules" \
HOURGLASS_SDK_RESULT="$RESULT" \
    timeout --kill-after=5 100 node tests/sdk/node_test.mjs
NODE_RC=$?
set -e
tally node_test.mjs "$NODE_RC"

# A real agent framework running its own tool loop through the gateway.
set +e
HOURGLASS_SDK_BASE_URL="http://127.0.0.1:$GW_PORT" \
HOURGLASS_SDK_GATEWAY_LOG="$WORK/gateway.log" \
HOURGLASS_SDK_RESULT="$RESULT" \
    timeout --kill-after=5 100 "$PY" -u tests/sdk/agent_test.py
AGENT_RC=$?
set -e
tally agent_test.py "$AGENT_RC"
if [ "$FAILED" -ne 0 ]; then
    show_logs
fi
REPORTED=1
echo "sdk: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
