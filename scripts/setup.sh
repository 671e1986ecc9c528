#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test picnic, then builds it.
# Idempotent: skips whatever is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in ip:iproute2 tc:iproute2 bridge:iproute2 iperf3:iperf3 sockperf:sockperf memcached:memcached ethtool:ethtool ping:iputils-ping taskset:util-linux clang:clang; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: missing ${need_apt[*]} (Debian packages); install them as root" >&2
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || {
    echo "setup: installing Rust with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  }
  export PATH="$HOME/.cargo/bin:$PATH"
fi

cargo build --release --bin picnic
