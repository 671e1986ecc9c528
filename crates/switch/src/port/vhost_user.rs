//! The vhost-user-net backend (`backend = "vhost_user"`, docs/switch.md "Attaching a VM"): the
//! switch serves a VM's virtio-net queues itself, from the guest's shared memory, as Open
//! vSwitch with DPDK, VPP and Snabb do, without a copy through the host kernel.
//!
//! picnic is the vhost-user *backend*: it listens on a Unix socket and the VMM connects
//! (QEMU `-chardev socket,id=c0,path=SOCK -netdev vhost-user,id=n0,chardev=c0 -device
//! virtio-net-pci,netdev=n0`, with the guest's RAM shared: `-object
//! memory-backend-memfd,id=mem,size=..,share=on -numa node,memdev=mem`). The protocol (memory
//! table, ring addresses, kick and call eventfds) is the rust-vmm `vhost-user-backend`
//! crate's; its threads only handle the VMM's messages and turn the guest's kicks into a
//! wake-up of the run loop, which reads and writes the rings itself in `recv_batch` and
//! `send_batch` (no frame crosses a thread).
//!
//! - **Queue pairs** (`VIRTIO_NET_F_MQ`, up to 8; QEMU `-netdev
//!   vhost-user,queues=N` with `mq=on`): pair k's receive queue is 2k, its transmit queue
//!   2k + 1. The transmit queues are read in turn, starting from a different one each batch;
//!   a frame to the guest goes to a receive queue by its flow hash (as RSS spreads flows), so
//!   a flow's frames stay in order. A frame whose queue has no buffer holds back the frames
//!   after it, whatever their queue (the port's queue stays in order).
//! - **Features**: `VIRTIO_F_VERSION_1` (a 12-byte virtio-net header), `VIRTIO_NET_F_MTU`
//!   (QEMU's `host_mtu` reaches the guest), and the guest's transmit offloads: checksum
//!   (`CSUM`), TSO (`HOST_TSO4`, `HOST_TSO6`, `HOST_ECN`) and USO (`HOST_USO`), finished by the
//!   code every port shares (`port/vnet.rs`). Not offered: mergeable receive buffers, the
//!   guest's receive offloads (frames reach it complete, one per buffer), event index,
//!   indirect descriptors, the control queue (QEMU serves it).
//! - **Backpressure** (PicNIC): the guest's transmit queue is read only when the run loop
//!   calls `recv_batch`, which it does not for a VM over its rate, packet or CPU budget
//!   (`Engine::rx_ready`): the descriptors stay in the ring, the ring fills and the guest's
//!   driver stops its queue, so the guest sees a full transmit queue, not drops in the switch.
//! - **The guest's receive ring**: a frame is written only into a buffer the guest posted;
//!   when there is none, `send_batch` leaves the frame queued and the run loop bounds that
//!   queue (`driver::TX_QUEUE_BATCHES`, beyond it drops counted as `tx_queue_full`).
//! - **Guest-controlled data**: every descriptor is checked against the guest's memory by
//!   `virtio-queue`/`vm-memory`; a chain that cannot be used (outside the memory, shorter
//!   than the header, longer than 64 KiB plus the header) is given back to the guest unused
//!   and counted in [`PortStats::ring_errors`] (or `rx_oversize`), never a panic.
//! - **Reconnection**: when the VMM goes away (it stopped, crashed or restarted), the port
//!   forgets the rings and the memory and listens again; a VMM connecting later gets traffic
//!   at once. Until one is connected, frames towards the guest are dropped and counted in
//!   [`PortStats::tx_errors`], as a TAP without carrier drops them.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use picnic_wire::offload::{GSO_MAX_FRAME, VNET_HDR_LEN};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_HOST_USO, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU,
};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::vnet::VnetRx;
use super::{os_error, Backend, Port, PortStats};
use crate::frame::{Frame, FramePool, DATA_CAP};
use chain::{gather, scatter, ChainError};

mod chain;

/// The guest's memory as the rings see it (replaced whole at each memory table the VMM sends).
type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringRwLock<GuestMem>;

/// The most descriptors a ring may have (QEMU's `rx_queue_size`/`tx_queue_size` go to 1024).
const MAX_QUEUE_SIZE: usize = 1024;
/// The most queue pairs a VMM may ask for (QEMU's `-netdev vhost-user,queues=N`).
const MAX_QUEUE_PAIRS: usize = 8;
/// The virtio-net header with `VIRTIO_F_VERSION_1`: the legacy 10 bytes and `num_buffers`.
const HDR_LEN_V1: usize = 12;

/// The virtio features offered (see the module doc).
const FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_NET_F_MTU
    | 1 << VIRTIO_NET_F_CSUM
    | 1 << VIRTIO_NET_F_HOST_TSO4
    | 1 << VIRTIO_NET_F_HOST_TSO6
    | 1 << VIRTIO_NET_F_HOST_ECN
    | 1 << VIRTIO_NET_F_HOST_USO
    | 1 << VIRTIO_NET_F_MQ;

/// The rings and memory of the VMM connected now.
#[derive(Clone)]
struct Conn {
    /// virtio-net's order: pair k's receive queue at 2k, its transmit queue at 2k + 1.
    queues: Vec<Vring>,
    mem: GuestMem,
}

/// What the port and the threads serving the socket share.
struct Shared {
    /// Written on every kick of the guest and every (dis)connection: the run loop waits on it.
    wake: EventFd,
    /// The guest memory of the connection being served (set when it is accepted).
    mem: Mutex<Option<GuestMem>>,
    /// The rings of the connection being served, once the guest has kicked one.
    conn: Mutex<Option<Conn>>,
    /// Bumped whenever `conn` changes, so the port refreshes its copy only then.
    generation: AtomicU64,
    /// Features the driver acknowledged.
    acked: AtomicU64,
    /// VMM connections accepted so far.
    connections: AtomicU64,
    /// Which daemon serves the socket now (each connection gets its own): a late event from
    /// the threads of one that went is ignored.
    serving: AtomicU64,
    /// Ends a connection being served, for [`VhostUserPort`]'s drop.
    shutdown: Mutex<Option<ShutdownHandle>>,
    stop: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        let _ = self.wake.write(1);
    }

    fn set_conn(&self, conn: Option<Conn>) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = conn;
        self.generation.fetch_add(1, Ordering::Release);
        self.wake();
    }
}

/// The device side the `vhost-user-backend` crate drives: features, and kicks turned into
/// wake-ups of the run loop.
#[derive(Clone)]
struct NetDevice {
    shared: Arc<Shared>,
    /// This daemon's number (`Shared::serving`).
    daemon: u64,
}

impl NetDevice {
    fn current(&self) -> bool {
        self.shared.serving.load(Ordering::Acquire) == self.daemon
    }
}

impl VhostUserBackend for NetDevice {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        2 * MAX_QUEUE_PAIRS
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        if self.current() {
            self.shared.acked.store(features, Ordering::Release);
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // MQ: the VMM asks how many queues there may be (GET_QUEUE_NUM).
        VhostUserProtocolFeatures::MQ
    }

    fn set_event_idx(&self, _enabled: bool) {
        // Not offered, so never enabled.
    }

    fn update_memory(&self, _mem: GuestMem) -> io::Result<()> {
        // The same `GuestMemoryAtomic` the port holds: it sees the new table at its next load.
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &self,
        _device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        if !self.current() {
            return Ok(());
        }
        let known = self
            .shared
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !known {
            let mem = self
                .shared
                .mem
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(mem) = mem {
                self.shared.set_conn(Some(Conn {
                    queues: vrings.to_vec(),
                    mem,
                }));
            }
        }
        self.shared.wake();
        Ok(())
    }
}

/// A port serving one VM over vhost-user (see the module doc).
pub struct VhostUserPort {
    name: String,
    socket: PathBuf,
    shared: Arc<Shared>,
    /// The port's copy of `shared.conn`, as of `generation`.
    conn: Option<Conn>,
    generation: u64,
    /// The transmit queue read first in the next batch (queue pairs taken in turn).
    next_pair: usize,
    stats: PortStats,
    vnet: VnetRx,
    /// The listening socket (a duplicate), to end the serving thread's accept(2).
    accepting: UnixListener,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VhostUserPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserPort")
            .field("name", &self.name)
            .field("socket", &self.socket)
            .field("connected", &self.conn.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl VhostUserPort {
    /// Listens on Unix socket `socket` for a VMM (a stale socket file there is replaced;
    /// anything else is an error, never removed) and serves it from a thread, listening again
    /// whenever it goes. `name` names the port (stats, logs); super-frames from the guest are
    /// segmented into frames of at most `max_frame` bytes.
    pub fn open(name: &str, socket: &Path, max_frame: usize) -> io::Result<VhostUserPort> {
        let ctx = |what: &str| format!("vhost-user port '{name}' on {}: {what}", socket.display());
        match fs::symlink_metadata(socket) {
            Ok(meta) if meta.file_type().is_socket() => fs::remove_file(socket)
                .map_err(|e| os_error(e, ctx("removing the stale socket")))?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    ctx("the path exists and is not a socket (picnic removes only a stale socket)"),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(os_error(e, ctx("stat"))),
        }
        let bound = UnixListener::bind(socket).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                ctx(&format!(
                    "cannot listen ({e}): the directory must exist and the path be shorter than \
                     108 bytes"
                )),
            )
        })?;
        let file = socket_file(socket);
        let accepting = bound
            .try_clone()
            .map_err(|e| os_error(e, ctx("dup of the socket")))?;
        // Without a path: the port removes its socket file itself, and only if it is still its
        // own (a port opened later on the same path replaced it).
        let listener = Listener::from(bound);
        let wake = EventFd::new(EFD_NONBLOCK).map_err(|e| os_error(e, ctx("eventfd")))?;
        let shared = Arc::new(Shared {
            wake,
            mem: Mutex::new(None),
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            serving: AtomicU64::new(0),
            shutdown: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let server = {
            let (shared, name, socket) = (shared.clone(), name.to_string(), socket.to_owned());
            std::thread::Builder::new()
                .name(format!("vhost-{name}"))
                .spawn(move || {
                    serve(listener, &shared, &name, &socket);
                    if file.is_some() && socket_file(&socket) == file {
                        let _ = fs::remove_file(&socket);
                    }
                })
                .map_err(|e| os_error(e, ctx("spawning its thread")))?
        };
        Ok(VhostUserPort {
            name: name.to_string(),
            socket: socket.to_owned(),
            shared,
            conn: None,
            generation: 0,
            next_pair: 0,
            stats: PortStats::default(),
            vnet: VnetRx::new(max_frame),
            accepting,
            server: Some(server),
        })
    }

    /// VMM connections accepted since the port was opened.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// Whether a VMM is connected and its guest has started its rings.
    pub fn connected(&mut self) -> bool {
        self.refresh();
        self.conn.is_some()
    }

    /// Takes the connection's rings anew if the serving threads changed them.
    fn refresh(&mut self) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.conn = self
                .shared
                .conn
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            self.generation = generation;
        }
    }

    /// The virtio-net header's length the driver agreed to.
    fn hdr_len(&self) -> usize {
        let acked = self.shared.acked.load(Ordering::Acquire);
        if acked & (1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            HDR_LEN_V1
        } else {
            VNET_HDR_LEN
        }
    }
}

/// The file at `path` (device and inode), if any.
fn socket_file(path: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Accepts one VMM at a time on `listener` and serves it until it goes, until the port stops.
fn serve(mut listener: Listener, shared: &Arc<Shared>, name: &str, socket: &Path) {
    let log = |what: String| tracing::info!("vhost-user port '{name}': {what}");
    while !shared.stop.load(Ordering::Acquire) {
        let mem = GuestMem::new(GuestMemoryMmap::new());
        let device = NetDevice {
            shared: shared.clone(),
            daemon: shared.serving.fetch_add(1, Ordering::AcqRel) + 1,
        };
        let mut daemon = match VhostUserDaemon::new(name.to_string(), device, mem.clone()) {
            Ok(d) => d,
            Err(e) => {
                log(format!("cannot serve: {e}"));
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
        };
        *shared.mem.lock().unwrap_or_else(|e| e.into_inner()) = Some(mem);
        let accepted = daemon.start(&mut listener);
        let stopping = shared.stop.load(Ordering::Acquire);
        match accepted {
            Ok(()) if !stopping => {
                shared.connections.fetch_add(1, Ordering::AcqRel);
                *shared.shutdown.lock().unwrap_or_else(|e| e.into_inner()) =
                    daemon.shutdown_handle();
                log(format!("a VMM connected on {}", socket.display()));
                let result = daemon.wait();
                let how = match result {
                    Ok(())
                    | Err(vhost_user_backend::Error::HandleRequest(
                        vhost::vhost_user::Error::Disconnected
                        | vhost::vhost_user::Error::PartialMessage,
                    )) => "it disconnected".to_string(),
                    Err(e) => format!("it broke the protocol ({e})"),
                };
                if !shared.stop.load(Ordering::Acquire) {
                    log(format!("{how}; listening again"));
                }
            }
            Ok(()) => {
                daemon.request_shutdown();
                let _ = daemon.wait();
            }
            Err(_) if stopping || shared.stop.load(Ordering::Acquire) => {}
            Err(e) => {
                log(format!("accept failed: {e}"));
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        *shared.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *shared.mem.lock().unwrap_or_else(|e| e.into_inner()) = None;
        shared.acked.store(0, Ordering::Release);
        shared.set_conn(None);
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
    }
}

impl Drop for VhostUserPort {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(handle) = self
            .shared
            .shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            handle.shutdown();
        }
        // A thread waiting in accept(2) gets an error once the socket is shut down.
        // SAFETY: shutdown(2) on a descriptor this port owns.
        unsafe { libc::shutdown(self.accepting.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

/// The ring of `vring`, if the guest has it running.
fn running(vring: &Vring) -> bool {
    let state = vring.get_ref();
    state.is_enabled() && state.get_queue().ready()
}

impl Port for VhostUserPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::VhostUser
    }

    fn recv_batch(
        &mut self,
        pool: &mut FramePool,
        out: &mut Vec<Frame>,
        max: usize,
    ) -> io::Result<usize> {
        let _ = self.shared.wake.read();
        self.refresh();
        let mut n = self.vnet.drain(pool, out, max, &mut self.stats);
        let Some(conn) = self.conn.as_ref() else {
            return Ok(n);
        };
        let hdr_len = self.hdr_len();
        let mem_guard = conn.mem.memory();
        let mem: &GuestMemoryMmap = &mem_guard;
        // The transmit queues in turn, from a different one each batch.
        let pairs = conn.queues.len() / 2;
        self.next_pair = (self.next_pair + 1) % pairs.max(1);
        for k in 0..pairs {
            if n >= max || self.vnet.busy() || pool.available() == 0 {
                break;
            }
            let tx = &conn.queues[2 * ((self.next_pair + k) % pairs) + 1];
            if !running(tx) {
                continue;
            }
            let mut vring = tx.get_mut();
            let mut used = 0;
            // A frame needs a pool frame, or the super-frame buffer and then pool frames.
            while n < max && !self.vnet.busy() && pool.available() > 0 {
                let Some(chain) = vring.get_queue_mut().pop_descriptor_chain(mem) else {
                    break;
                };
                let head = chain.head_index();
                let total: u64 = chain.clone().readable().map(|d| u64::from(d.len())).sum();
                let mut hdr = [0u8; HDR_LEN_V1];
                let hdr = &mut hdr[..hdr_len];
                match total.checked_sub(hdr_len as u64).map(|len| len as usize) {
                    None => self.stats.ring_errors += 1,
                    Some(len) if len <= DATA_CAP => {
                        let mut frame = pool.get().expect("checked available");
                        match gather(chain, mem, hdr, &mut frame.buf_for_rx()[..len]) {
                            Ok(()) => {
                                frame.set_len(len);
                                let before = out.len();
                                self.vnet.take_frame(hdr, frame, pool, out, &mut self.stats);
                                n += out.len() - before;
                            }
                            Err(_) => {
                                pool.put(frame);
                                self.stats.ring_errors += 1;
                            }
                        }
                    }
                    Some(len) if len <= GSO_MAX_FRAME => {
                        match gather(chain, mem, hdr, &mut self.vnet.buf_mut()[..len]) {
                            Ok(()) => {
                                let before = out.len();
                                self.vnet
                                    .take_buffered(hdr, len, pool, out, &mut self.stats);
                                n += out.len() - before;
                                n += self.vnet.drain(pool, out, max - n, &mut self.stats);
                            }
                            Err(_) => self.stats.ring_errors += 1,
                        }
                    }
                    Some(_) => self.stats.rx_oversize += 1,
                }
                // Transmitted as far as the guest is concerned, whatever became of it.
                if vring.add_used(head, 0).is_err() {
                    self.stats.ring_errors += 1;
                }
                used += 1;
                self.stats.rx_taken += 1;
            }
            if used > 0 && vring.needs_notification().unwrap_or(true) {
                vring
                    .signal_used_queue()
                    .map_err(|e| os_error(e, format!("vhost-user port '{}': call", self.name)))?;
            }
        }
        Ok(n)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>, pool: &mut FramePool) -> io::Result<usize> {
        self.refresh();
        // The receive queues the guest has running (pair k's at 2k).
        let mut running_rx = [0usize; MAX_QUEUE_PAIRS];
        let mut count = 0;
        if let Some(conn) = self.conn.as_ref() {
            for (q, vring) in conn.queues.iter().enumerate().step_by(2) {
                if count < MAX_QUEUE_PAIRS && running(vring) {
                    running_rx[count] = q;
                    count += 1;
                }
            }
        }
        let Some(conn) = self.conn.as_ref().filter(|_| count > 0) else {
            // No guest to take them (none connected, or its driver not started): dropped,
            // as a TAP without carrier drops them.
            self.stats.tx_errors += frames.len() as u64;
            frames.drain(..).for_each(|f| pool.put(f));
            return Ok(0);
        };
        let hdr_len = self.hdr_len();
        // Complete frames, not GSO; one buffer each (`num_buffers` = 1).
        let mut hdr = [0u8; HDR_LEN_V1];
        hdr[10] = 1;
        let hdr = &hdr[..hdr_len];
        let mem_guard = conn.mem.memory();
        let mem: &GuestMemoryMmap = &mem_guard;
        let (mut sent, mut done, mut signal) = (0, 0, 0u32);
        for frame in frames.iter() {
            // A flow's frames all go to one receive queue (by its hash, as RSS spreads them).
            let q = match count {
                1 => running_rx[0],
                _ => {
                    let hash = picnic_wire::classify(frame.data()).map_or(0, |f| f.flow_hash());
                    running_rx[hash as usize % count]
                }
            };
            let mut vring = conn.queues[q].get_mut();
            // No buffer posted: that queue is full, the rest waits (in order).
            let Some(chain) = vring.get_queue_mut().pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let written = match scatter(chain, mem, hdr, frame.data()) {
                Ok(len) => {
                    sent += 1;
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += frame.len() as u64;
                    len
                }
                Err(e) => {
                    if e == ChainError::Bad {
                        self.stats.ring_errors += 1;
                    }
                    self.stats.tx_errors += 1;
                    0
                }
            };
            done += 1;
            if vring.add_used(head, written).is_err() {
                self.stats.ring_errors += 1;
            }
            signal |= 1 << (q / 2);
        }
        for pair in (0..MAX_QUEUE_PAIRS).filter(|p| signal & 1 << p != 0) {
            let mut vring = conn.queues[2 * pair].get_mut();
            if vring.needs_notification().unwrap_or(true) {
                vring
                    .signal_used_queue()
                    .map_err(|e| os_error(e, format!("vhost-user port '{}': call", self.name)))?;
            }
        }
        for frame in frames.drain(..done) {
            pool.put(frame);
        }
        Ok(sent)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.shared.wake.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_not_a_socket_is_refused_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("picnic-vhost-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-a-socket");
        fs::write(&file, b"keep me").unwrap();
        let err = VhostUserPort::open("vm1", &file, 1514).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(fs::read(&file).unwrap(), b"keep me");
        let err = VhostUserPort::open("vm1", &dir.join("no-dir/vm1.sock"), 1514).unwrap_err();
        assert!(err.to_string().contains("directory must exist"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Without a VMM the port listens, reads nothing and drops what is sent to it (counted);
    /// a stale socket is replaced; dropping the port stops its thread and removes the socket.
    /// A port opened on the path of one still open (a VM removed and added in one live
    /// change) takes the path over; closing the old one leaves the new one's socket.
    #[test]
    fn a_port_closing_leaves_the_socket_of_a_newer_port_on_its_path() {
        let dir = std::env::temp_dir().join(format!("picnic-vhost-swap-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("vm1.sock");
        let old = VhostUserPort::open("vm1", &socket, 1514).unwrap();
        let new = VhostUserPort::open("vm1", &socket, 1514).unwrap();
        // Both threads waiting for a VMM: closing the old port ends its own.
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(old);
        assert!(socket.exists(), "the new port's socket stays");
        drop(new);
        assert!(!socket.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_vmm_the_port_listens_and_drops_frames_for_the_guest() {
        let dir = std::env::temp_dir().join(format!("picnic-vhost-idle-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("vm1.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let mut port = VhostUserPort::open("vm1", &socket, 1514).unwrap();
        assert!(socket.exists());
        let mut pool = FramePool::new(4);
        let mut out = Vec::new();
        assert_eq!(port.recv_batch(&mut pool, &mut out, 8).unwrap(), 0);
        let mut frames = vec![pool.get().unwrap(), pool.get().unwrap()];
        assert_eq!(port.send_batch(&mut frames, &mut pool).unwrap(), 0);
        assert!(frames.is_empty());
        assert_eq!(pool.available(), 4);
        assert_eq!(port.stats().tx_errors, 2);
        assert!(!port.connected());
        drop(port);
        assert!(!socket.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
