#!/usr/bin/env bash
# CPU an idle switch uses (issue target: <= 2% of a core): runs examples/host1.toml in a
# namespace of its own with its ports as idle veths/TAP, and reads the process's scheduler
# run time over SECONDS (default 20). Needs root and a release build (scripts/setup.sh).
set -euo pipefail
SECONDS_IDLE=${1:-20}
BIN=${PICNIC:-$(dirname "$0")/../target/release/picnic}
CONFIG=$(dirname "$0")/../examples/host1.toml
NS=picnic-idle-$$
cleanup() { [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null; ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$NS"
ip netns exec "$NS" bash -c '
  ip link add up0 type veth peer name up0p
  ip link add blue1-p type veth peer name blue1-v
  ip tuntap add red1-tap mode tap
  for d in lo up0 up0p blue1-p blue1-v red1-tap; do ip link set "$d" up; done'
ip netns exec "$NS" "$BIN" switch -c "$CONFIG" > /dev/null 2>&1 &
PID=$!
sleep 3
runtime() { local s=0; for t in /proc/"$PID"/task/*; do read -r a _ < "$t"/schedstat; s=$((s + a)); done; echo "$s"; }
before=$(runtime); sleep "$SECONDS_IDLE"; after=$(runtime)
awk -v d=$((after - before)) -v s="$SECONDS_IDLE" \
  'BEGIN { printf "idle switch (examples/host1.toml, %d s): %.0f us of CPU per s = %.2f%% of a core\n", s, d / s / 1000, d / s / 1e7 }'
