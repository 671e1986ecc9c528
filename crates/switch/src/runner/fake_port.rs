//! A stand-in port for the live-change tests: it says it is AF_PACKET (or not) and whether
//! it can be reused, and counts its reuses and drops.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::PortSpec;
use crate::frame::{Frame, FramePool};
use crate::port::{Backend, Port, PortStats};

/// A port that says it is AF_PACKET (or not) and whether it can be reused, and counts
/// its reuses and drops.
struct Fake {
    name: String,
    backend: Backend,
    reusable: bool,
    reused: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Port for Fake {
    fn name(&self) -> &str {
        &self.name
    }
    fn backend(&self) -> Backend {
        self.backend
    }
    fn recv_batch(
        &mut self,
        _: &mut FramePool,
        _: &mut Vec<Frame>,
        _: usize,
    ) -> std::io::Result<usize> {
        Ok(0)
    }
    fn send_batch(&mut self, _: &mut Vec<Frame>, _: &mut FramePool) -> std::io::Result<usize> {
        Ok(0)
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn stats(&self) -> PortStats {
        PortStats::default()
    }
    fn reuse(&mut self, max_frame: usize) -> bool {
        assert_eq!(max_frame, 1500);
        self.reused.fetch_add(1, Ordering::SeqCst);
        self.reusable
    }
}

#[derive(Default)]
pub(super) struct Counts {
    reused: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Counts {
    pub(super) fn port(&self, name: &str, backend: Backend, reusable: bool) -> Box<dyn Port> {
        Box::new(Fake {
            name: name.into(),
            backend,
            reusable,
            reused: self.reused.clone(),
            dropped: self.dropped.clone(),
        })
    }
    pub(super) fn reused(&self) -> usize {
        self.reused.load(Ordering::SeqCst)
    }
    pub(super) fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

pub(super) fn spec(ifname: &str) -> PortSpec {
    PortSpec {
        ifname: ifname.into(),
        backend: Backend::AfPacket,
        create: false,
        socket: None,
        field: "vms[0].port.ifname".into(),
        max_frame: 1500,
    }
}
