// SPDX-License-Identifier: MIT OR Apache-2.0
/* Softirq accounting for the switch's tenant ports (Iron 3.1, "receiver-based accounting",
 * on tracepoints: this kernel refuses kprobes and fentry, DESIGN.md 7).
 *
 * A NET_RX softirq run on one CPU is a window from irq/softirq_entry to irq/softirq_exit. Each
 * packet handed to the stack inside it fires net/netif_receive_skb; the time from one packet's
 * event to the next (or to the window's end) is the kernel's work on that packet, charged to
 * its device; the window's start-up time, before its first packet, goes to the first packet.
 * Devices are the switch-side ends of its tenant ports, registered by the switch in `ports`
 * (key: network namespace inode << 32 | ifindex), and the VM-side peers of those that are
 * veths: a VM's sent frames are received on the switch-side end ("from VM"), the frames the
 * switch sends to it are received on the peer ("to VM"). Windows run by the switch's own
 * dataplane thread (its `config` tid) are counted apart: the switch measures that time as its
 * own CPU time already. Everything is kept per CPU; the switch sums the CPUs.
 *
 * Without IRQ time accounting (this kernel's config) the scheduler charges a softirq run
 * inside a task's time slice to that task. So `task_ns` keeps, per thread, the tracked ports'
 * softirq time run in its context: the switch charges that time to the ports' tenants and
 * credits it to the thread's own group (Iron's Algorithm 2: a container gains back what it
 * spent on another's packets, and is not charged twice for its own). */
#include "picnic_bpf.h"

#define NET_RX_SOFTIRQ 3
#define PF_KTHREAD 0x00200000
#define MAX_SLOTS 1024
#define NO_SLOT 0xffffffffu
#define FROM_VM 0
#define TO_VM 1

/* Kernel structs, only the fields read; offsets relocated against the kernel's BTF. */
struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));
struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));
typedef struct {
	struct net *net;
} possible_net_t;
struct rtnl_link_ops {
	const char *kind;
} __attribute__((preserve_access_index));
struct net_device {
	int ifindex;
	possible_net_t nd_net;
	const struct rtnl_link_ops *rtnl_link_ops;
	u8 priv[0];
} __attribute__((preserve_access_index));
struct veth_priv {
	struct net_device *peer;
} __attribute__((preserve_access_index));
struct sk_buff {
	struct net_device *dev;
} __attribute__((preserve_access_index));
struct task_struct {
	unsigned int flags;
	int pid;
} __attribute__((preserve_access_index));

static struct task_struct *(*bpf_get_current_task_btf)(void) = (void *)158;

/* Reads `field` of a kernel object through a pointer held as a number. */
#define KREAD(dst, field) \
	bpf_probe_read_kernel(&(dst), sizeof(dst), __builtin_preserve_access_index(&(field)))

#define MAX_SWITCH_THREADS 16

struct config {
	/* the dataplane threads (one per worker, 0: unused): their windows are the switch's
	 * own time, which each measures as its thread's CPU time */
	u32 switch_tid[MAX_SWITCH_THREADS];
};

static __always_inline int is_switch_thread(const struct config *cfg, u32 tid)
{
	if (!cfg || !tid)
		return 0;
#pragma unroll
	for (int i = 0; i < MAX_SWITCH_THREADS; i++)
		if (cfg->switch_tid[i] == tid)
			return 1;
	return 0;
}

/* What one CPU's current window has reached. */
struct window {
	u64 start;
	u64 last;
	u32 slot;
	u32 dir;
	u32 active;
	u32 first_pending; /* no packet seen yet: the time so far goes to the first */
	u32 in_switch;     /* run by the switch's dataplane thread */
	u32 in_kthread;    /* run by ksoftirqd or on an idle CPU: charged to no task */
	u32 tid;           /* the task whose time slice the window runs in */
	u32 pad;
};

/* Per slot, per direction: ns and packets outside the switch's thread (of which in kernel
 * threads), and what the switch's own thread ran. */
struct usage {
	u64 ns[2];
	u64 packets[2];
	u64 kthread_ns[2];
	u64 switch_ns;
	u64 switch_packets;
};

/* Per CPU: all NET_RX softirq time, and how it was attributed. */
struct totals {
	u64 net_rx_ns;
	u64 windows;
	u64 attributed_ns;
	u64 switch_ns;
	u64 untracked_ns;
	u64 packets;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u64);
	__type(value, u32);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct window);
} windows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct usage);
} usage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct totals);
} totals SEC(".maps");

/* Per thread: tracked ports' softirq ns run in its context (bounded: least recently used
 * threads make room). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, u64);
} task_ns SEC(".maps");

static __always_inline struct window *this_window(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&windows, &zero);
}

static __always_inline struct totals *this_totals(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&totals, &zero);
}

/* Charges the window's time since its last event to the slot it is on. */
static __always_inline void charge(struct window *w, u64 now)
{
	struct totals *t = this_totals();
	u64 dt = now - w->last;
	w->last = now;
	if (!t)
		return;
	if (w->slot >= MAX_SLOTS) {
		t->untracked_ns += dt;
		return;
	}
	u32 slot = w->slot;
	struct usage *u = bpf_map_lookup_elem(&usage, &slot);
	if (!u)
		return;
	if (w->in_switch) {
		u->switch_ns += dt;
		t->switch_ns += dt;
		return;
	}
	u32 dir = w->dir & 1;
	u->ns[dir] += dt;
	if (w->in_kthread)
		u->kthread_ns[dir] += dt;
	t->attributed_ns += dt;
	if (!w->in_kthread) {
		u32 tid = w->tid;
		u64 *in_task = bpf_map_lookup_elem(&task_ns, &tid);
		if (in_task)
			*in_task += dt;
		else
			bpf_map_update_elem(&task_ns, &tid, &dt, BPF_NOEXIST);
	}
}

static __always_inline u32 slot_of(unsigned int inum, int ifindex)
{
	u64 key = ((u64)inum << 32) | (u32)ifindex;
	u32 *slot = bpf_map_lookup_elem(&ports, &key);
	return slot ? *slot : NO_SLOT;
}

/* The slot of a device the program got as a typed pointer (read directly: the verifier
 * checks these loads against the kernel's BTF, no helper call). */
static __always_inline u32 port_slot(struct net_device *dev)
{
	struct net *net = dev->nd_net.net;
	if (!net)
		return NO_SLOT;
	return slot_of(net->ns.inum, dev->ifindex);
}

/* The same for a device pointer read as a number (a veth's peer). */
static __always_inline u32 port_slot_read(struct net_device *dev)
{
	int ifindex = 0;
	unsigned int inum = 0;
	struct net *net = 0;

	KREAD(ifindex, dev->ifindex);
	KREAD(net, dev->nd_net.net);
	if (!net)
		return NO_SLOT;
	KREAD(inum, net->ns.inum);
	return slot_of(inum, ifindex);
}

/* The tracked slot of `dev` and the direction: the device itself (from VM), or its veth peer
 * (to VM). */
static __always_inline u32 device_slot(struct net_device *dev, u32 *dir)
{
	u32 slot = port_slot(dev);
	if (slot != NO_SLOT) {
		*dir = FROM_VM;
		return slot;
	}
	const struct rtnl_link_ops *ops = dev->rtnl_link_ops;
	char kind[5] = {};
	if (!ops)
		return NO_SLOT;
	const char *kind_ptr = ops->kind;
	if (!kind_ptr || bpf_probe_read_kernel(kind, sizeof(kind), kind_ptr) < 0)
		return NO_SLOT;
	if (kind[0] != 'v' || kind[1] != 'e' || kind[2] != 't' || kind[3] != 'h' || kind[4])
		return NO_SLOT;
	/* netdev_priv(dev) is dev->priv; a veth's private data starts with its peer. */
	struct net_device *peer = 0;
	if (bpf_probe_read_kernel(&peer, sizeof(peer), __builtin_preserve_access_index(&dev->priv)) < 0 ||
	    !peer)
		return NO_SLOT;
	slot = port_slot_read(peer);
	*dir = TO_VM;
	return slot;
}

SEC("tp_btf/softirq_entry")
int picnic_softirq_entry(u64 *ctx)
{
	if ((u32)ctx[0] != NET_RX_SOFTIRQ)
		return 0;
	struct window *w = this_window();
	if (!w)
		return 0;
	u64 now = bpf_ktime_get_ns();
	u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct task_struct *task = bpf_get_current_task_btf();
	w->start = now;
	w->last = now;
	w->slot = NO_SLOT;
	w->dir = FROM_VM;
	w->active = 1;
	w->first_pending = 1;
	w->in_switch = is_switch_thread(cfg, tid);
	w->in_kthread = tid == 0 || (task->flags & PF_KTHREAD);
	w->tid = tid;
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int picnic_netif_receive_skb(u64 *ctx)
{
	struct window *w = this_window();
	if (!w || !w->active)
		return 0;
	struct sk_buff *skb = (struct sk_buff *)ctx[0];
	struct net_device *dev = skb->dev;
	u32 dir = FROM_VM;
	u32 slot = dev ? device_slot(dev, &dir) : NO_SLOT;
	u64 now = bpf_ktime_get_ns();
	if (w->first_pending) {
		w->first_pending = 0;
		w->slot = slot;
		w->dir = dir;
	}
	charge(w, now);
	w->slot = slot;
	w->dir = dir;
	struct totals *t = this_totals();
	if (t)
		t->packets += 1;
	if (slot < MAX_SLOTS) {
		struct usage *u = bpf_map_lookup_elem(&usage, &slot);
		if (u) {
			if (w->in_switch)
				u->switch_packets += 1;
			else
				u->packets[dir & 1] += 1;
		}
	}
	return 0;
}

SEC("tp_btf/softirq_exit")
int picnic_softirq_exit(u64 *ctx)
{
	if ((u32)ctx[0] != NET_RX_SOFTIRQ)
		return 0;
	struct window *w = this_window();
	if (!w || !w->active)
		return 0;
	u64 now = bpf_ktime_get_ns();
	charge(w, now);
	w->active = 0;
	struct totals *t = this_totals();
	if (t) {
		t->net_rx_ns += now - w->start;
		t->windows += 1;
	}
	return 0;
}

char _license[] SEC("license") = "Dual MIT/GPL";
