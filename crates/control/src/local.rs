//! A single-member etcd on loopback, for the lab (`picnic lab run --control etcd`) and the
//! tests: Debian's etcd-server, its data in a directory of the caller's, killed on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::store;

/// How long a starting etcd may take to answer.
const START: Duration = Duration::from_secs(10);

/// A running etcd on 127.0.0.1.
pub struct LocalEtcd {
    child: Child,
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its client and peer ports (a restart reuses them).
    pub ports: (u16, u16),
    dir: PathBuf,
}

/// A port no one listens on now.
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalEtcd {
    /// etcd with its data in `dir` on two free loopback ports, answering.
    pub fn start(dir: &Path) -> anyhow::Result<LocalEtcd> {
        LocalEtcd::start_at(dir, (free_port()?, free_port()?))
    }

    /// etcd with its data in `dir` on `ports` (client, peer), answering; Err says why not
    /// (etcd not installed, or not answering within 10 s).
    pub fn start_at(dir: &Path, ports: (u16, u16)) -> anyhow::Result<LocalEtcd> {
        let url = format!("http://127.0.0.1:{}", ports.0);
        let peer = format!("http://127.0.0.1:{}", ports.1);
        let child = Command::new("etcd")
            .args(["--name", "picnic", "--data-dir"])
            .arg(dir)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("picnic={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting etcd (Debian's etcd-server; scripts/setup.sh installs it)")?;
        let mut etcd = LocalEtcd {
            child,
            url,
            ports,
            dir: dir.to_path_buf(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let end = Instant::now() + START;
        loop {
            let answered = rt.block_on(async {
                let mut c = store::connect(std::slice::from_ref(&etcd.url)).await?;
                store::load(&mut c, "/").await
            });
            match answered {
                Ok(_) => return Ok(etcd),
                Err(e) if Instant::now() > end => {
                    bail!("etcd at {} did not answer within 10 s: {e:#}", etcd.url)
                }
                Err(_) => {
                    if let Ok(Some(status)) = etcd.child.try_wait() {
                        bail!(
                            "etcd exited at start ({status}); its data: {}",
                            etcd.dir.display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Its client URL as a list of endpoints (`control.etcd`).
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.url.clone()]
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
