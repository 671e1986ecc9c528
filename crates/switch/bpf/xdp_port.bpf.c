// SPDX-License-Identifier: MIT OR Apache-2.0
/* The XDP program of picnic's AF_XDP ports (docs/switch.md, "eBPF").
 *
 * Every frame of the port's queue goes to its AF_XDP socket (the XSKMAP holds it at key 0),
 * except, on the uplink, the Geneve frames of a VM whose tenant is over its CPU budget (Iron
 * 3.3: drop a throttled container's packets before any work is spent on them) or which is over
 * its packet budget (`max_pps`): those are dropped here, before they reach the switch's rings,
 * and counted per VM and reason. The switch keeps `throttled` up to date when a VM's state
 * changes; on tenant ports the map stays empty. */
#include "picnic_bpf.h"

#define GENEVE_PORT 6081
#define ETH_P_IPV4 0x0800
#define ETH_P_TEB 0x6558 /* Geneve protocol type of an Ethernet payload */
#define IPPROTO_UDP 17
/* Slots (the switch's port index of the VM) and the reasons counted for each. */
#define MAX_SLOTS 1024
#define REASON_CPU 0
#define REASON_PPS 1
#define REASONS 2

/* One AF_XDP socket per NIC queue: the switch has one on every queue (a queue without one
 * passes its frames to the kernel stack). */
#define MAX_QUEUES 64

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, u32);
	__type(value, u32);
} xsks SEC(".maps");

/* A local VM as the uplink sees it: its tenant's VNI and its MAC. */
struct vm_key {
	u32 vni;
	u8 mac[6];
	u8 pad[2];
};

/* Why the VM's frames are dropped: bit REASON_CPU, bit REASON_PPS. */
struct throttle {
	u32 slot;
	u32 reasons;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__type(key, struct vm_key);
	__type(value, struct throttle);
} throttled SEC(".maps");

/* Frames dropped, per CPU, at slot * REASONS + reason. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS * REASONS);
	__type(key, u32);
	__type(value, u64);
} xdp_drops SEC(".maps");

/* The destination VM of a Geneve frame (Ethernet/IPv4/UDP 6081/Geneve/Ethernet, RFC 8926),
 * every read bounds-checked against data_end; 0 when the frame is anything else. */
static __always_inline int geneve_vm(struct xdp_md *ctx, struct vm_key *key)
{
	u8 *data = (u8 *)(long)ctx->data;
	u8 *end = (u8 *)(long)ctx->data_end;

	if (data + 14 > end)
		return 0;
	if (*(u16 *)(data + 12) != bswap16(ETH_P_IPV4))
		return 0;
	u8 *ip = data + 14;
	if (ip + 20 > end)
		return 0;
	u32 ihl = (ip[0] & 0x0f) * 4;
	if (ihl < 20 || ip[9] != IPPROTO_UDP)
		return 0;
	/* A fragment other than the first has no UDP header: leave it to the switch. */
	if (*(u16 *)(ip + 6) & bswap16(0x1fff))
		return 0;
	u8 *udp = ip + ihl;
	if (udp + 8 > end)
		return 0;
	if (*(u16 *)(udp + 2) != bswap16(GENEVE_PORT))
		return 0;
	u8 *gnv = udp + 8;
	if (gnv + 8 > end)
		return 0;
	if (*(u16 *)(gnv + 2) != bswap16(ETH_P_TEB))
		return 0;
	u32 opts = (gnv[0] & 0x3f) * 4;
	u8 *inner = gnv + 8 + opts;
	if (inner + 6 > end)
		return 0;
	key->vni = ((u32)gnv[4] << 16) | ((u32)gnv[5] << 8) | gnv[6];
	__builtin_memcpy(key->mac, inner, 6);
	return 1;
}

SEC("xdp")
int picnic_xdp(struct xdp_md *ctx)
{
	struct vm_key key = {};

	if (geneve_vm(ctx, &key)) {
		struct throttle *t = bpf_map_lookup_elem(&throttled, &key);
		if (t && t->reasons && t->slot < MAX_SLOTS) {
			u32 reason = (t->reasons & (1 << REASON_CPU)) ? REASON_CPU : REASON_PPS;
			u32 at = t->slot * REASONS + reason;
			u64 *n = bpf_map_lookup_elem(&xdp_drops, &at);
			if (n)
				*n += 1;
			return XDP_DROP;
		}
	}
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";
