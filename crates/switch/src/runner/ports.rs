//! The switch's ports: opening them as the config says (the uplink with a port per worker
//! where the backend allows it), the largest frame a VM port takes, and the ports as the
//! driver's [`Io`].

use anyhow::Context;
use picnic_core::notify::AdaptiveWait;
use picnic_core::Instant;
use picnic_wire::overlay::ENCAP_OVERHEAD;

use super::SpinWork;
use crate::config::{Backend, Config};
use crate::directory::{PortIdx, UPLINK};
use crate::driver::Io;
use crate::ebpf::EarlyDrop;
use crate::engine::Work;
use crate::frame::{Frame, FramePool};
use crate::port::{
    send_or_drop, tap_state, AfPacketOptions, AfPacketPort, AfXdpOptions, AfXdpPort, Port,
    QueueSet, TapHostPort, TapPort, TapState, VhostUserPort,
};

/// The ports as the driver's [`Io`]: each read feeds the adaptive wait of the port's ring.
pub(super) struct PortIo<'a> {
    pub(super) ports: &'a mut [Option<Box<dyn Port>>],
    pub(super) waits: &'a mut [(AdaptiveWait, u64)],
    pub(super) work: &'a mut SpinWork,
}

impl Io for PortIo<'_> {
    fn recv(
        &mut self,
        now: Instant,
        port: PortIdx,
        pool: &mut FramePool,
        rx: &mut Vec<Frame>,
        max: usize,
    ) -> anyhow::Result<usize> {
        let Some(p) = self.ports[port].as_mut() else {
            return Ok(0);
        };
        let n = p
            .recv_batch(pool, rx, max)
            .with_context(|| format!("receive on {}", p.name()))?;
        if n > 0 {
            let (wait, seen) = &mut self.waits[port];
            *seen += n as u64;
            wait.observe(now, *seen);
        }
        Ok(n)
    }

    fn send(
        &mut self,
        port: PortIdx,
        queue: &mut Vec<Frame>,
        pool: &mut FramePool,
    ) -> anyhow::Result<()> {
        match self.ports[port].as_mut() {
            Some(p) => send_or_drop(p.as_mut(), port == UPLINK, queue, pool)?,
            None => queue.drain(..).for_each(|f| pool.put(f)),
        }
        Ok(())
    }

    fn work(&mut self) -> &mut dyn Work {
        self.work
    }
}

/// Opens a port with the backend the config names, with an error that says what to fix.
/// GSO super-frames read on it are segmented into frames of at most `max_frame` bytes
/// ([`vm_max_frame`] for VM ports). `create` (a TAP backend only): create the TAP if missing.
pub fn open_port(
    ifname: &str,
    backend: Backend,
    create: bool,
    field: &str,
    max_frame: usize,
) -> anyhow::Result<Box<dyn Port>> {
    let af_packet = AfPacketOptions {
        max_frame,
        ..Default::default()
    };
    let port: Box<dyn Port> = match backend {
        Backend::AfPacket => Box::new(
            AfPacketPort::open(ifname, af_packet)
                .with_context(|| format!("{field}: cannot open '{ifname}'"))?,
        ),
        Backend::AfXdp => Box::new(
            AfXdpPort::open(ifname, AfXdpOptions::default())
                .with_context(|| format!("{field}: cannot open '{ifname}' with AF_XDP"))?,
        ),
        Backend::Tap => Box::new(
            TapHostPort::open(ifname, create, af_packet)
                .with_context(|| format!("{field}: cannot attach to TAP '{ifname}'"))?,
        ),
        Backend::TapQueue => {
            // TUNSETIFF would create a missing device: only when the config asks.
            if !create && tap_state(ifname).ok() == Some(TapState::Missing) {
                anyhow::bail!(
                    "{field}: TAP '{ifname}' not found: create it (ip tuntap add dev {ifname} \
                     mode tap) or set port.create = true"
                );
            }
            Box::new(
                TapPort::open(ifname, max_frame)
                    .with_context(|| format!("{field}: cannot open TAP '{ifname}'"))?,
            )
        }
        Backend::VhostUser => {
            anyhow::bail!("{field}: '{ifname}': a vhost_user port is opened with its socket")
        }
        Backend::Memory => {
            anyhow::bail!("{field}: '{ifname}': memory ports are made in-process, not opened")
        }
    };
    Ok(port)
}

/// Opens a VM's port: on its socket for `vhost_user`, else as [`open_port`] does.
pub fn open_vm_port(spec: &PortSpec) -> anyhow::Result<Box<dyn Port>> {
    match (spec.backend, &spec.socket) {
        (Backend::VhostUser, Some(socket)) => Ok(Box::new(
            VhostUserPort::open(&spec.ifname, socket, spec.max_frame)
                .with_context(|| format!("{}: cannot serve vhost-user", spec.field))?,
        )),
        _ => open_port(
            &spec.ifname,
            spec.backend,
            spec.create,
            &spec.field,
            spec.max_frame,
        ),
    }
}

/// The longest frame a VM may send that still fits the uplink once encapsulated (the
/// engine's egress check); VM ports segment super-frames to it.
pub fn vm_max_frame(cfg: &Config) -> usize {
    (cfg.uplink.mtu + 14).saturating_sub(ENCAP_OVERHEAD)
}

/// [`vm_max_frame`] for a VM of `tenant`: less the sealing overhead when the tenant
/// encrypts.
pub(super) fn vm_max_frame_of(cfg: &Config, tenant: &str) -> usize {
    let encrypts = cfg.tenants.iter().any(|t| t.name == tenant && t.encrypt);
    vm_max_frame(cfg).saturating_sub(if encrypts {
        picnic_wire::seal::SEAL_OVERHEAD
    } else {
        0
    })
}

/// The tenant ports (every port but the uplink) as (interface name, slot = port index).
pub(crate) fn tenant_ports(ports: &[Option<Box<dyn Port>>]) -> Vec<(String, u32)> {
    ports
        .iter()
        .enumerate()
        .skip(1)
        .filter_map(|(i, p)| Some((p.as_ref()?.name().to_string(), i as u32)))
        .collect()
}

/// A port to open for a VM: interface, backend, the config field that names it (for the
/// error) and the largest frame it takes.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub ifname: String,
    pub backend: Backend,
    /// Create the TAP if missing (`port.create`).
    pub create: bool,
    /// The socket of a `vhost_user` port (`port.socket`).
    pub socket: Option<std::path::PathBuf>,
    pub field: String,
    pub max_frame: usize,
}

/// How the switch opens a new VM's port at a live change: [`open_port`] unless set otherwise
/// ([`crate::runner::Switch::set_port_opener`]: tests hand out in-memory ports).
pub type PortOpener =
    std::sync::Arc<dyn Fn(&PortSpec) -> anyhow::Result<Box<dyn Port>> + Send + Sync>;

/// The opener of real ports.
pub(super) fn real_opener() -> PortOpener {
    std::sync::Arc::new(open_vm_port)
}

/// The uplink's ports (one per worker where the backend allows it) and, for AF_XDP, the
/// maps of its early drop.
type Uplinks = (Vec<Box<dyn Port>>, Option<EarlyDrop>);

/// Opens the uplink; an AF_XDP uplink also gives the maps of its early drop. With several
/// workers, one port per worker where the backend allows it: AF_PACKET sockets joined in
/// one `PACKET_FANOUT` hash group (the kernel spreads frames by flow hash, so a flow stays on
/// one socket); AF_XDP one socket on every NIC queue (RSS spreads flows over the queues; a
/// queue without a socket would bypass the switch), queue `q` read by worker `q % workers`,
/// several queues of one worker as one [`QueueSet`] (workers beyond the queues get their
/// frames handed over). A TAP uplink has one socket, read by worker 0.
///
/// Without a configured backend the uplink is AF_XDP where it can be (issue 13: the XDP
/// program drops throttled VMs' frames before any work, Iron 3.3), else AF_PACKET, with one
/// line saying why.
pub fn open_uplinks(cfg: &Config, workers: usize) -> anyhow::Result<Uplinks> {
    let ifname = &cfg.uplink.ifname;
    let backend = match cfg.uplink.backend {
        Some(backend) => backend,
        None if !crate::ebpf::programs_built() => {
            tracing::warn!(
                "uplink '{ifname}': AF_PACKET (this build has no eBPF programs: \
                 clang was missing; AF_XDP and early drop are off)"
            );
            Backend::AfPacket
        }
        None => match open_uplinks_with(cfg, Backend::AfXdp, workers) {
            Ok(uplinks) => return Ok(uplinks),
            Err(e) => {
                tracing::warn!(
                    "uplink '{ifname}': AF_XDP unavailable ({e:#}); using \
                     AF_PACKET (set uplink.backend to choose)"
                );
                Backend::AfPacket
            }
        },
    };
    open_uplinks_with(cfg, backend, workers)
}

/// [`open_uplinks`] with `backend`.
fn open_uplinks_with(cfg: &Config, backend: Backend, workers: usize) -> anyhow::Result<Uplinks> {
    let ifname = &cfg.uplink.ifname;
    match backend {
        Backend::AfXdp => {
            let mut sockets = AfXdpPort::open_queues(ifname, AfXdpOptions::default())
                .with_context(|| format!("uplink.ifname: cannot open '{ifname}' with AF_XDP"))?;
            let early = sockets[0].early_drop();
            // Queue q to worker q % workers (queue 0, whose port holds the XDP program, to
            // worker 0); a worker with several queues reads them as one QueueSet.
            let owners = workers.clamp(1, sockets.len());
            let mut mine: Vec<Vec<Box<dyn Port>>> = (0..owners).map(|_| Vec::new()).collect();
            for (q, socket) in sockets.into_iter().enumerate() {
                mine[q % owners].push(Box::new(socket));
            }
            let uplinks = mine
                .into_iter()
                .map(|mut queues| match queues.len() {
                    1 => Ok(queues.pop().expect("one queue")),
                    _ => QueueSet::new(queues)
                        .map(|set| Box::new(set) as Box<dyn Port>)
                        .with_context(|| format!("uplink.ifname: epoll over '{ifname}' queues")),
                })
                .collect::<anyhow::Result<_>>()?;
            Ok((uplinks, early))
        }
        Backend::AfPacket if workers > 1 => {
            // A group id of this process's own (one switch per network namespace).
            let group = (std::process::id() & 0xffff) as u16;
            let mut sockets = Vec::with_capacity(workers);
            for _ in 0..workers {
                let port = open_port(ifname, backend, false, "uplink.ifname", cfg.uplink.mtu + 14)?;
                let fd = port.raw_fd().expect("an AF_PACKET port has a descriptor");
                crate::port::join_fanout(fd, group)
                    .with_context(|| format!("uplink.ifname: PACKET_FANOUT on '{ifname}'"))?;
                sockets.push(port);
            }
            Ok((sockets, None))
        }
        backend => Ok((
            vec![open_port(
                ifname,
                backend,
                false,
                "uplink.ifname",
                cfg.uplink.mtu + 14,
            )?],
            None,
        )),
    }
}
