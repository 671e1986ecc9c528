#!/usr/bin/env bash
# Installs what the CNI root test (crates/cli/tests/cni.rs) runs besides picnic: the CNI
# project's own cnitool and the host-local IPAM plugin, built from their Go modules at pinned
# versions into $PICNIC_CNI_DIR (default /usr/local/lib/picnic/cni). Installs Debian's Go when
# no go is on PATH. Idempotent: a tool already there is kept. About a minute the first time.
set -euo pipefail
dir=${PICNIC_CNI_DIR:-/usr/local/lib/picnic/cni}
cni=github.com/containernetworking/cni/cnitool@v1.3.1
plugins=github.com/containernetworking/plugins/plugins/ipam/host-local@v1.9.0

if [ -x "$dir/cnitool" ] && [ -x "$dir/host-local" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup_cni: installing Debian's Go (golang-go)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends golang-go ca-certificates >/dev/null
  else
    echo "setup_cni: no go on PATH; install Go (Debian: golang-go) as root" >&2
    exit 1
  fi
fi
mkdir -p "$dir"
for module in "$cni" "$plugins"; do
  echo "setup_cni: building $module into $dir"
  GOBIN="$dir" GOFLAGS=-buildvcs=false go install "$module"
done
