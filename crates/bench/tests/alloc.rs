//! No heap allocation per packet in picnic's hot path: a counting global allocator watches
//! the egress engine (host 1, the bench's device under test) and the ingress engine (host 2,
//! fed the tunnelled frames host 1 emitted) forward the bench's traffic after a warm-up, with
//! isolation on and off, for every frame size and flow count the bench offers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use picnic_bench::bed::{REMOTE_IP, REMOTE_MAC, TENANT_DEV, VM_IP, VM_MAC};
use picnic_bench::dut::picnic_config;
use picnic_bench::traffic::Offered;
use picnic_core::Instant;
use picnic_switch::config::PortEntry;
use picnic_switch::directory::{TenantIdx, UPLINK};
use picnic_switch::engine::{Engine, Work};
use picnic_switch::frame::{Frame, FramePool};

/// Counts allocations (alloc, alloc_zeroed, realloc) of any thread while `COUNTING` is set;
/// the test is the only one in this binary, so only the engines run meanwhile.
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The processing step of the switch without its synthetic cost.
struct NoWork;
impl Work for NoWork {
    fn process(&mut self, _tenant: TenantIdx, _frame: &mut Frame) -> u64 {
        100
    }
}

const BATCH: usize = 64;

/// Forwards `batches` batches of the offered traffic host 1 -> host 2; returns frames
/// delivered to the remote VM's port.
fn forward(
    h1: &mut Engine,
    h2: &mut Engine,
    pool: &mut FramePool,
    templates: &[Vec<u8>],
    rx: &mut Vec<Frame>,
    now: &mut u64,
    batches: usize,
) -> u64 {
    let mut delivered = 0;
    for b in 0..batches {
        *now += 20_000;
        let t = Instant::from_nanos(*now);
        for i in 0..BATCH {
            let mut f = pool.get().expect("pool sized for a batch in flight");
            f.fill_from(&templates[(b * BATCH + i) % templates.len()]);
            rx.push(f);
        }
        h1.on_frames(t, 1, rx, pool);
        h1.poll(t, BATCH, &mut NoWork, pool);
        rx.append(h1.tx_queue(UPLINK));
        h2.on_frames(t, UPLINK, rx, pool);
        h2.poll(t, BATCH, &mut NoWork, pool);
        for p in 0..2 {
            let q = h2.tx_queue(p);
            if p == 1 {
                delivered += q.len() as u64;
            }
            for f in q.drain(..) {
                pool.put(f);
            }
        }
    }
    delivered
}

#[test]
fn forwarding_allocates_nothing_per_packet_after_warm_up() {
    for isolated in [true, false] {
        for size in [64, 1500] {
            for flows in [1, 8] {
                let cfg1 = picnic_config(isolated).unwrap();
                let mut cfg2 = cfg1.clone();
                cfg2.switch.host_id = 2;
                cfg2.vms[0].port = None;
                cfg2.vms[1].port = Some(PortEntry {
                    ifname: TENANT_DEV.into(),
                    backend: Default::default(),
                    create: false,
                    socket: None,
                    cpus: Vec::new(),
                });
                let mut h1 = Engine::new(&cfg1, Instant::from_nanos(0)).unwrap();
                let mut h2 = Engine::new(&cfg2, Instant::from_nanos(0)).unwrap();
                let mut pool = FramePool::new(4 * BATCH);
                let templates = Offered {
                    size,
                    flows,
                    src: (VM_MAC, VM_IP),
                    dst: (REMOTE_MAC, REMOTE_IP),
                }
                .templates();
                let mut now = 0;
                let mut rx: Vec<Frame> = Vec::with_capacity(2 * BATCH);
                let warm = forward(
                    &mut h1, &mut h2, &mut pool, &templates, &mut rx, &mut now, 1000,
                );
                assert!(warm > 900 * BATCH as u64, "traffic flows: {warm} delivered");
                ALLOCS.store(0, Ordering::SeqCst);
                COUNTING.store(true, Ordering::SeqCst);
                let delivered = forward(
                    &mut h1, &mut h2, &mut pool, &templates, &mut rx, &mut now, 5000,
                );
                COUNTING.store(false, Ordering::SeqCst);
                let allocs = ALLOCS.load(Ordering::SeqCst);
                assert_eq!(
                    delivered,
                    5000 * BATCH as u64,
                    "every frame delivered (isolation {isolated}, {size} B, {flows} flows)"
                );
                assert_eq!(
                    allocs, 0,
                    "{allocs} allocations for {delivered} frames (isolation {isolated}, {size} B, {flows} flows)"
                );
            }
        }
    }
}
