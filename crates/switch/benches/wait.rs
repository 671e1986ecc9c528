//! The run loop's wait when nothing is ready, per call: `ppoll` on the descriptor list
//! ([`picnic_switch::port::wait_readable`], the loop's wait until issue 13's third session)
//! against the epoll set kept across waits ([`picnic_switch::port::WaitSet`], the loop's wait
//! now), for 4, 16 and 64 ports. The descriptors are idle UDP sockets bound on loopback, so
//! each is polled through a socket's own poll path as a port's would be; the timeout is zero,
//! so the figure is the wait's set-up and teardown, which the loop pays at every wake-up.
//!
//! Run: `cargo bench -p picnic-switch --bench wait`.

use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use divan::Bencher;
use picnic_switch::port::{wait_readable, WaitSet};

fn main() {
    divan::main();
}

const PORTS: [usize; 3] = [4, 16, 64];

fn idle_sockets(n: usize) -> (Vec<UdpSocket>, Vec<RawFd>) {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind a loopback socket"))
        .collect();
    let fds = sockets.iter().map(AsRawFd::as_raw_fd).collect();
    (sockets, fds)
}

#[divan::bench(args = PORTS)]
fn ppoll_list(bencher: Bencher, ports: usize) {
    let (_sockets, fds) = idle_sockets(ports);
    bencher.bench_local(|| assert!(!wait_readable(&fds, Duration::ZERO).unwrap()));
}

#[divan::bench(args = PORTS)]
fn epoll_set(bencher: Bencher, ports: usize) {
    let (_sockets, fds) = idle_sockets(ports);
    let mut set = WaitSet::new();
    bencher.bench_local(|| assert!(!set.wait(&fds, Duration::ZERO).unwrap()));
}
