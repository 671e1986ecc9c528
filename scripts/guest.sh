#!/usr/bin/env bash
# Builds a minimal Linux guest for picnic's QEMU test (crates/switch/tests/guest.rs) and for
# trying a VM by hand: Debian's kernel image and a busybox initramfs, nothing installed on the
# host. Usage:
#
#   bash scripts/guest.sh [DIR]     # DIR: $PICNIC_GUEST_DIR, else /var/cache/picnic/guest
#
# DIR gets `vmlinuz` (Debian's linux-image-amd64, unpacked with dpkg-deb), `initrd.img` (a
# gzipped newc cpio: Debian's busybox-static, the virtio-net driver and its dependencies as
# modules, since Debian builds virtio_net, virtio_pci and virtio as modules, and `/init`) and
# `VERSION` (the packages it was built from). The packages are fetched with `apt-get
# download` into DIR/debs (the registry only; no root needed). Runs again in seconds when
# DIR is complete (delete DIR to rebuild).
#
# The guest's /init configures eth0 (virtio-net with its default offloads: checksum and TSO
# on), runs the checks the kernel command line asks for and reports each on the serial
# console as one `PICNIC-...` line, then powers off. Command-line parameters:
#
#   picnic.ip=198.18.0.2/24     IPv4 address of eth0 (required)
#   picnic.mtu=1400             MTU of eth0 (default: the device's, 1500)
#   picnic.peer=198.18.0.3      ping it (PICNIC-PING4 ok|fail)
#   picnic.tcp=198.18.0.3:7777  send 1 MiB of random bytes there, expect them echoed back
#                               (PICNIC-TCP ok|fail)
#   picnic.ip6=fd00::2/64       IPv6 address of eth0 (with picnic.peer6=fd00::3: ping -6,
#   picnic.peer6=fd00::3        PICNIC-PING6 ok|fail)
#   picnic.tcp6=[fd00::3]:7777  as picnic.tcp, over IPv6 (PICNIC-TCP6 ok|fail)
#   picnic.bench=198.18.0.3:7000:16:5
#                               throughput rounds (crates/switch/tests/guest_bench.rs): each
#                               round sends 16 MiB of zeros to port 7000, then reads port 7001
#                               until the host closes; the host times both (PICNIC-BENCH done N)
#   picnic.hold=5               seconds to stay up after the checks (to be pinged)
#
# Boot it, e.g. on a TAP attached to a picnic switch (docs/switch.md "Attaching a VM"):
#
#   qemu-system-x86_64 -machine q35 -enable-kvm -cpu host -m 256 -nographic -no-reboot \
#     -kernel DIR/vmlinuz -initrd DIR/initrd.img \
#     -append "console=ttyS0 quiet panic=-1 picnic.ip=198.18.0.2/24 picnic.peer=198.18.0.3" \
#     -netdev tap,id=n0,ifname=vm1tap,script=no,downscript=no,vnet_hdr=on \
#     -device virtio-net-pci,netdev=n0,mac=02:00:00:00:00:02
set -euo pipefail

DIR=${1:-${PICNIC_GUEST_DIR:-/var/cache/picnic/guest}}
mkdir -p "$DIR/debs"
DIR=$(cd "$DIR" && pwd)

# The image's format, recorded in VERSION: an image of an older format (its /init lacks a
# check the tests ask for) is rebuilt from the cached packages. 2: picnic.tcp6. 3: picnic.bench,
# the queues in PICNIC-UP.
FORMAT=3
if [[ -s "$DIR/vmlinuz" && -s "$DIR/initrd.img" ]] && grep -qx "format $FORMAT" "$DIR/VERSION" 2>/dev/null; then
    echo "guest.sh: $DIR is complete ($(head -1 "$DIR/VERSION")); delete it to rebuild"
    exit 0
fi

for tool in apt-get apt-cache dpkg-deb gzip; do
    command -v "$tool" >/dev/null || { echo "guest.sh: needs $tool (a Debian host)" >&2; exit 2; }
done

# The kernel package linux-image-amd64 points at (a metapackage: its one dependency).
kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
KPKG=$(kernel_pkg)
if [[ -z "$KPKG" && $(id -u) == 0 ]]; then
    apt-get update -qq
    KPKG=$(kernel_pkg)
fi
[[ -n "$KPKG" ]] || { echo "guest.sh: no linux-image-amd64 in apt's lists (apt-get update?)" >&2; exit 2; }

cd "$DIR/debs"
for pkg in "$KPKG" busybox-static; do
    if ! ls "${pkg}"_*.deb >/dev/null 2>&1; then
        apt-get download "$pkg" 2>&1 | grep -v "unsandboxed" || true
    fi
    ls "${pkg}"_*.deb >/dev/null 2>&1 || { echo "guest.sh: apt-get download $pkg failed" >&2; exit 2; }
done

WORK=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
dpkg-deb -x "$(ls "${KPKG}"_*.deb | head -1)" "$WORK/kernel"
dpkg-deb -x "$(ls busybox-static_*.deb | head -1)" "$WORK/busybox"
KVER=$(ls "$WORK/kernel/lib/modules" | head -1)
MODS="$WORK/kernel/lib/modules/$KVER"

ROOT="$WORK/root"
mkdir -p "$ROOT"/{bin,sbin,dev,proc,sys,tmp,lib/modules,etc}
cp "$WORK/busybox/bin/busybox" "$ROOT/bin/busybox"
chmod 755 "$ROOT/bin/busybox"

# virtio_net (and virtio_pci for the PCI device QEMU gives) with what they need, in load
# order: `depends=` from each module's .modinfo section (no kmod needed on the host).
config="$WORK/kernel/boot/config-$KVER"
ORDER=()
declare -A SEEN=()
modpath() { find "$MODS/kernel" -name "$1.ko" -o -name "$1.ko.xz" | head -1; }
add_module() {
    local name=${1//-/_}
    [[ -n "${SEEN[$name]:-}" ]] && return 0
    SEEN[$name]=1
    local path
    path=$(modpath "$name")
    if [[ -z "$path" ]]; then
        path=$(modpath "${1//_/-}")
    fi
    [[ -n "$path" ]] || { echo "guest.sh: module $name not in $KPKG" >&2; exit 2; }
    local plain="$path"
    if [[ "$path" == *.xz ]]; then
        plain="$WORK/$(basename "${path%.xz}")"
        xz -dc "$path" >"$plain"
    fi
    local deps
    deps=$(tr '\0' '\n' <"$plain" | sed -n 's/^depends=//p' | head -1)
    local dep
    for dep in ${deps//,/ }; do
        add_module "$dep"
    done
    cp "$plain" "$ROOT/lib/modules/$name.ko"
    ORDER+=("$name")
}
for mod in virtio_pci virtio_net; do
    CONFIG=CONFIG_$(echo "$mod" | tr a-z A-Z)
    if grep -q "^$CONFIG=y" "$config"; then
        echo "guest.sh: $mod is built into $KVER"
    else
        add_module "$mod"
    fi
done
printf '%s\n' "${ORDER[@]}" >"$ROOT/lib/modules/order"

cat >"$ROOT/init" <<'INIT'
#!/bin/busybox sh
# picnic's test guest (scripts/guest.sh): configure eth0, run the checks the kernel command
# line asks for, report each on the console as one PICNIC-... line, power off.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
say() { echo "PICNIC-$*" >/dev/console; }
done_() { say "DONE"; sync; poweroff -f; sleep 5; }
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m.ko || say "INSMOD-FAIL $m"
done
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^picnic\.$1=//p" | head -1; }
IP=$(arg ip); MTU=$(arg mtu); PEER=$(arg peer); TCP=$(arg tcp)
IP6=$(arg ip6); PEER6=$(arg peer6); TCP6=$(arg tcp6); HOLD=$(arg hold); BENCH=$(arg bench)
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -e /sys/class/net/eth0 ] || { say "NO-ETH0"; done_; }
ip link set lo up
[ -n "$MTU" ] && ip link set eth0 mtu "$MTU"
ip link set eth0 up
ip addr add "$IP" dev eth0
# No duplicate address detection (the switch consumes its probes, which would only hold the
# address back a second): busybox's ip has no `nodad`, the sysctl does it.
if [ -n "$IP6" ]; then
    echo 0 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6
    echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
    ip -6 addr add "$IP6" dev eth0 || say "IP6-FAIL $IP6"
fi
# The features the driver negotiated (bit 0 CSUM: the guest hands over partial checksums; bit
# 11 HOST_TSO4: the guest sends TSO super-frames), as a bit string.
# The queues the driver uses (rx-0,rx-1,...: more than one pair with multiqueue and vCPUs).
QUEUES=$(ls /sys/class/net/eth0/queues | tr '\n' , | sed 's/,$//')
say "UP mac=$(cat /sys/class/net/eth0/address) mtu=$(cat /sys/class/net/eth0/mtu) features=$(cat /sys/class/net/eth0/device/features) queues=$QUEUES"
if [ -n "$PEER" ]; then
    if ping -c 3 -W 3 "$PEER" >/tmp/ping 2>&1 || ping -c 3 -W 3 "$PEER" >/tmp/ping 2>&1; then
        say "PING4 ok $(grep -o '[0-9]* packets received' /tmp/ping)"
    else
        say "PING4 fail $(tail -2 /tmp/ping | tr '\n' ' ')"
    fi
fi
# tcp_echo CHECK HOST PORT: 1 MiB of random bytes to HOST:PORT, expected echoed back.
tcp_echo() {
    dd if=/dev/urandom of=/tmp/data bs=65536 count=16 2>/dev/null
    timeout 30 nc -w 10 "$2" "$3" </tmp/data >/tmp/echo 2>/tmp/nc.err
    if cmp -s /tmp/data /tmp/echo; then
        say "$1 ok $(wc -c </tmp/echo) bytes echoed"
    else
        say "$1 fail sent $(wc -c </tmp/data) got $(wc -c </tmp/echo) $(cat /tmp/nc.err)"
    fi
}
[ -n "$TCP" ] && tcp_echo TCP "${TCP%:*}" "${TCP##*:}"
if [ -n "$PEER6" ]; then
    if ping -6 -c 3 -W 3 "$PEER6" >/tmp/ping6 2>&1 || ping -6 -c 3 -W 3 "$PEER6" >/tmp/ping6 2>&1; then
        say "PING6 ok $(grep -o '[0-9]* packets received' /tmp/ping6)"
    else
        say "PING6 fail $(tail -2 /tmp/ping6 | tr '\n' ' ')"
    fi
fi
if [ -n "$TCP6" ]; then
    host6=${TCP6%]:*}
    tcp_echo TCP6 "${host6#[}" "${TCP6##*:}"
fi
# bench HOST PORT MIB ROUNDS: MIB MiB to PORT, then PORT+1 read until the host closes, ROUNDS
# times (the host closes once the MiB are through: nc then sees the end).
bench() {
    dd if=/dev/zero of=/tmp/bench bs=65536 count=$(($3 * 16)) 2>/dev/null
    r=0
    while [ "$r" -lt "$4" ]; do
        # cat writes the file to the socket, dd reads it in up to 1 MiB (nc's own loop copies 8 KiB
        # at a time).
        timeout 120 nc -w 30 "$1" "$2" -e cat /tmp/bench || say "BENCH-SEND fail round $r"
        timeout 120 nc -w 30 "$1" $(($2 + 1)) -e sh -c 'dd of=/dev/null bs=1M 2>/dev/null' ||
            say "BENCH-RECV fail round $r"
        r=$((r + 1))
    done
    say "BENCH done $r"
}
[ -n "$BENCH" ] && bench $(echo "$BENCH" | tr ':' ' ')
say "STATS rx=$(cat /sys/class/net/eth0/statistics/rx_packets) tx=$(cat /sys/class/net/eth0/statistics/tx_packets)"
[ -n "$HOLD" ] && sleep "$HOLD"
done_
INIT
chmod 755 "$ROOT/init"

# The busybox cpio applet writes the newc archive (no cpio needed on the host).
(cd "$ROOT" && find . | "$ROOT/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -9 >"$WORK/initrd.img"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
{
    echo "$KPKG $(ls "${KPKG}"_*.deb | head -1 | sed 's/.*_\(.*\)_amd64.deb/\1/') (kernel $KVER)"
    echo "$(ls busybox-static_*.deb | head -1)"
    echo "modules: ${ORDER[*]:-none}"
    echo "format $FORMAT"
} >"$WORK/VERSION"
mv "$WORK/vmlinuz" "$DIR/vmlinuz"
mv "$WORK/initrd.img" "$DIR/initrd.img"
mv "$WORK/VERSION" "$DIR/VERSION"
echo "guest.sh: built $DIR: $(head -1 "$DIR/VERSION"); modules: ${ORDER[*]:-none}"
