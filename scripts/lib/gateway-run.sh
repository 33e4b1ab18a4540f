# Sourced by the scripts that run one gateway against the fake provider on loopback and
# measure it (bench-instructions.sh, bench-features.sh, heap-per-stream.sh): a tool from
# Debian's packages, the binaries to measure, a scratch folder and free ports.

# Installs Debian's package $2 when the command $1 is missing.
need() {
  command -v "$1" >/dev/null && return
  [ "$(id -u)" = 0 ] || { echo "$1 is missing (Debian's $2)" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

# The binaries given, or the release build of this tree.
binaries() {
  bins=("$@")
  if [ ${#bins[@]} = 0 ]; then
    cargo build --release --quiet --bin hourglass
    bins=(target/release/hourglass)
  fi
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A scratch folder, removed with every process started in the background, and the ports of
# the fake provider, the gateway and its admin listener.
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
fake_port=$(port) gw_port=$(port) admin_port=$(port)

# Starts the fake provider (binary $1) and writes $work/hourglass.toml: the gateway with one
# chat route to it, a default budget of $2, and $3 (TOML lines) in the upstream's table.
fake_and_route() {
  "$1" fake-upstream --listen "127.0.0.1:$fake_port" >/dev/null 2>&1 &
  cat >"$work/hourglass.toml" <<TOML
[server]
listen = "127.0.0.1:$gw_port"
admin_listen = "127.0.0.1:$admin_port"
shutdown_grace = "1s"
[defaults]
budget = "$2"
[upstreams.fake]
url = "http://127.0.0.1:$fake_port"
${3:-}
[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
TOML
}
