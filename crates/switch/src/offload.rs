//! Tenant offload programs: FairNIC's application abstraction (FairNIC 5.1-5.2) with the
//! isolation FairNIC leaves out ("we do not make any claims of security isolation"): a
//! tenant's packet program is WebAssembly run in a sandbox (the `wasmi` interpreter) that
//! can touch nothing but the frame it is handed and its own linear memory.
//!
//! A program exports `egress(len: i32) -> i32` and/or `ingress(len: i32) -> i32`, FairNIC's
//! `from_host_packet_cb` and `from_wire_packet_cb`: the switch calls the first with each
//! frame a VM of the tenant sends, the second with each frame delivered to one, and the
//! frame passes when the result is 0 and is dropped (`offload_drop`) otherwise. Its only
//! imports are the host API of module `picnic`, modelled on FairNIC's isolation library:
//!
//! | import | FairNIC | does |
//! |---|---|---|
//! | `frame_len() -> i32` | | the frame's length |
//! | `load(offset, ptr, n: i32) -> i32` | (packet access) | copies frame bytes into memory; n or -1 |
//! | `store(offset, ptr, n: i32) -> i32` | (packet access) | copies memory into the frame; n or -1 |
//! | `set_len(n: i32) -> i32` | | truncates or extends the frame (to 1920 bytes); n or -1 |
//! | `count(slot: i32, n: i64)` | | adds n to one of the tenant's 64 counters (`/stats`) |
//! | `emit(ptr, n: i32) -> i32` | `send_pkt_to_host` | sends a new frame to the hook's VM; 0 or -1 |
//!
//! Linear memory is the program's own (FairNIC's `memory_allocate` within its stripe): it is
//! capped by `memory_kib` (a `memory.grow` past it traps). Every run has a fuel budget (about
//! one unit per instruction) of `fuel_per_packet`, and the tenant's runs together get
//! `fuel_per_period` per 10 ms (FairNIC's coprocessor tokens, applied to the program's own
//! CPU). A run that exhausts either, traps or hits the memory cap is stopped there and its
//! frame dropped with that reason; the program stays attached for the next frame, its state
//! as the stopped run left it. The fuel a run used, plus [`CALL_FUEL`] for the call itself,
//! is converted to CPU time and charged to the tenant (`Engine::charge_cpu`'s per-frame
//! direct charge, Iron 3.1). Against the period's budget a run that faults (a trap or the
//! memory cap) counts its packet's whole fuel, as a loop does: a program failing on every
//! frame is held back as soon as a looping one, not after thousands of cheap faults.
//! While the period's budget is spent, the switch does not read the tenant's VMs' ports
//! (`Engine::rx_ready`): its frames wait in their rings rather than being read and dropped.

use picnic_core::{Duration, Instant};
use serde::{Deserialize, Serialize};
use wasmi::{
    Caller, CompilationMode, Config, Engine as WasmEngine, Linker, Memory, Module, Store,
    StoreLimits, StoreLimitsBuilder, TrapCode, TypedFunc,
};

use crate::frame::{Frame, DATA_CAP, FRAME_CAP};
use crate::stats::DropReason;

/// Counter slots a program's `count` can add to.
pub const COUNTERS: usize = 64;
/// Frames one run may `emit`.
pub const MAX_EMITS: usize = 4;
/// The period of the per-period fuel budget.
pub const PERIOD: Duration = Duration::from_millis(10);
/// Fuel a run is charged for the call into the interpreter and back, on top of what its
/// instructions used: an empty program's run costs about as much as 35 units of a loop's
/// (70 ns against 2.1 ns per unit, `cargo bench -p picnic-switch --bench offload`).
pub const CALL_FUEL: u64 = 35;
/// Largest program accepted, bytes (text or binary).
pub const MAX_PROGRAM_BYTES: usize = 1 << 20;

/// A tenant's program as configured (`[tenants.offload]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffloadEntry {
    /// The program's file: WebAssembly text (`.wat`) or binary, read when the engines are
    /// built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<std::path::PathBuf>,
    /// Or the program's text itself (what the API attaches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wat: Option<String>,
    /// Fuel of one run, about one unit per instruction.
    #[serde(default = "default_fuel_per_packet")]
    pub fuel_per_packet: u64,
    /// Fuel of all the tenant's runs in one 10 ms period.
    #[serde(default = "default_fuel_per_period")]
    pub fuel_per_period: u64,
    /// The program's linear memory limit, KiB.
    #[serde(default = "default_memory_kib")]
    pub memory_kib: u64,
}
fn default_fuel_per_packet() -> u64 {
    20_000
}
fn default_fuel_per_period() -> u64 {
    2_000_000
}
fn default_memory_kib() -> u64 {
    1024
}

impl OffloadEntry {
    /// The field and problem of the first invalid value.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.program.is_some() == self.wat.is_some() {
            return Err((
                "program",
                "give exactly one of program (a file) and wat".into(),
            ));
        }
        if self
            .wat
            .as_ref()
            .is_some_and(|w| w.len() > MAX_PROGRAM_BYTES)
        {
            return Err(("wat", format!("at most {MAX_PROGRAM_BYTES} bytes")));
        }
        if !(1..=100_000_000).contains(&self.fuel_per_packet) {
            return Err(("fuel_per_packet", "must be in 1..=100000000".into()));
        }
        if !(self.fuel_per_packet..=10_000_000_000).contains(&self.fuel_per_period) {
            return Err((
                "fuel_per_period",
                "must be at least fuel_per_packet and at most 1e10".into(),
            ));
        }
        if self.memory_kib > 64 * 1024 {
            return Err(("memory_kib", "at most 65536 (64 MiB)".into()));
        }
        Ok(())
    }

    /// The program's code: the file's bytes or the text.
    pub fn code(&self) -> anyhow::Result<Vec<u8>> {
        match (&self.program, &self.wat) {
            (Some(path), _) => std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("offload program {}: {e}", path.display())),
            (None, Some(wat)) => Ok(wat.as_bytes().to_vec()),
            (None, None) => anyhow::bail!("offload: no program"),
        }
    }

    /// Its budgets.
    pub fn limits(&self) -> Limits {
        Limits {
            fuel_per_packet: self.fuel_per_packet,
            fuel_per_period: self.fuel_per_period,
            memory_bytes: (self.memory_kib * 1024) as usize,
        }
    }
}

/// A program's budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel of one run (one frame).
    pub fuel_per_packet: u64,
    /// Fuel of all runs in one [`PERIOD`].
    pub fuel_per_period: u64,
    /// Linear memory, bytes.
    pub memory_bytes: usize,
}

/// Which hook a frame goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A frame a VM of the tenant sent.
    Egress,
    /// A frame for a VM of the tenant.
    Ingress,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The frame goes on (possibly modified).
    Pass,
    /// The frame is dropped for this reason: the program's choice or its fault.
    Drop(DropReason),
}

/// A program's counters, as `/stats` shows them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OffloadStats {
    /// Runs (frames handed to a hook).
    pub runs: u64,
    /// Frames the program dropped (a nonzero result).
    pub dropped: u64,
    /// Runs stopped out of per-packet fuel, of period fuel, at the memory cap, or by a trap;
    /// `out_of_budget` also counts frames dropped without a run, the period's fuel spent.
    pub out_of_fuel: u64,
    pub out_of_budget: u64,
    pub memory_faults: u64,
    pub traps: u64,
    /// Frames the program emitted.
    pub emitted: u64,
    /// Fuel used (with [`CALL_FUEL`] a run), and the CPU it was charged as, ns.
    pub fuel: u64,
    pub cpu_ns: u64,
    /// The program's `count` slots that are not zero: (slot, value).
    pub counters: Vec<(usize, u64)>,
}

/// What a run sees through the host API: its frame, memory, counters and emitted frames.
struct Host {
    limits: StoreLimits,
    frame: Option<Frame>,
    memory: Option<Memory>,
    counters: [u64; COUNTERS],
    emitted: Vec<Vec<u8>>,
}

/// One tenant's loaded program.
pub struct Program {
    store: Store<Host>,
    egress: Option<TypedFunc<i32, i32>>,
    ingress: Option<TypedFunc<i32, i32>>,
    limits: Limits,
    /// Fuel left in the current period, and when the next period starts.
    period_fuel: u64,
    next_period: Instant,
    ps_per_fuel: u64,
    stats: OffloadStats,
}

/// The interpreter configuration every program runs with: fuel metering on, code translated
/// when loaded (not on first call, whose cost would land on a frame).
pub fn engine() -> WasmEngine {
    let mut config = Config::default();
    config.consume_fuel(true);
    config.compilation_mode(CompilationMode::Eager);
    WasmEngine::new(&config)
}

impl Program {
    /// Loads `code` (WebAssembly text or binary) with `limits`, starting its first period
    /// at `now`; each unit of fuel is charged as `ps_per_fuel` ps of CPU. Fails for a program
    /// that does not validate, imports anything but the host API, exports neither hook (or
    /// one of another type), needs more memory than allowed, or whose start function fails
    /// within one packet's fuel.
    pub fn load(
        engine: &WasmEngine,
        code: &[u8],
        limits: Limits,
        ps_per_fuel: u64,
        now: Instant,
    ) -> anyhow::Result<Program> {
        anyhow::ensure!(
            code.len() <= MAX_PROGRAM_BYTES,
            "program of {} bytes (at most {MAX_PROGRAM_BYTES})",
            code.len()
        );
        anyhow::ensure!(limits.fuel_per_packet > 0, "fuel_per_packet must be > 0");
        let module = Module::new(engine, code).map_err(|e| anyhow::anyhow!("program: {e}"))?;
        let host = Host {
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .memories(1)
                .tables(1)
                .table_elements(4096)
                .instances(1)
                .trap_on_grow_failure(true)
                .build(),
            frame: None,
            memory: None,
            counters: [0; COUNTERS],
            emitted: Vec::with_capacity(MAX_EMITS),
        };
        let mut store = Store::new(engine, host);
        store.limiter(|h| &mut h.limits);
        store.set_fuel(limits.fuel_per_packet)?;
        let instance = host_api(engine)?
            .instantiate_and_start(&mut store, &module)
            .map_err(|e| anyhow::anyhow!("program: {e}"))?;
        let memory = instance.get_memory(&store, "memory");
        store.data_mut().memory = memory;
        let hook = |name: &str| -> anyhow::Result<Option<TypedFunc<i32, i32>>> {
            match instance.get_func(&store, name) {
                None => Ok(None),
                Some(f) => f
                    .typed::<i32, i32>(&store)
                    .map(Some)
                    .map_err(|_| anyhow::anyhow!("program: `{name}` must be (i32) -> i32")),
            }
        };
        let (egress, ingress) = (hook("egress")?, hook("ingress")?);
        anyhow::ensure!(
            egress.is_some() || ingress.is_some(),
            "program: exports neither `egress` nor `ingress`"
        );
        Ok(Program {
            store,
            egress,
            ingress,
            limits,
            period_fuel: limits.fuel_per_period,
            next_period: now + PERIOD,
            ps_per_fuel,
            stats: OffloadStats::default(),
        })
    }

    /// Whether the program has `hook`.
    pub fn has(&self, hook: Hook) -> bool {
        match hook {
            Hook::Egress => self.egress.is_some(),
            Hook::Ingress => self.ingress.is_some(),
        }
    }

    /// Runs `hook` on `frame` at `now`. Returns the frame (as the program left it), the
    /// verdict and the CPU the run is charged, ns; frames the program emitted are appended to
    /// `emitted`. A frame arriving with the period's fuel spent is dropped without a run.
    pub fn run(
        &mut self,
        now: Instant,
        hook: Hook,
        frame: Frame,
        emitted: &mut Vec<Vec<u8>>,
    ) -> (Frame, Verdict, u64) {
        let func = match hook {
            Hook::Egress => self.egress,
            Hook::Ingress => self.ingress,
        };
        let Some(func) = func else {
            return (frame, Verdict::Pass, 0);
        };
        self.refill(now);
        self.stats.runs += 1;
        if self.period_fuel <= CALL_FUEL {
            self.period_fuel = 0;
            self.stats.out_of_budget += 1;
            return (frame, Verdict::Drop(DropReason::OffloadBudget), 0);
        }
        let given = self
            .limits
            .fuel_per_packet
            .min(self.period_fuel - CALL_FUEL);
        // Cannot fail: fuel metering is on for every program's engine.
        let _ = self.store.set_fuel(given);
        let len = frame.len() as i32;
        self.store.data_mut().frame = Some(frame);
        let result = func.call(&mut self.store, len);
        let used = given - self.store.get_fuel().unwrap_or(0) + CALL_FUEL;
        let host = self.store.data_mut();
        let frame = host
            .frame
            .take()
            .expect("the host API never takes the frame");
        self.stats.emitted += host.emitted.len() as u64;
        emitted.append(&mut host.emitted);
        // A fault counts the packet's whole fuel against the period (see the module doc).
        let faulted = matches!(&result, Err(e) if e.as_trap_code() != Some(TrapCode::OutOfFuel));
        let counted = if faulted {
            used.max(self.limits.fuel_per_packet)
        } else {
            used
        };
        self.period_fuel = self.period_fuel.saturating_sub(counted);
        let verdict = match result {
            Ok(0) => Verdict::Pass,
            Ok(_) => {
                self.stats.dropped += 1;
                Verdict::Drop(DropReason::OffloadDrop)
            }
            Err(e) => Verdict::Drop(match e.as_trap_code() {
                Some(TrapCode::OutOfFuel) if given < self.limits.fuel_per_packet => {
                    self.stats.out_of_budget += 1;
                    DropReason::OffloadBudget
                }
                Some(TrapCode::OutOfFuel) => {
                    self.stats.out_of_fuel += 1;
                    DropReason::OffloadFuel
                }
                Some(TrapCode::GrowthOperationLimited) => {
                    self.stats.memory_faults += 1;
                    DropReason::OffloadMemory
                }
                _ => {
                    self.stats.traps += 1;
                    DropReason::OffloadTrap
                }
            }),
        };
        let cpu_ns = used * self.ps_per_fuel / 1000;
        self.stats.fuel += used;
        self.stats.cpu_ns += cpu_ns;
        (frame, verdict, cpu_ns)
    }

    /// Starts the periods that began by `now`, with a full budget.
    pub fn refill(&mut self, now: Instant) {
        if now >= self.next_period {
            self.period_fuel = self.limits.fuel_per_period;
            let periods = (now - self.next_period).as_nanos() / PERIOD.as_nanos() + 1;
            self.next_period += Duration::from_nanos(periods * PERIOD.as_nanos());
        }
    }

    /// When the budget is back if the current period's is spent at `now` (the tenant's
    /// ports are held until then), else None.
    pub fn spent_until(&self, now: Instant) -> Option<Instant> {
        self.budget_back_at().filter(|&at| now < at)
    }

    /// When the budget is back if the period's is spent (a time already past until the
    /// next [`Program::refill`]).
    pub fn budget_back_at(&self) -> Option<Instant> {
        (self.period_fuel == 0).then_some(self.next_period)
    }

    /// Charges each unit of fuel as `ps` ps of CPU from now on.
    pub fn set_ps_per_fuel(&mut self, ps: u64) {
        self.ps_per_fuel = ps;
    }

    /// The program's counters.
    pub fn stats(&self) -> OffloadStats {
        let mut s = self.stats.clone();
        s.counters = (self.store.data().counters.iter().copied().enumerate())
            .filter(|&(_, n)| n != 0)
            .collect();
        s
    }
}

/// Whether `entry`'s program loads (the API's check before it attaches one).
pub fn check(entry: &OffloadEntry) -> anyhow::Result<()> {
    let code = entry.code()?;
    Program::load(
        &engine(),
        &code,
        entry.limits(),
        DEFAULT_PS_PER_FUEL,
        Instant::ZERO,
    )?;
    Ok(())
}

/// The host API, and nothing else, under module `picnic`.
fn host_api(engine: &WasmEngine) -> anyhow::Result<Linker<Host>> {
    let mut linker = Linker::new(engine);
    linker.func_wrap("picnic", "frame_len", |caller: Caller<'_, Host>| -> i32 {
        caller.data().frame.as_ref().map_or(0, |f| f.len() as i32)
    })?;
    linker.func_wrap(
        "picnic",
        "load",
        |mut caller: Caller<'_, Host>, offset: i32, ptr: i32, n: i32| -> i32 {
            let Some(memory) = caller.data().memory else {
                return -1;
            };
            let (mem, host) = memory.data_and_store_mut(&mut caller);
            let Some(frame) = host.frame.as_ref() else {
                return -1;
            };
            match (span(offset, n, frame.len()), span(ptr, n, mem.len())) {
                (Some(src), Some(dst)) => {
                    mem[dst].copy_from_slice(&frame.data()[src]);
                    n
                }
                _ => -1,
            }
        },
    )?;
    linker.func_wrap(
        "picnic",
        "store",
        |mut caller: Caller<'_, Host>, offset: i32, ptr: i32, n: i32| -> i32 {
            let Some(memory) = caller.data().memory else {
                return -1;
            };
            let (mem, host) = memory.data_and_store_mut(&mut caller);
            let Some(frame) = host.frame.as_mut() else {
                return -1;
            };
            match (span(offset, n, frame.len()), span(ptr, n, mem.len())) {
                (Some(dst), Some(src)) => {
                    frame.data_mut()[dst].copy_from_slice(&mem[src]);
                    n
                }
                _ => -1,
            }
        },
    )?;
    linker.func_wrap(
        "picnic",
        "set_len",
        |mut caller: Caller<'_, Host>, n: i32| -> i32 {
            let Some(frame) = caller.data_mut().frame.as_mut() else {
                return -1;
            };
            // Within the room a received frame has; bytes it extends into are zeroed (the
            // buffer held other frames, maybe other tenants').
            let room = DATA_CAP.min(FRAME_CAP - frame.headroom());
            match usize::try_from(n) {
                Ok(len) if len <= room => {
                    let old = frame.len();
                    if len > old {
                        frame.data_and_tail_mut()[old..len].fill(0);
                    }
                    frame.set_len(len);
                    n
                }
                _ => -1,
            }
        },
    )?;
    linker.func_wrap(
        "picnic",
        "count",
        |mut caller: Caller<'_, Host>, slot: i32, n: i64| {
            if let Some(c) = usize::try_from(slot)
                .ok()
                .and_then(|s| caller.data_mut().counters.get_mut(s))
            {
                *c = c.wrapping_add(n as u64);
            }
        },
    )?;
    linker.func_wrap(
        "picnic",
        "emit",
        |mut caller: Caller<'_, Host>, ptr: i32, n: i32| -> i32 {
            let Some(memory) = caller.data().memory else {
                return -1;
            };
            let (mem, host) = memory.data_and_store_mut(&mut caller);
            match span(ptr, n, mem.len()) {
                Some(src)
                    if host.emitted.len() < MAX_EMITS && (14..=DATA_CAP).contains(&src.len()) =>
                {
                    host.emitted.push(mem[src].to_vec());
                    0
                }
                _ => -1,
            }
        },
    )?;
    Ok(linker)
}

/// `start..start + n` when it lies within `0..len`.
fn span(start: i32, n: i32, len: usize) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(start).ok()?;
    let end = start.checked_add(usize::try_from(n).ok()?)?;
    (end <= len).then_some(start..end)
}

/// Measures the interpreter's speed on this machine: ps of CPU per unit of fuel, from a
/// tight loop of about 1e6 instructions (the best of 5 runs).
pub fn calibrate() -> u64 {
    const LOOP: &str = r#"(module
        (func (export "egress") (param i32) (result i32) (local i32)
          (local.set 1 (i32.const 200000))
          (loop (local.set 1 (i32.sub (local.get 1) (i32.const 1)))
                (br_if 0 (local.get 1)))
          (i32.const 0)))"#;
    let engine = engine();
    let limits = Limits {
        fuel_per_packet: u64::MAX / 4,
        fuel_per_period: u64::MAX / 2,
        memory_bytes: 0,
    };
    let Ok(mut program) = Program::load(&engine, LOOP.as_bytes(), limits, 1000, Instant::ZERO)
    else {
        return DEFAULT_PS_PER_FUEL;
    };
    let mut pool = crate::frame::FramePool::new(1);
    let Some(mut frame) = pool.get() else {
        return DEFAULT_PS_PER_FUEL;
    };
    let mut best = u64::MAX;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        let (f, _, _) = program.run(Instant::ZERO, Hook::Egress, frame, &mut Vec::new());
        frame = f;
        let ns = start.elapsed().as_nanos() as u64;
        let fuel = std::mem::take(&mut program.stats.fuel).max(1);
        best = best.min(ns * 1000 / fuel);
    }
    best.max(1)
}

/// ps per unit of fuel when not measured: wasmi 1.1 on the 2-core development machine.
pub const DEFAULT_PS_PER_FUEL: u64 = 1500;

#[cfg(test)]
#[path = "offload_tests.rs"]
mod tests;
