/* The few definitions picnic's eBPF programs need, so that they build with clang alone (no
 * kernel or libbpf headers): fixed-width types, the helpers used (ids from the helper list in
 * include/uapi/linux/bpf.h, stable ABI), BTF map definitions as libbpf and aya read them, and
 * the uapi structs and constants used. Kernel-internal structs are declared where they are
 * used, with only the fields read and `preserve_access_index`, so the loader relocates their
 * offsets against the running kernel's BTF (CO-RE). */
#ifndef PICNIC_BPF_H
#define PICNIC_BPF_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int s32;
typedef long long s64;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF-defined maps (the ".maps" section). */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_XSKMAP = 17,
	BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
};

/* bpf_map_update_elem flags. */
#define BPF_NOEXIST 1

/* Helpers (the numbers are their ids in enum bpf_func_id). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, u64 flags) =
	(void *)2;
static u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_redirect_map)(void *map, u64 key, u64 flags) = (void *)51;
static long (*bpf_skb_store_bytes)(void *skb, u32 offset, const void *from, u32 len, u64 flags) =
	(void *)9;
static long (*bpf_redirect)(u32 ifindex, u64 flags) = (void *)23;
static long (*bpf_skb_adjust_room)(void *skb, s32 len_diff, u32 mode, u64 flags) = (void *)50;
static long (*bpf_probe_read_kernel)(void *dst, u32 size, const void *src) = (void *)113;

/* struct xdp_md (uapi). */
struct xdp_md {
	u32 data;
	u32 data_end;
	u32 data_meta;
	u32 ingress_ifindex;
	u32 rx_queue_index;
	u32 egress_ifindex;
};

enum xdp_action {
	XDP_ABORTED = 0,
	XDP_DROP,
	XDP_PASS,
	XDP_TX,
	XDP_REDIRECT,
};

/* struct __sk_buff (uapi), up to the fields read. */
struct __sk_buff {
	u32 len;
	u32 pkt_type;
	u32 mark;
	u32 queue_mapping;
	u32 protocol;
	u32 vlan_present;
	u32 vlan_tci;
	u32 vlan_proto;
	u32 priority;
	u32 ingress_ifindex;
	u32 ifindex;
	u32 tc_index;
	u32 cb[5];
	u32 hash;
	u32 tc_classid;
	u32 data;
	u32 data_end;
	u32 napi_id;
	u32 family;
	u32 remote_ip4;
	u32 local_ip4;
	u32 remote_ip6[4];
	u32 local_ip6[4];
	u32 remote_port;
	u32 local_port;
	u32 data_meta;
	union {
		void *flow_keys;
		u64 : 64;
	} __attribute__((aligned(8)));
	u64 tstamp;
	u32 wire_len;
	u32 gso_segs;
	union {
		void *sk;
		u64 : 64;
	} __attribute__((aligned(8)));
	u32 gso_size;
	u8 tstamp_type;
	u32 : 24;
	u64 hwtstamp;
};

/* tc actions. */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

/* bpf_redirect flags. */
#define BPF_F_INGRESS 1

/* bpf_skb_adjust_room modes and flags. */
#define BPF_ADJ_ROOM_MAC 1
#define BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 (1ULL << 1)
#define BPF_F_ADJ_ROOM_ENCAP_L4_UDP (1ULL << 4)
#define BPF_F_ADJ_ROOM_ENCAP_L2_ETH (1ULL << 6)
#define BPF_F_ADJ_ROOM_ENCAP_L2(len) (((u64)(len) & 0xff) << 56)

#define bswap16(x) __builtin_bswap16(x)
#define bswap32(x) __builtin_bswap32(x)

#endif
