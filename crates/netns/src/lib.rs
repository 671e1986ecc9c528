//! picnic-netns: network namespaces, veth pairs, bridges and HTB shaping, driven through
//! `ip`, `tc`, `bridge` and `ethtool`, plus running code inside a namespace. The lab's
//! testbeds and the benchmark's are built with it.
//!
//! Every object the lab creates lives inside a namespace named `pn-<run id>-...`; links are
//! created directly inside their namespaces (`ip -n NS link add ... peer ... netns NS2`), so
//! deleting the namespaces removes everything and nothing is left in the root namespace.
//! The run id starts with the creating process id, which lets [`cleanup_stale`] remove the
//! leftovers of crashed runs without touching those of a run still alive.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

/// Prefix of every namespace the lab creates.
pub const PREFIX: &str = "pn-";

/// Namespaces alive in this process, deleted by the Ctrl-C handler.
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static CTRLC: Once = Once::new();
static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs `program args...`; on failure the error shows the command line and its stderr.
pub fn cmd(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| missing_tool_error(program, e))?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            program,
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip -n NS args...`.
pub fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    cmd("ip", &full)
}

/// Runs `tc -n NS args...`.
pub fn tc(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    cmd("tc", &full)
}

/// Runs `bridge -n NS args...`.
pub fn bridge(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    cmd("bridge", &full)
}

/// The Debian package that provides a tool the lab runs.
pub fn debian_package(tool: &str) -> &'static str {
    match tool {
        "ip" | "tc" | "bridge" => "iproute2",
        "ethtool" => "ethtool",
        "iperf3" => "iperf3",
        "sockperf" => "sockperf",
        "memcached" => "memcached",
        _ => "the package providing it",
    }
}

fn missing_tool_error(program: &str, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow!(
            "`{program}` is not installed: install the Debian package `{}` (scripts/setup.sh does)",
            debian_package(program)
        )
    } else {
        anyhow!("cannot run `{program}`: {e}")
    }
}

/// True when `tool` is found on PATH.
pub fn have_tool(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// Fails with a clear message unless the process runs as root and every tool is installed.
pub fn preflight(tools: &[&str]) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("picnic lab needs root (it creates network namespaces): run it with sudo");
    }
    for tool in tools {
        if !have_tool(tool) {
            bail!(
                "`{tool}` is not installed: install the Debian package `{}` (scripts/setup.sh does)",
                debian_package(tool)
            );
        }
    }
    Ok(())
}

/// Names of all namespaces (`ip netns list`).
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = cmd("ip", &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// Deletes `pn-*` namespaces whose creating process is gone (leftovers of a crashed run).
/// Returns the names removed.
pub fn cleanup_stale() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        let Some(pid) = creator_pid(&ns) else {
            continue;
        };
        let ours = pid == std::process::id().to_string();
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        // Gone creator: a crashed run. Our own pid but unregistered: a leaked earlier testbed.
        if !alive || (ours && !is_live(&ns)) {
            cmd("ip", &["netns", "del", &ns])?;
            removed.push(ns);
        }
    }
    Ok(removed)
}

/// The creating pid of a namespace named by a [`Testbed`] (`pn-<pid>x<counter>-<role>`);
/// None for any other name, so namespaces of other tools are never touched.
pub fn creator_pid(ns: &str) -> Option<&str> {
    let (id, _role) = ns.strip_prefix(PREFIX)?.split_once('-')?;
    let (pid, counter) = id.split_once('x')?;
    (is_number(pid) && is_number(counter)).then_some(pid)
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_live(ns: &str) -> bool {
    LIVE.lock().map(|l| l.contains(ns)).unwrap_or(false)
}

fn install_ctrlc_handler() {
    CTRLC.call_once(|| {
        let result = ctrlc::set_handler(|| {
            eprintln!("picnic lab: interrupted, tearing down the testbed");
            let names: Vec<String> = LIVE
                .lock()
                .map(|l| l.iter().cloned().collect())
                .unwrap_or_default();
            for ns in names {
                let _ = cmd("ip", &["netns", "del", &ns]);
            }
            std::process::exit(130);
        });
        if let Err(e) = result {
            eprintln!("picnic lab: cannot install the Ctrl-C handler ({e}); Ctrl-C will leave namespaces behind until the next run");
        }
    });
}

/// Owns the namespaces of one testbed; dropping it deletes them (and so every link in them).
pub struct Testbed {
    run_id: String,
    namespaces: Vec<String>,
}

impl Testbed {
    /// Starts a testbed: removes stale leftovers, installs the Ctrl-C teardown and picks a
    /// run id `<pid>x<counter>`.
    pub fn new() -> Result<Testbed> {
        cleanup_stale().context("removing leftovers of an earlier run")?;
        install_ctrlc_handler();
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        Ok(Testbed {
            run_id: format!("{}x{}", std::process::id(), n),
            namespaces: Vec::new(),
        })
    }

    /// The run id that every namespace name of this testbed contains.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The full namespace name for a role such as `fabric` or `h-h1`.
    pub fn ns_name(&self, role: &str) -> String {
        format!("{PREFIX}{}-{role}", self.run_id)
    }

    /// Creates namespace `pn-<run id>-<role>` with loopback up and IPv6 off (no DAD or
    /// router-solicitation noise in measurements) and TCP ECN requested; returns its name.
    pub fn add_namespace(&mut self, role: &str) -> Result<String> {
        let name = self.ns_name(role);
        LIVE.lock()
            .map_err(|_| anyhow!("lock poisoned"))?
            .insert(name.clone());
        cmd("ip", &["netns", "add", &name])?;
        self.namespaces.push(name.clone());
        ip(&name, &["link", "set", "lo", "up"])?;
        in_netns(&name, || {
            std::fs::write("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1")
                .and_then(|_| std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"))
                .context("disabling IPv6")?;
            // Tenant TCP asks for ECN, so queues that mark (picnic's limiters) slow it down
            // without losses; a peer or path that does not mark is unaffected.
            std::fs::write("/proc/sys/net/ipv4/tcp_ecn", "1").context("enabling TCP ECN")
        })??;
        Ok(name)
    }

    /// Namespaces created so far, in creation order.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Deletes every namespace of this testbed (also done by Drop); returns the first error.
    pub fn teardown(&mut self) -> Result<()> {
        let mut first_err = None;
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = cmd("ip", &["netns", "del", &ns]) {
                first_err.get_or_insert(e);
            }
            if let Ok(mut live) = LIVE.lock() {
                live.remove(&ns);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("picnic lab: teardown: {e:#}");
        }
    }
}

/// Creates a veth pair with end `a` in namespace `ns_a` and end `b` in `ns_b`.
pub fn add_veth(ns_a: &str, a: &str, ns_b: &str, b: &str) -> Result<()> {
    add_veth_queues(ns_a, a, ns_b, b, 1)
}

/// A veth pair as [`add_veth`] with `queues` receive and transmit queues on each end, as a
/// multi-queue NIC has: a veth delivers a frame on the peer's queue of the index it was sent
/// on, which the sender's stack picks by flow hash (RSS-like spreading).
pub fn add_veth_queues(ns_a: &str, a: &str, ns_b: &str, b: &str, queues: usize) -> Result<()> {
    let q = queues.max(1).to_string();
    ip(
        ns_a,
        &[
            "link",
            "add",
            a,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            ns_b,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ],
    )
    .map(drop)
}

/// Makes `dev` in `ns` transmit on queue q whatever CPU q sends (transmit packet steering,
/// `xps_cpus`), for queues 0..`queues`: on a veth the peer then receives it on its queue q.
pub fn steer_queues_by_cpu(ns: &str, dev: &str, queues: usize) -> Result<()> {
    for q in 0..queues {
        let script = format!(
            "echo {} > /sys/class/net/{dev}/queues/tx-{q}/xps_cpus",
            cpus_mask(&[q])
        );
        // `ip netns exec` mounts the namespace's own /sys, where its devices are.
        cmd("ip", &["netns", "exec", ns, "sh", "-c", &script])?;
    }
    Ok(())
}

/// Makes the frames `dev` in `ns` receives be processed (the kernel's receive softirq: IP,
/// UDP, the socket's queue and its reader's wake-up) on `cpus` (receive packet steering,
/// `rps_cpus` of each of its `queues` receive queues) rather than on the CPU that sent them.
pub fn steer_rx_to_cpus(ns: &str, dev: &str, queues: usize, cpus: &[usize]) -> Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    let mask = cpus_mask(cpus);
    for q in 0..queues.max(1) {
        let script = format!("echo {mask} > /sys/class/net/{dev}/queues/rx-{q}/rps_cpus");
        cmd("ip", &["netns", "exec", ns, "sh", "-c", &script])?;
    }
    Ok(())
}

/// The kernel's CPU mask syntax for the CPUs `cpus`: hex, in comma-separated 32-bit words,
/// the highest first.
fn cpus_mask(cpus: &[usize]) -> String {
    let top = cpus.iter().copied().max().unwrap_or(0);
    let mut words = vec![0u32; top / 32 + 1];
    for &c in cpus {
        words[c / 32] |= 1 << (c % 32);
    }
    words
        .iter()
        .rev()
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                format!("{w:x}")
            } else {
                format!("{w:08x}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Sets a link's MAC address, MTU and brings it up.
pub fn configure_link(ns: &str, dev: &str, mac: &str, mtu: u32) -> Result<()> {
    ip(
        ns,
        &[
            "link",
            "set",
            "dev",
            dev,
            "address",
            mac,
            "mtu",
            &mtu.to_string(),
        ],
    )?;
    link_up(ns, dev)
}

/// Brings a link up.
pub fn link_up(ns: &str, dev: &str) -> Result<()> {
    ip(ns, &["link", "set", "dev", dev, "up"]).map(drop)
}

/// Adds an address in CIDR notation (`198.18.1.1/16`) to a link.
pub fn add_address(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    ip(ns, &["addr", "add", cidr, "dev", dev]).map(drop)
}

/// Creates a bridge with STP off (ports forward at once) and multicast snooping off (the
/// bridge then sends no IGMP reports of its own onto its ports), and brings it up.
pub fn add_bridge(ns: &str, name: &str) -> Result<()> {
    ip(
        ns,
        &[
            "link",
            "add",
            "name",
            name,
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
        ],
    )?;
    link_up(ns, name)
}

/// Enslaves `dev` to bridge `br`.
pub fn enslave(ns: &str, dev: &str, br: &str) -> Result<()> {
    ip(ns, &["link", "set", "dev", dev, "master", br]).map(drop)
}

/// Shapes the egress of `dev` to `rate_mbps` with HTB: a root htb, one class at
/// rate = ceil with a burst of 1 ms at that rate (at least 2 full frames; covers the timer
/// slack of these VMs, DESIGN.md 7), and a bfifo leaf holding `queue_bytes`, so the queue
/// and the delay it adds (queue_bytes / rate) are bounded.
pub fn shape_htb(ns: &str, dev: &str, rate_mbps: u64, queue_bytes: u64) -> Result<()> {
    let rate = format!("{rate_mbps}mbit");
    let burst = (rate_mbps * 1_000_000 / 8 / 1000).max(2 * 1514).to_string();
    tc(
        ns,
        &[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
        ],
    )?;
    tc(
        ns,
        &[
            "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", &rate,
            "ceil", &rate, "burst", &burst, "cburst", &burst,
        ],
    )?;
    tc(
        ns,
        &[
            "qdisc",
            "add",
            "dev",
            dev,
            "parent",
            "1:10",
            "handle",
            "10:",
            "bfifo",
            "limit",
            &queue_bytes.to_string(),
        ],
    )
    .map(drop)
}

/// Turns transmit checksum offload off (`ethtool -K dev tx off`, which also turns TSO off):
/// for forwarders that pass frames as they are (the benchmark's raw and OVS baselines) and
/// for comparisons. picnic's ports complete checksums and segment super-frames themselves.
pub fn tx_offload_off(ns: &str, dev: &str) -> Result<()> {
    cmd(
        "ip",
        &["netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"],
    )
    .map(drop)
}

/// Builds a `Command` running `program` inside namespace `ns` (`ip netns exec`), for
/// external tools such as iperf3.
pub fn exec_in(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// Moves the calling thread into namespace `ns` (sockets created afterwards belong to it).
fn enter_netns(ns: &str) -> Result<()> {
    let path = format!("/var/run/netns/{ns}");
    let file = File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: setns on a valid namespace fd only changes this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns into {ns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread inside namespace `ns` and waits for its result.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    spawn_in_netns(ns, f)?.join()
}

/// A thread running inside a namespace; see [`spawn_in_netns`].
pub struct NsThread<T> {
    ns: String,
    handle: std::thread::JoinHandle<Result<T>>,
}

impl<T> NsThread<T> {
    /// Waits for the thread; fails if it could not enter the namespace or panicked.
    pub fn join(self) -> Result<T> {
        self.handle
            .join()
            .map_err(|_| anyhow!("thread in namespace {} panicked", self.ns))?
    }
}

/// Spawns a thread inside namespace `ns` running `f`. Sockets it creates stay in `ns`, and
/// threads it spawns start in `ns` too.
pub fn spawn_in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<NsThread<T>> {
    let ns_owned = ns.to_owned();
    let handle = std::thread::Builder::new()
        // The role (`h-h1`, `v-vclient`) fits the kernel's 15-character thread names, so
        // `top -H` and `perf sched` tell the threads apart.
        .name(ns.splitn(3, '-').nth(2).unwrap_or(ns).to_owned())
        .spawn(move || enter_netns(&ns_owned).map(|()| f()))
        .context("spawning a thread")?;
    Ok(NsThread {
        ns: ns.to_owned(),
        handle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_testbed_names_are_claimed() {
        assert_eq!(creator_pid("pn-1234x0-fabric"), Some("1234"));
        assert_eq!(creator_pid("pn-1234x12-v-a_b"), Some("1234"));
        assert_eq!(creator_pid("pn-t-30640-0-44a7100"), None);
        assert_eq!(creator_pid("pn-12x-fabric"), None);
        assert_eq!(creator_pid("other-1234x0-fabric"), None);
    }

    #[test]
    fn cpu_masks_are_hex_in_32_bit_words_most_significant_first() {
        assert_eq!(cpus_mask(&[0]), "1");
        assert_eq!(cpus_mask(&[5]), "20");
        assert_eq!(cpus_mask(&[31]), "80000000");
        assert_eq!(cpus_mask(&[32]), "1,00000000");
        assert_eq!(cpus_mask(&[70]), "40,00000000,00000000");
        assert_eq!(cpus_mask(&[0, 1]), "3");
        assert_eq!(cpus_mask(&[1, 33]), "2,00000002");
    }
}
