// SPDX-License-Identifier: MIT OR Apache-2.0
/* picnic's kernel fast path (docs/switch.md "Two paths", DESIGN.md 4).
 *
 * Two programs on every AF_PACKET port of a switch with `[fastpath] kernel = true`:
 *
 * - `picnic_hop` (tc ingress of the port's device) decides for each frame. A frame of a VM
 *   that user space has granted the fast path (its epoch matches, see below), within its
 *   token buckets, to a known destination of its tenant, is forwarded here, in the softirq of
 *   the CPU that sent it: to a local VM's device (redirect), or encapsulated in Geneve
 *   (RFC 8926, no options) and redirected to the uplink. A Geneve frame from the uplink for a
 *   granted local VM is decapsulated and redirected to it. Everything else is *handed over*:
 *   marked and re-injected into the same device's receive path, where the gate lets it into
 *   the switch's socket. A VM whose receive budget the switch exhausted (Iron, max_pps) has
 *   its frames dropped here before any work (`RX_DROP`).
 * - `picnic_gate` (socket filter on the switch's AF_PACKET sockets) lets only handed-over
 *   frames into the socket (the tap sees every frame before tc: without the gate the switch
 *   would get a copy of what the fast path forwarded).
 *
 * No reordering (PicNIC 2.1: "shaping never blocks the fast path", but a flow may not pass
 * its own queued frames): every hand-over of a VM's frame bumps its epoch (`vm_state`), and
 * the fast path runs only while the epoch user space granted (`vm_ctl`) is the current one,
 * or while the kernel itself has resumed the VM at that epoch: at a frame that finds every
 * frame it handed over let into the socket, and the switch's word (`fp_released`) that it
 * has taken all of them from the ring and holds nothing of the VM. A VM sending faster than
 * user space syncs is so handed back without racing it.
 *
 * Token buckets are GCRA (a theoretical arrival time per bucket) so that one compare-and-swap
 * updates them from any CPU; a lost race hands the frame over (never forwards beyond rate). */
#include "picnic_bpf.h"

#define MAX_SLOTS 1024
#define MAX_DEST_BUCKETS 65536
/* (receiving VM, sending VM) pairs of one host. The switch reads them all every 100 us while
 * they change, and reading a hash walks every bucket: at 16,384 the reads took 29% of a
 * paced sender's switch thread (perf, pps-flood), at 4,096 a quarter of that. */
#define MAX_ARRIVAL_KEYS 4096
#define PUNT_MARK 0x7069636e /* "picn": a frame handed over, on its second pass */

#define ETH_P_IPV4 0x0800
#define ETH_P_TEB 0x6558
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define GENEVE_PORT 6081
/* Outer IPv4 (20) + UDP (8) + Geneve (8) + inner Ethernet (14) after the outer Ethernet. */
#define ENCAP_LEN 50

#define PORT_VM 1
#define PORT_UPLINK 2
#define DEST_LOCAL 1
#define DEST_REMOTE 2

/* vm_ctl.flags */
#define CTL_TX 1      /* the VM's frames may take the fast path (from its port) */
#define CTL_RX 2      /* frames to the VM may take the fast path (to its port) */
#define CTL_RX_DROP 4 /* frames to the VM are dropped before any work (Iron, max_pps) */
#define CTL_TX_DROP 8 /* frames from the VM are dropped before any work (Iron: over its CPU) */

/* Counters per slot (per CPU), in this order; reasons of a hand-over from REASON_BASE. */
enum {
	C_TX_PACKETS,
	C_TX_BYTES,
	C_RX_PACKETS,
	C_RX_BYTES,
	C_RX_DROPPED,
	REASON_BASE,
	R_NOT_GRANTED = REASON_BASE, /* user space holds frames of the VM, or has not granted */
	R_TOKENS,                    /* a token bucket is empty */
	R_NOT_UNICAST_IPV4,          /* ARP, IPv6, multicast, IP options or fragments */
	R_SPOOFED,                   /* source MAC or IPv4 not the VM's, or from the uplink not
				      * a VM of the tenant on the sending host: the switch drops it */
	R_DESTINATION,               /* unknown, or limited by feedback (EyeQ) */
	R_OFFLOAD,                   /* GSO, or a partial checksum going to another host */
	R_GENEVE_OPTIONS,            /* feedback rides on it: the switch reads it */
	C_TX_DROPPED,                /* beyond a destination's rate while its limiter overflows,
				      * or sent while the tenant is over its CPU allocation */
	C_TX_RESUMED,                /* the kernel handed the VM back itself (see the top) */
	C_TX_SHED,                   /* dropped, not handed over: the switch's ring of the VM's
				      * port was about full (see `shedding`) */
	COUNTERS,
};

/* A port of the switch, by its device's ifindex. */
struct port {
	u32 kind;
	u32 slot; /* the switch's port index (the VM's slot) */
	u32 vni;  /* VM ports: the tenant's VNI */
	u32 ip;   /* VM ports: the VM's IPv4 address (network order) */
	u8 mac[6]; /* VM ports: the VM's MAC; uplink: the host's */
	u8 pad[2];
};

struct dest_key {
	u32 vni;
	u8 mac[6];
	u8 pad[2];
};

struct dest {
	u32 kind;
	u32 slot;    /* local: the VM's slot */
	u32 ifindex; /* local: its port's device; remote: the uplink's */
	u32 limited; /* remote: hand every frame over (a feedback limiter without a bucket) */
	u32 src_ip;  /* remote: this host's tunnel address (network order) */
	u32 dst_ip;  /* remote: the peer host's */
	u8 src_mac[6];
	u8 dst_mac[6];
	u32 bucket;      /* remote: its feedback limiter's bucket in fp_dest_tat */
	u32 drop_beyond; /* remote: the engines' limiter overflows: drop beyond the rate here */
	u32 burst_ns;    /* remote: how far its bucket may run ahead */
	u64 ps_per_byte; /* remote: the rate the receiver asked for (EyeQ 3.3); 0: none */
};

/* What user space sets per VM slot. Rates as picoseconds per byte and nanoseconds per
 * packet (0: no bucket); bursts in ns of the bucket's rate. */
struct ctl {
	u32 flags;
	u32 pad;
	u64 tx_epoch;
	u64 rx_epoch;
	u64 tx_ps_per_byte;
	u64 tx_ns_per_packet;
	u64 rx_ps_per_byte;
	u64 rx_ns_per_packet;
	u64 burst_ns;
};

/* What the kernel keeps per VM slot. */
struct state {
	u64 tx_epoch;
	u64 rx_epoch;
	u64 tat[4]; /* tx bytes, tx packets, rx bytes, rx packets */
	u64 tx_resumed; /* the tx epoch + 1 at which the kernel resumed the VM itself; 0: none */
	u64 shedding;   /* 1: frames to hand over are dropped until the ring is drained */
};

/* Per port slot: frames handed over (hop), and handed-over frames let into the socket
 * (gate); user space compares them with what it read from the ring. */
struct handover {
	u64 handed;
	u64 tapped;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct port);
} fp_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct dest_key);
	__type(value, struct dest);
} fp_dests SEC(".maps");

/* The theoretical arrival time of each remote destination's feedback limiter (EyeQ 3.3),
 * by `dest.bucket`: kept apart from `fp_dests` so that user space can change the rate
 * without resetting the bucket. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_DEST_BUCKETS);
	__type(key, u32);
	__type(value, u64);
} fp_dest_tat SEC(".maps");

/* What arrived from the uplink for a local VM in the kernel, per sending VM (outer source
 * address and inner source MAC): the EyeQ receivers meter it as they meter what the switch
 * reads (EyeQ 3.2), so they see the whole access link. LRU: a forged sender cannot grow it. */
struct arrival_key {
	u32 slot;
	u32 src_ip;
	u8 src_mac[6];
	u8 pad[2];
};

struct arrival {
	u64 bytes; /* on the wire, encapsulated */
	u64 packets;
	u64 dropped; /* of those, dropped before any work (RX_DROP) */
	u64 last_ns; /* when the last arrived (bpf_ktime_get_ns, CLOCK_MONOTONIC) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, MAX_ARRIVAL_KEYS);
	__type(key, struct arrival_key);
	__type(value, struct arrival);
} fp_arrivals SEC(".maps");

/* Arrivals counted into `fp_arrivals` so far: the switch walks that map only when this moved. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} fp_arrival_seq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct ctl);
} fp_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct state);
} fp_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct handover);
} fp_handover SEC(".maps");

/* Per VM slot, written by the switch after a pass that left nothing of the VM in it: the
 * entries of the VM port's ring it had taken by then (every one handled). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, u64);
} fp_released SEC(".maps");

/* Per VM slot, written by the switch at every sync: the entries of the VM port's ring it has
 * taken (or the kernel dropped for a full ring), and how many may wait in it (0: no bound). */
struct ring {
	u64 taken;
	u64 limit;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct ring);
} fp_ring SEC(".maps");

/* Frames dropped beyond each remote destination's rate (`dest.bucket`), so the switch knows
 * its senders still flood it while its own limiter is empty. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY); /* not per CPU: 65,536 per-CPU values took the switch
					   * ~100 ms to create at start (perf) */
	__uint(max_entries, MAX_DEST_BUCKETS);
	__type(key, u32);
	__type(value, u64);
} fp_dest_dropped SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS * COUNTERS);
	__type(key, u32);
	__type(value, u64);
} fp_counts SEC(".maps");

static __always_inline void count(u32 slot, u32 what, u64 n)
{
	u32 at = slot * COUNTERS + what;
	u64 *c = bpf_map_lookup_elem(&fp_counts, &at);
	if (c)
		*c += n;
}

/* GCRA: admits `cost` ns of the bucket's rate if the theoretical arrival time is at most
 * `burst` ns ahead of now. One compare-and-swap; a lost race refuses. */
static __always_inline int gcra(u64 *tat, u64 now, u64 cost, u64 burst)
{
	u64 old = *tat;
	u64 base = old > now ? old : now;
	if (base - now > burst)
		return 0;
	return __sync_val_compare_and_swap(tat, old, base + cost) == old;
}

/* Whether the VM's bucket pair (bytes, packets) at tat[first..first+1] admits the frame. */
static __always_inline int within(struct state *st, int first, u64 ps_per_byte,
				  u64 ns_per_packet, u64 burst, u64 now, u64 bytes, u64 packets)
{
	if (ps_per_byte && !gcra(&st->tat[first & 3], now, bytes * ps_per_byte / 1000, burst))
		return 0;
	if (ns_per_packet &&
	    !gcra(&st->tat[(first + 1) & 3], now, packets * ns_per_packet, burst))
		return 0;
	return 1;
}

/* Writes skb->mark as one context store: the barrier keeps clang from reusing a register
 * holding &skb->mark, which the verifier refuses (a modified context pointer). */
static __always_inline void set_mark(struct __sk_buff *skb, u32 mark)
{
	asm volatile("" : "+r"(skb));
	skb->mark = mark;
}

/* Hands the frame over to the switch's socket: counted, the epoch of `bump` VMs moved on,
 * then re-injected into this device's receive path, where the gate lets it in. */
static __always_inline long hand_over(struct __sk_buff *skb, u32 port_slot, u32 reason,
				      struct state *tx, struct state *rx)
{
	struct handover *h = bpf_map_lookup_elem(&fp_handover, &port_slot);
	if (tx)
		__sync_fetch_and_add(&tx->tx_epoch, 1);
	if (rx)
		__sync_fetch_and_add(&rx->rx_epoch, 1);
	if (h)
		__sync_fetch_and_add(&h->handed, 1);
	count(port_slot, reason, 1);
	set_mark(skb, PUNT_MARK);
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

static __always_inline int mac_eq(const u8 *a, const u8 *b)
{
	return *(u32 *)a == *(u32 *)b && *(u16 *)(a + 4) == *(u16 *)(b + 4);
}

static __always_inline int granted(struct ctl *c, struct state *s, u32 flag)
{
	if (!(c->flags & flag))
		return 0;
	return flag == CTL_TX ? c->tx_epoch == s->tx_epoch : c->rx_epoch == s->rx_epoch;
}

/* Whether a VM user space lets send on the fast path, but has not granted the current epoch,
 * may resume here: every frame handed over has been let into the socket (`handed == tapped`)
 * and taken from the ring by a pass after which the switch held nothing of the VM
 * (`fp_released`). A hand-over since bumps the epoch and ends it. */
static __always_inline int resumed(struct ctl *c, struct state *s, u32 slot)
{
	if (!(c->flags & CTL_TX))
		return 0;
	u64 epoch = s->tx_epoch;
	if (s->tx_resumed == epoch + 1)
		return 1;
	struct handover *h = bpf_map_lookup_elem(&fp_handover, &slot);
	u64 *released = bpf_map_lookup_elem(&fp_released, &slot);
	if (!h || !released)
		return 0;
	u64 tapped = h->tapped;
	if (h->handed != tapped || *released < tapped)
		return 0;
	s->tx_resumed = epoch + 1;
	count(slot, C_TX_RESUMED, 1);
	return 1;
}

/* Whether the VM's frames that would be handed over are dropped instead, before any work
 * (Iron 3.3): its port's ring is about full, so the switch, behind on it, would lose them
 * anyway, after the work of the hand-over. Once it starts, it lasts until the switch has taken
 * every frame let in: else the ring stays about full, never drains, and the VM, held on the
 * engines' path by its hand-overs, never comes back to the kernel (cpu-fair: a quarter-core
 * switch kept a flood within its allocation on its path for the whole run). */
static __always_inline int shedding(struct state *s, u32 slot)
{
	struct handover *h = bpf_map_lookup_elem(&fp_handover, &slot);
	struct ring *r = bpf_map_lookup_elem(&fp_ring, &slot);
	if (!h || !r || !r->limit)
		return 0;
	u64 tapped = h->tapped;
	u64 taken = r->taken;
	if (s->shedding) {
		if (taken < tapped)
			return 1;
		s->shedding = 0;
		return 0;
	}
	if (tapped < taken + r->limit)
		return 0;
	s->shedding = 1;
	return 1;
}

/* Hands a VM's own frame over, or drops it while the switch is behind on its ring. */
static __always_inline long vm_hand_over(struct __sk_buff *skb, u32 slot, u32 reason,
					 struct state *s, struct state *rx)
{
	if (shedding(s, slot)) {
		count(slot, C_TX_SHED, 1);
		return TC_ACT_SHOT;
	}
	return hand_over(skb, slot, reason, s, rx);
}

/* Frames from a VM's port. */
static __always_inline long from_vm(struct __sk_buff *skb, struct port *p)
{
	u32 slot = p->slot;
	struct ctl *c = bpf_map_lookup_elem(&fp_ctl, &slot);
	struct state *s = bpf_map_lookup_elem(&fp_state, &slot);
	if (!c || !s)
		return TC_ACT_OK;
	/* A tenant over its CPU allocation: the switch would not read the frame (Iron 3.3). */
	if (c->flags & CTL_TX_DROP) {
		count(slot, C_TX_DROPPED, 1);
		return TC_ACT_SHOT;
	}
	u8 *data = (u8 *)(long)skb->data;
	u8 *end = (u8 *)(long)skb->data_end;
	if (data + 34 > end)
		return vm_hand_over(skb, slot, R_NOT_UNICAST_IPV4, s, 0);
	if (*(u16 *)(data + 12) != bswap16(ETH_P_IPV4) || (data[0] & 1))
		return vm_hand_over(skb, slot, R_NOT_UNICAST_IPV4, s, 0);
	u8 *ip = data + 14;
	/* No options, no fragments. */
	if (ip[0] != 0x45 || (*(u16 *)(ip + 6) & bswap16(0x3fff)))
		return vm_hand_over(skb, slot, R_NOT_UNICAST_IPV4, s, 0);
	if (!mac_eq(data + 6, p->mac) || *(u32 *)(ip + 12) != p->ip)
		return vm_hand_over(skb, slot, R_SPOOFED, s, 0);
	struct dest_key key = {.vni = p->vni};
	__builtin_memcpy(key.mac, data, 6);
	struct dest *d = bpf_map_lookup_elem(&fp_dests, &key);
	u64 now = bpf_ktime_get_ns();
	u64 len = skb->len;
	/* A destination whose limiter in the switch overflows (its VMs send far beyond the rate
	 * its receiver asked for, EyeQ 3.3): what goes beyond that rate is dropped here, on the
	 * sender's CPU, before any work (Iron 3.3), as the limiter would drop it after the work
	 * of handing it over; what is within the rate goes on as below. */
	/* Super-frames (TCP's) are left to the limiter, which segments and paces them. */
	int charged = 0;
	if (d && d->kind == DEST_REMOTE && d->drop_beyond && d->ps_per_byte && !skb->gso_size) {
		u32 b = d->bucket;
		u64 *tat = bpf_map_lookup_elem(&fp_dest_tat, &b);
		if (tat) {
			if (!gcra(tat, now, (len + ENCAP_LEN) * d->ps_per_byte / 1000, d->burst_ns)) {
				u64 *dropped = bpf_map_lookup_elem(&fp_dest_dropped, &b);
				if (dropped)
					__sync_fetch_and_add(dropped, 1);
				count(slot, C_TX_DROPPED, 1);
				return TC_ACT_SHOT;
			}
			charged = 1;
		}
	}
	if (!granted(c, s, CTL_TX) && !resumed(c, s, slot))
		return vm_hand_over(skb, slot, R_NOT_GRANTED, s, 0);
	if (!d || (d->kind == DEST_REMOTE && d->limited))
		return vm_hand_over(skb, slot, R_DESTINATION, s, 0);
	u64 packets = skb->gso_segs ? skb->gso_segs : 1;

	if (d->kind == DEST_LOCAL) {
		u32 dslot = d->slot;
		struct ctl *dc = bpf_map_lookup_elem(&fp_ctl, &dslot);
		struct state *ds = bpf_map_lookup_elem(&fp_state, &dslot);
		if (!dc || !ds)
			return vm_hand_over(skb, slot, R_DESTINATION, s, 0);
		if (!granted(dc, ds, CTL_RX))
			return vm_hand_over(skb, slot, R_NOT_GRANTED, s, ds);
		if (!within(s, 0, c->tx_ps_per_byte, c->tx_ns_per_packet, c->burst_ns, now, len,
			    packets))
			return vm_hand_over(skb, slot, R_TOKENS, s, ds);
		if (!within(ds, 2, dc->rx_ps_per_byte, dc->rx_ns_per_packet, dc->burst_ns, now,
			    len, packets))
			return vm_hand_over(skb, slot, R_TOKENS, s, ds);
		count(slot, C_TX_PACKETS, packets);
		count(slot, C_TX_BYTES, len);
		count(dslot, C_RX_PACKETS, packets);
		count(dslot, C_RX_BYTES, len);
		return bpf_redirect(d->ifindex, 0);
	}

	/* Another host. Offloads travel as the skb's offload state, kept valid by the
	 * encapsulation flags below: a super-frame (TSO) becomes a Geneve super-frame, segmented
	 * when it leaves the uplink (by a NIC, or by the kernel on this CPU: the switch turns a
	 * virtual uplink's tunnel segmentation off, `port::features`); a partial checksum is
	 * completed by the uplink's device or by the receiving host, in its kernel path or from
	 * the virtio-net header of its AF_PACKET uplink (docs/switch.md "Two paths"). A
	 * super-frame's segments each carry its headers (up to 66 bytes with TCP's options) and
	 * the encapsulation: that is what the buckets count. */
	u64 wire = len + ENCAP_LEN;
	if (skb->gso_size)
		wire = len + packets * ENCAP_LEN + (packets - 1) * 66;
	/* The receiver's rate (EyeQ 3.3), then the VM's own buckets: beyond either, the frame
	 * goes to the switch, whose limiters pace it. */
	if (d->ps_per_byte && !charged) {
		u32 b = d->bucket;
		u64 *tat = bpf_map_lookup_elem(&fp_dest_tat, &b);
		if (!tat || !gcra(tat, now, wire * d->ps_per_byte / 1000, d->burst_ns))
			return vm_hand_over(skb, slot, R_TOKENS, s, 0);
	}
	if (!within(s, 0, c->tx_ps_per_byte, c->tx_ns_per_packet, c->burst_ns, now, wire, packets))
		return vm_hand_over(skb, slot, R_TOKENS, s, 0);

	/* Headers: outer Ethernet, IPv4, UDP, Geneve, then the frame's own Ethernet header. */
	/* Offset by 2 so that the outer IPv4 header's words are aligned (the verifier refuses
	 * misaligned stack stores). */
	u8 buf[68] __attribute__((aligned(8)));
	u8 *hdr = buf + 2;
	__builtin_memcpy(hdr, d->dst_mac, 6);
	__builtin_memcpy(hdr + 6, d->src_mac, 6);
	*(u16 *)(hdr + 12) = bswap16(ETH_P_IPV4);
	u8 *oip = hdr + 14;
	/* A super-frame's length may not fit: segmentation writes each segment's own. */
	u32 ip_len = len - 14 + ENCAP_LEN;
	if (ip_len > 0xffff)
		ip_len = 0xffff;
	oip[0] = 0x45;
	oip[1] = 0;
	*(u16 *)(oip + 2) = bswap16((u16)ip_len);
	*(u16 *)(oip + 4) = 0;
	*(u16 *)(oip + 6) = bswap16(0x4000); /* DF */
	oip[8] = 64;
	oip[9] = IPPROTO_UDP;
	*(u16 *)(oip + 10) = 0;
	*(u32 *)(oip + 12) = d->src_ip;
	*(u32 *)(oip + 16) = d->dst_ip;
	u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += *(u16 *)(oip + 2 * i);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	*(u16 *)(oip + 10) = (u16)~sum;
	u8 *udp = oip + 20;
	/* Source port: flow entropy from the inner addresses and ports (RFC 8926 3.3). */
	u32 h = *(u32 *)(ip + 12) ^ *(u32 *)(ip + 16);
	if (data + 38 <= end)
		h ^= *(u32 *)(ip + 20);
	h ^= h >> 16;
	*(u16 *)(udp + 0) = bswap16((u16)(49152 + (h & 0x3fff)));
	*(u16 *)(udp + 2) = bswap16(GENEVE_PORT);
	*(u16 *)(udp + 4) = bswap16((u16)(ip_len - 20));
	*(u16 *)(udp + 6) = 0;
	u8 *gnv = udp + 8;
	gnv[0] = 0;
	gnv[1] = 0;
	*(u16 *)(gnv + 2) = bswap16(ETH_P_TEB);
	gnv[4] = (u8)(p->vni >> 16);
	gnv[5] = (u8)(p->vni >> 8);
	gnv[6] = (u8)p->vni;
	gnv[7] = 0;
	__builtin_memcpy(hdr + 50, data, 14);
	u32 ifindex = d->ifindex;

	u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		    BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(14);
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags))
		return vm_hand_over(skb, slot, R_OFFLOAD, s, 0);
	if (bpf_skb_store_bytes(skb, 0, hdr, 64, 0))
		return TC_ACT_SHOT;
	count(slot, C_TX_PACKETS, packets);
	count(slot, C_TX_BYTES, len);
	return bpf_redirect(ifindex, 0);
}

/* Counts an arrival from the uplink for the receivers' meters. */
static __always_inline void arrived(u32 dslot, u8 *outer_ip, u8 *inner, u64 wire, u64 dropped,
				   u64 now)
{
	struct arrival_key k = {.slot = dslot, .src_ip = *(u32 *)(outer_ip + 12)};
	__builtin_memcpy(k.src_mac, inner + 6, 6);
	struct arrival *a = bpf_map_lookup_elem(&fp_arrivals, &k);
	if (!a) {
		struct arrival zero = {};
		bpf_map_update_elem(&fp_arrivals, &k, &zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(&fp_arrivals, &k);
		if (!a)
			return;
	}
	a->bytes += wire;
	a->packets += 1;
	a->dropped += dropped;
	a->last_ns = now;
	u32 zero = 0;
	u64 *seq = bpf_map_lookup_elem(&fp_arrival_seq, &zero);
	if (seq)
		*seq += 1;
}

/* Frames from the uplink: Geneve without options to a local VM. */
static __always_inline long from_uplink(struct __sk_buff *skb, struct port *p)
{
	u32 uslot = p->slot;
	u8 *data = (u8 *)(long)skb->data;
	u8 *end = (u8 *)(long)skb->data_end;
	/* Outer Ethernet + IPv4 + UDP + Geneve + inner Ethernet + inner IPv4. */
	if (data + 14 + 20 + 8 + 8 + 14 + 20 > end)
		return hand_over(skb, uslot, R_NOT_UNICAST_IPV4, 0, 0);
	u8 *ip = data + 14;
	if (*(u16 *)(data + 12) != bswap16(ETH_P_IPV4) || ip[0] != 0x45 || ip[9] != IPPROTO_UDP ||
	    (*(u16 *)(ip + 6) & bswap16(0x3fff)))
		return hand_over(skb, uslot, R_NOT_UNICAST_IPV4, 0, 0);
	u8 *udp = ip + 20;
	if (*(u16 *)(udp + 2) != bswap16(GENEVE_PORT))
		return hand_over(skb, uslot, R_NOT_UNICAST_IPV4, 0, 0);
	u8 *gnv = udp + 8;
	if (gnv[0] != 0 || *(u16 *)(gnv + 2) != bswap16(ETH_P_TEB))
		return hand_over(skb, uslot, R_GENEVE_OPTIONS, 0, 0);
	u8 *inner = gnv + 8;
	struct dest_key key = {.vni = ((u32)gnv[4] << 16) | ((u32)gnv[5] << 8) | gnv[6]};
	__builtin_memcpy(key.mac, inner, 6);
	struct dest *d = bpf_map_lookup_elem(&fp_dests, &key);
	if (!d || d->kind != DEST_LOCAL)
		return hand_over(skb, uslot, R_DESTINATION, 0, 0);
	/* The sender is a VM of the tenant on the host the frame comes from, as the engines
	 * check (unknown_host, spoofed): else they drop and count it. */
	struct dest_key skey = {.vni = key.vni};
	__builtin_memcpy(skey.mac, inner + 6, 6);
	struct dest *src = bpf_map_lookup_elem(&fp_dests, &skey);
	if (!src || src->kind != DEST_REMOTE || src->dst_ip != *(u32 *)(ip + 12))
		return hand_over(skb, uslot, R_SPOOFED, 0, 0);
	u32 dslot = d->slot;
	struct ctl *dc = bpf_map_lookup_elem(&fp_ctl, &dslot);
	struct state *ds = bpf_map_lookup_elem(&fp_state, &dslot);
	if (!dc || !ds)
		return hand_over(skb, uslot, R_DESTINATION, 0, 0);
	if (dc->flags & CTL_RX_DROP) {
		arrived(dslot, ip, inner, skb->len, 1, bpf_ktime_get_ns());
		count(dslot, C_RX_DROPPED, 1);
		return TC_ACT_SHOT;
	}
	if (*(u16 *)(inner + 12) != bswap16(ETH_P_IPV4) || (inner[0] & 1))
		return hand_over(skb, uslot, R_NOT_UNICAST_IPV4, 0, ds);
	if (skb->gso_size)
		return hand_over(skb, uslot, R_OFFLOAD, 0, ds);
	if (!granted(dc, ds, CTL_RX))
		return hand_over(skb, uslot, R_NOT_GRANTED, 0, ds);
	u64 wire = skb->len;
	u64 len = wire - ENCAP_LEN;
	u64 now = bpf_ktime_get_ns();
	if (!within(ds, 2, dc->rx_ps_per_byte, dc->rx_ns_per_packet, dc->burst_ns, now, len, 1))
		return hand_over(skb, uslot, R_TOKENS, 0, ds);
	arrived(dslot, ip, inner, wire, 0, now);
	u8 eth[14];
	__builtin_memcpy(eth, inner, 14);
	u32 ifindex = d->ifindex;
	if (bpf_skb_adjust_room(skb, -ENCAP_LEN, BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, eth, sizeof(eth), 0))
		return TC_ACT_SHOT;
	count(dslot, C_RX_PACKETS, 1);
	count(dslot, C_RX_BYTES, len);
	return bpf_redirect(ifindex, 0);
}

SEC("classifier")
int picnic_hop(struct __sk_buff *skb)
{
	/* A handed-over frame on its second pass: the gate let it into the switch's socket;
	 * the kernel's own stack sees it as it would without the fast path. */
	if (skb->mark == PUNT_MARK) {
		set_mark(skb, 0);
		return TC_ACT_OK;
	}
	u32 ifindex = skb->ifindex;
	struct port *p = bpf_map_lookup_elem(&fp_ports, &ifindex);
	if (!p)
		return TC_ACT_OK;
	if (p->kind == PORT_VM)
		return from_vm(skb, p);
	return from_uplink(skb, p);
}

SEC("socket")
int picnic_gate(struct __sk_buff *skb)
{
	if (skb->mark != PUNT_MARK)
		return 0;
	u32 ifindex = skb->ifindex;
	struct port *p = bpf_map_lookup_elem(&fp_ports, &ifindex);
	if (p) {
		u32 slot = p->slot;
		struct handover *h = bpf_map_lookup_elem(&fp_handover, &slot);
		if (h)
			__sync_fetch_and_add(&h->tapped, 1);
	}
	return -1;
}

char _license[] SEC("license") = "Dual MIT/GPL";
