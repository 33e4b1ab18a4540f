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
