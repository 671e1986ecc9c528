//! Shared by the root tests that run the `picnic` binary in a network namespace
//! (tests/restart.rs, tests/live.rs): the namespace guard, the API client, the switch child.
#![allow(dead_code)]

pub mod cluster;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root for network namespaces and AF_PACKET");
    }
    root
}

pub fn run(argv: &[&str]) {
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `pn-t-*` namespace with veth pairs, deleted on drop.
pub struct Netns(String);

impl Netns {
    /// A namespace `pn-t-TAG-PID` with IPv6 off and the veth pairs `veths`, all up.
    pub fn new(tag: &str, veths: &[(&str, &str)]) -> Netns {
        let ns = Netns(format!("pn-t-{tag}-{}", std::process::id()));
        let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
        run(&["ip", "netns", "add", &ns.0]);
        for sysctl in ["all", "default"] {
            let key = format!("net.ipv6.conf.{sysctl}.disable_ipv6=1");
            run(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", &key]);
        }
        for &(a, b) in veths {
            run(&[
                "ip", "-n", &ns.0, "link", "add", a, "type", "veth", "peer", "name", b,
            ]);
            run(&["ip", "-n", &ns.0, "link", "set", a, "up"]);
            run(&["ip", "-n", &ns.0, "link", "set", b, "up"]);
        }
        ns
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).unwrap();
                // SAFETY: an open namespace descriptor; setns only affects this thread.
                let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(ret, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// `picnic switch --config cfg` inside the namespace (`ip netns exec` execs it, so the
    /// child is the switch itself and `kill` is SIGKILL to it).
    pub fn switch(&self, cfg: &Path) -> Child {
        self.switch_command(cfg).spawn().unwrap()
    }

    /// The command [`Netns::switch`] spawns, stderr inherited.
    pub fn switch_command(&self, cfg: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.0,
            env!("CARGO_BIN_EXE_picnic"),
            "switch",
        ])
        .arg("--config")
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// One HTTP request over the API socket: (status, body); status 0 when nothing answers.
pub fn api(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = UnixStream::connect(sock) else {
        return (0, String::new());
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: picnic\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    )
}

/// Waits until the API answers `GET /vms` (the switch is up), at most 10 s.
pub fn wait_for_api(sock: &Path) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = api(sock, "GET", "/vms", "");
        if status == 200 {
            return body;
        }
        assert!(Instant::now() < end, "the switch's API never answered");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub struct KillOnDrop(pub Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
