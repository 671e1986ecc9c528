#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test picnic, then builds it.
# Idempotent: skips whatever is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in ip:iproute2 tc:iproute2 bridge:iproute2 iperf3:iperf3 sockperf:sockperf memcached:memcached ethtool:ethtool ping:iputils-ping taskset:util-linux clang:clang qemu-system-x86_64:qemu-system-x86 dpkg-deb:dpkg promtool:prometheus etcd:etcd-server protoc:protobuf-compiler; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# etcd-server: the control plane's store (crates/control; the cluster test starts its own on
# loopback ports). protobuf-compiler and libprotobuf-dev (protoc and the well-known .proto
# files): the etcd-client crate compiles etcd's gRPC API at build time.
[ -e /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
# prometheus: promtool checks /metrics, and the metrics test scrapes a switch with a real
# Prometheus (crates/cli/tests/metrics.rs). Debian's package would start its service where
# an init system runs; the tests start their own on loopback.
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

# Fuzzing (scripts/fuzz.sh, docs/fuzzing.md) needs nightly and cargo-fuzz. A fresh machine
# has stable only: then say so and go on (cargo test runs the fuzz targets' corpus on stable);
# `rustup toolchain install nightly --profile minimal` and rerunning this adds cargo-fuzz.
if rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
  fi
else
  echo "setup: no nightly toolchain: libFuzzer runs (scripts/fuzz.sh) skip; cargo test replays the fuzz corpus on stable"
fi

cargo build --release --bin picnic

# The guest the QEMU test boots (crates/switch/tests/guest.rs): Debian's kernel and a busybox
# initramfs, fetched with apt-get download into /var/cache/picnic/guest (about 72 MB, once).
# Without it that test skips and says so.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  bash scripts/guest.sh || echo "setup: the test guest was not built (scripts/guest.sh); the QEMU test skips" >&2
fi

# The CNI test's tools (crates/cli/tests/cni.rs): the CNI project's cnitool and host-local,
# built from their Go modules into /usr/local/lib/picnic/cni (about a minute, once).
if [ "$(id -u)" = 0 ]; then
  bash scripts/setup_cni.sh || echo "setup: cnitool was not built (scripts/setup_cni.sh); the CNI test skips" >&2
fi
