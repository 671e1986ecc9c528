//! The bodies of picnic's fuzz targets: each takes arbitrary bytes and panics only on a bug
//! (a panic in the code under test, or a broken invariant asserted here).
//!
//! They live in a stable crate of the workspace so that two drivers share them:
//! - `fuzz/` (cargo-fuzz, nightly): one libFuzzer binary per target, see docs/fuzzing.md;
//! - `tests/smoke.rs` (stable, part of `cargo test`): replays the seed corpus in
//!   `fuzz/seeds/<target>/` and a few thousand deterministic mutations of it.
//!
//! Every target is listed in [`TARGETS`]; a fuzz binary is one line calling its body.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::OnceLock;

use picnic_core::{Duration, Instant};
use picnic_switch::config::{Config, HostEntry, TenantEntry, VmEntry};
use picnic_switch::directory::UPLINK;
use picnic_switch::engine::{Engine, Work};
use picnic_switch::frame::{Frame, FramePool};
use picnic_wire::etherparse::PacketBuilder;
use picnic_wire::{classify, decap, encap, FeedbackOption, GenevePacket, GeneveRepr, OuterHeaders};

/// Every target: its name (the cargo-fuzz binary and the seed directory) and its body.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("wire", wire),
    ("feedback", feedback),
    ("switch_config", switch_config),
    ("scenario", scenario),
    ("api_body", api_body),
];

/// Every parser of picnic-wire on arbitrary bytes: the Geneve header (RFC 8926) and its
/// options, picnic's feedback option, overlay decapsulation and frame classification.
/// What parses re-emits and parses back the same.
pub fn wire(bytes: &[u8]) {
    if let Ok(packet) = GenevePacket::new_checked(bytes) {
        assert!(packet.header_len() <= bytes.len());
        let _ = (
            packet.vni(),
            packet.protocol(),
            packet.oam(),
            packet.critical(),
        );
        let options_len: usize = packet.options().map(|o| 4 + o.data.len()).sum();
        assert_eq!(8 + options_len, packet.header_len());
        if let Ok(repr) = GeneveRepr::parse(&packet) {
            let mut out = [0u8; 64];
            let len = repr.emit(&mut out).expect("a parsed header fits 64 bytes");
            let again = GenevePacket::new_checked(&out[..len]).expect("emitted header checks");
            assert_eq!(GeneveRepr::parse(&again), Ok(repr));
        }
    }
    if let Ok(fb) = FeedbackOption::parse(bytes) {
        let mut out = [0u8; 16];
        fb.emit(&mut out).expect("feedback data fits 16 bytes");
        assert_eq!(&out[..], bytes);
    }
    if let Ok(decapped) = decap(bytes) {
        assert!(decapped.inner.len() <= bytes.len());
        let _ = classify(decapped.inner).map(|s| s.flow_hash());
    }
    if let Ok(summary) = classify(bytes) {
        let _ = summary.flow_hash();
    }
}

/// The switch config the feedback target's engine runs: host 1 with one local VM (id 1),
/// two remote VMs (ids 2, 3) on host 2, every isolation mechanism on.
const FEEDBACK_CONFIG: &str = r#"
[switch]
host_id = 1
frame_pool = 256
[uplink]
ifname = "up0"
[egress]
min_rate_mbps = 1
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
[[hosts]]
id = 2
underlay_ip = "198.19.0.2"
mac = "02:00:00:00:01:02"
[[tenants]]
name = "blue"
vni = 100
[[vms]]
name = "a"
id = 1
tenant = "blue"
host = 1
mac = "02:00:00:00:00:01"
ip = "198.18.0.1"
min_mbps = 100
port = { ifname = "a-p" }
[[vms]]
name = "b"
id = 2
tenant = "blue"
host = 2
mac = "02:00:00:00:00:02"
ip = "198.18.0.2"
[[vms]]
name = "c"
id = 3
tenant = "blue"
host = 2
mac = "02:00:00:00:00:03"
ip = "198.18.0.3"
"#;

struct NoWork;
impl Work for NoWork {
    fn process(&mut self, _tenant: usize, _frame: &mut Frame) -> u64 {
        0
    }
}

/// Reads the input front to back; past the end every read is 0.
struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
}

/// A UDP frame between two of the feedback config's VMs (last address octets `src`, `dst`).
fn tenant_frame(src: u8, dst: u8, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, src], [2, 0, 0, 0, 0, dst])
        .ipv4([198, 18, 0, src], [198, 18, 0, dst], 64)
        .udp(40000, 7)
        .write(&mut out, &vec![0u8; payload])
        .expect("a small frame builds");
    out
}

/// The switch's feedback handling as the engine applies it (EyeQ 3.3, sans-I/O): a program
/// of operations read from the input (well-formed feedback packets with fuzzed fields and
/// senders, tenant frames carrying a feedback option, raw uplink frames, the local VM's
/// traffic to the limited destinations, time passing) runs against an engine built from
/// a small config. Invariants: no panic; every limiter the engine applies is within
/// [`min_rate_mbps`, the highest rate any received feedback advertised for that endpoint]
/// (halving stops at the floor, nothing raises a rate past what a receiver sent); the
/// feedback counter never exceeds the feedback frames received.
pub fn feedback(bytes: &[u8]) {
    feedback_limits(bytes);
}

/// [`feedback`], returning how many applied limits it checked (so a test can tell that the
/// seeds reach the limiters).
pub fn feedback_limits(bytes: &[u8]) -> usize {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    let cfg = CONFIG.get_or_init(|| Config::parse(FEEDBACK_CONFIG).expect("config parses"));
    let floor = cfg.egress.min_rate().bps();
    let mut now = Instant::ZERO;
    let mut engine = Engine::new(cfg, now).expect("engine builds");
    let port = engine
        .dir
        .local_vms()
        .next()
        .map(|(_, p)| p)
        .expect("a local VM");
    let mut pool = FramePool::new(32);
    let hosts: HashMap<u32, &HostEntry> = cfg.hosts.iter().map(|h| (h.id, h)).collect();
    // Highest rate (bits/s) advertised per endpoint, and frames that carried feedback.
    let mut advertised: HashMap<u32, u64> = HashMap::new();
    let mut with_feedback = 0u64;
    let mut input = Input(bytes);
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        let op = input.u8();
        let frame: Option<Vec<u8>> = match op % 5 {
            // A feedback packet, or a tenant frame from b to a carrying the option.
            0 | 1 => {
                let fb = FeedbackOption {
                    dst_endpoint: u32::from(input.u8() % 5),
                    rate_bps: u64::from_be_bytes(input.bytes()),
                    seq: u32::from_be_bytes(input.bytes()),
                };
                // Sender: host 2 (owns b and c), this host, or a host nobody knows.
                let (src_ip, src_mac) = match input.u8() % 3 {
                    0 => (hosts[&2].underlay_ip, hosts[&2].mac.0),
                    1 => (hosts[&1].underlay_ip, hosts[&1].mac.0),
                    _ => (Ipv4Addr::new(198, 19, 0, 99), [2, 0, 0, 0, 1, 99]),
                };
                let vni = if input.u8() % 4 == 0 { 200 } else { 100 };
                let outer = OuterHeaders {
                    src_mac,
                    dst_mac: hosts[&1].mac.0,
                    src_ip,
                    dst_ip: hosts[&1].underlay_ip,
                    src_port: 50000,
                    ttl: 64,
                };
                let (geneve, inner) = if op % 5 == 0 {
                    (picnic_wire::standalone_feedback(vni, fb), Vec::new())
                } else {
                    let mut g = GeneveRepr::ethernet(vni);
                    g.feedback = Some(fb);
                    (g, tenant_frame(2, 1, usize::from(input.u8())))
                };
                let mut out = vec![0u8; 2048];
                let n = encap(&outer, &geneve, &inner, &mut out).expect("encap fits");
                out.truncate(n);
                Some(out)
            }
            // Raw bytes on the uplink.
            2 => {
                let len = usize::from(input.u8()) * 8;
                Some(input.take(len).to_vec())
            }
            // The local VM sends to b or c (through their limiters, if any).
            3 => {
                let dst = 2 + input.u8() % 2;
                let frame = tenant_frame(1, dst, usize::from(input.u8()) * 4);
                // Frames held in limiter queues can empty the pool: then the VM waits.
                if let Some(mut f) = pool.get() {
                    assert!(f.fill_from(&frame));
                    engine.on_frames(now, port, &mut vec![f], &mut pool);
                }
                None
            }
            // Time passes: up to ~33 s in 1 ms..0.5 s steps, so limiters halve and expire.
            _ => {
                now += Duration::from_micros(u64::from(u16::from_be_bytes(input.bytes())) * 8);
                None
            }
        };
        // Frames held in limiter queues can empty the pool: then the uplink frame is lost.
        if let Some((frame, mut f)) = frame.and_then(|frame| Some((frame, pool.get()?))) {
            if let Some(fb) = decap(&frame).ok().and_then(|d| d.geneve.feedback) {
                with_feedback += 1;
                let max = advertised.entry(fb.dst_endpoint).or_default();
                *max = (*max).max(fb.rate_bps);
            }
            if f.fill_from(&frame) {
                engine.on_frames(now, UPLINK, &mut vec![f], &mut pool);
            } else {
                pool.put(f);
            }
        }
        engine.poll(now, 64, &mut NoWork, &mut pool);
        for p in 0..engine.dir.port_count() {
            for f in engine.tx_queue(p).drain(..) {
                pool.put(f);
            }
        }
    }
    let snap = engine.snapshot();
    assert!(snap.switch.feedback_received <= with_feedback);
    let mut checked = 0;
    for vm in &snap.vms {
        for &(dst, rate_bps) in &vm.applied_limits {
            let max = advertised.get(&dst).copied();
            let max = max.unwrap_or_else(|| panic!("limit on {dst}, which no feedback named"));
            // Rates are held in bytes/s: allow the rounding of bits to bytes.
            assert!(
                rate_bps >= floor && rate_bps <= max.max(floor),
                "limit {rate_bps} b/s on {dst} outside [{floor}, {max}]"
            );
            checked += 1;
        }
    }
    checked
}

/// The switch's config file (`Config::parse`: TOML, then validation). A config that
/// validates must build an engine without panicking, and survive the JSON round trip the
/// API's `GET /config` does (what it serializes parses and validates again).
pub fn switch_config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(cfg) = Config::parse(text) else {
        return;
    };
    let _ = Engine::new(&cfg, Instant::ZERO);
    let json = serde_json::to_string(&cfg).expect("a config serializes");
    let back: Config = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("serialized config does not parse back: {e}\n{json}"));
    back.validate()
        .unwrap_or_else(|e| panic!("serialized config does not validate: {e}\n{json}"));
}

/// A lab scenario file (`picnic_scenario::Scenario::parse`: TOML, then validation),
/// and the lookups the lab does on a valid one.
pub fn scenario(bytes: &[u8]) {
    use picnic_scenario::Scenario;
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(s) = Scenario::parse(text) else {
        return;
    };
    let _ = s.report_groups();
    for w in &s.workloads {
        let _ = (s.is_attack(w), s.report_group(w), w.stop_ms(&s), w.port(&s));
    }
}

/// The JSON bodies of the control API's changes (`POST /tenants`, `/vms`, `/hosts`,
/// `PUT /vms/NAME`), applied as the API does: the body is deserialized into its config entry,
/// the entry added to (or replacing one of) the running config, the result validated, and a
/// valid one built into an engine. The first byte picks the request, the rest is the body.
pub fn api_body(bytes: &[u8]) {
    static BASE: OnceLock<Config> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        Config::parse(include_str!("../../../examples/host1.toml")).expect("example parses")
    });
    let Some((&op, body)) = bytes.split_first() else {
        return;
    };
    let Ok(body) = std::str::from_utf8(body) else {
        return;
    };
    let mut cfg = base.clone();
    let parsed = match op % 4 {
        0 => serde_json::from_str::<TenantEntry>(body).map(|t| cfg.tenants.push(t)),
        1 => serde_json::from_str::<VmEntry>(body).map(|v| cfg.vms.push(v)),
        2 => serde_json::from_str::<HostEntry>(body).map(|h| cfg.hosts.push(h)),
        _ => serde_json::from_str::<VmEntry>(body).map(|v| {
            let slot = usize::from(op / 4) % cfg.vms.len();
            cfg.vms[slot] = v;
        }),
    };
    if parsed.is_err() || cfg.validate().is_err() {
        return;
    }
    let _ = Engine::new(&cfg, Instant::ZERO);
}
