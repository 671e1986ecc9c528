//! The switch's watcher against a real etcd (Debian's etcd-server, on loopback ports in a
//! temporary directory), with a stand-in for the run loop that takes each live change as
//! the switch's would: records written to etcd reach the running config; a switch that
//! stopped at some revision, restarted after its records changed and etcd's history was
//! compacted, catches up from its persisted state (a record removed meanwhile goes, a new
//! one comes); a switch started while etcd is down runs on its state and catches up when
//! etcd starts; a change the run loop refused is tried again. Skips and says why without
//! etcd.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use picnic_control::cluster::Kind;
use picnic_control::local::LocalEtcd;
use picnic_control::store::{self, Expect};
use picnic_control::watch::Watch;
use picnic_switch::config::Config;
use picnic_switch::runner::{Command as LoopCommand, CommandSender, Shared};

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Host 1's config file with `[control]` on `url`, its state in `dir`.
fn config(dir: &Path, url: &str) -> Config {
    Config::parse(&format!(
        r#"
[switch]
host_id = 1
state_file = "{}/state.json"
[uplink]
ifname = "up0"
[control]
etcd = ["{url}"]
[[hosts]]
id = 1
underlay_ip = "198.19.0.1"
mac = "02:00:00:00:01:01"
"#,
        dir.display()
    ))
    .unwrap()
}

/// Starts the watcher of `cfg` (restored from its state file, as `picnic switch` does) on a
/// stand-in run loop that makes every change it is sent; the switch's shared state.
fn switch(cfg: Config) -> (Arc<Shared>, Watch) {
    let state = cfg.switch.state_file.clone().unwrap();
    let cfg = picnic_switch::persist::restore(cfg, &state).unwrap();
    let shared = Arc::new(Shared::default());
    shared.set_config(cfg.clone());
    let (tx, rx) = mpsc::channel();
    let looped = shared.clone();
    std::thread::spawn(move || {
        // Refuses the first change that adds VM "e", as a loop whose port is not there yet.
        let mut refused = false;
        for LoopCommand::Reconfigure(change, reply) in rx {
            let cfg = change.into_config();
            if !refused && cfg.vms.iter().any(|v| v.name == "e") {
                refused = true;
                let _ = reply.send(Err(anyhow::anyhow!("port e: no such interface")));
                continue;
            }
            looped.set_config(cfg);
            let _ = reply.send(Ok(()));
        }
    });
    let watch = picnic_control::watch::spawn(&cfg, shared.clone(), CommandSender::new(tx)).unwrap();
    (shared, watch)
}

/// The names of the running config's VMs.
fn vms(shared: &Shared) -> Vec<String> {
    let mut v: Vec<String> = shared
        .config()
        .unwrap()
        .vms
        .iter()
        .map(|v| v.name.clone())
        .collect();
    v.sort();
    v
}

/// Waits until the running VMs are `want`.
fn wait_vms(shared: &Shared, want: &[&str]) {
    let end = Instant::now() + Duration::from_secs(10);
    while vms(shared) != want {
        assert!(
            Instant::now() < end,
            "VMs {:?}, expected {want:?}",
            vms(shared)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn put(url: &str, kind: Kind, name: &str, v: serde_json::Value) -> i64 {
    let mut c = store::connect(&[url.to_string()]).await.unwrap();
    store::put(&mut c, "/picnic/", kind, name, &v, Expect::Absent)
        .await
        .unwrap()
}

fn vm(name: &str, id: u32) -> serde_json::Value {
    serde_json::json!({"name": name, "id": id, "tenant": "t", "host": 2,
        "mac": format!("02:00:00:00:00:{id:02x}"), "ip": format!("198.18.0.{id}")})
}

/// Waits until the file at `path` holds `text`.
fn wait_file(path: &Path, text: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(path).is_ok_and(|t| t.contains(text)) {
        assert!(Instant::now() < end, "{} never held {text}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("picnic-watch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_switch_follows_etcd_and_catches_up_after_compaction_and_an_outage() {
    if Command::new("etcd").arg("--version").output().is_err() {
        println!("skipped: needs etcd (Debian's etcd-server; scripts/setup.sh installs it)");
        return;
    }
    let root = temp("root");
    let db = LocalEtcd::start(&root.join("etcd")).unwrap();
    let ports = db.ports;
    let url = db.url.clone();
    block(async {
        put(
            &url,
            Kind::Host,
            "2",
            serde_json::json!({"id": 2, "underlay_ip": "198.19.0.2", "mac": "02:00:00:00:01:02"}),
        )
        .await;
        put(
            &url,
            Kind::Tenant,
            "t",
            serde_json::json!({"name": "t", "vni": 100}),
        )
        .await;
        put(&url, Kind::Vm, "a", vm("a", 1)).await;
        put(&url, Kind::Vm, "b", vm("b", 2)).await;
    });
    // A switch follows: records reach its running config, and its state file.
    let one = temp("one");
    let (first, _w1) = switch(config(&one, &url));
    wait_vms(&first, &["a", "b"]);
    let state = one.join("state.json");
    let cache = picnic_control::watch::cache_path(&state);
    // Persisted once the loop answered: after the running config changed.
    wait_file(&cache, "\"b\"");
    // Its persisted state as a stopped switch would have left it.
    let two = temp("two");
    std::fs::copy(&state, two.join("state.json")).unwrap();
    std::fs::copy(
        &cache,
        picnic_control::watch::cache_path(&two.join("state.json")),
    )
    .unwrap();

    // Meanwhile b goes, c comes, and etcd compacts its history.
    block(async {
        let mut c = store::connect(std::slice::from_ref(&url)).await.unwrap();
        let snap = store::load(&mut c, "/picnic/").await.unwrap();
        let at = snap.versions["/picnic/vms/b"];
        store::delete(&mut c, "/picnic/", Kind::Vm, "b", at)
            .await
            .unwrap();
        let rev = put(&url, Kind::Vm, "c", vm("c", 3)).await;
        c.compact(rev, None).await.unwrap();
    });
    wait_vms(&first, &["a", "c"]);
    let (second, _w2) = switch(config(&two, &url));
    wait_vms(&second, &["a", "c"]);
    wait_file(
        &picnic_control::watch::cache_path(&two.join("state.json")),
        "\"c\"",
    );

    // etcd down: a switch starting now runs on its persisted state, then catches up.
    drop(db);
    let three = temp("three");
    for f in [
        two.join("state.json"),
        picnic_control::watch::cache_path(&two.join("state.json")),
    ] {
        std::fs::copy(&f, three.join(f.file_name().unwrap())).unwrap();
    }
    let (third, _w3) = switch(config(&three, &url));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        vms(&third),
        ["a", "c"],
        "the persisted state while etcd is down"
    );
    let _db = LocalEtcd::start_at(&root.join("etcd"), ports).unwrap();
    block(put(&url, Kind::Vm, "d", vm("d", 4)));
    for s in [&first, &second, &third] {
        wait_vms(s, &["a", "c", "d"]);
    }
    // A change the loop refused is tried again without another change in etcd.
    block(put(&url, Kind::Vm, "e", vm("e", 5)));
    for s in [&first, &second, &third] {
        wait_vms(s, &["a", "c", "d", "e"]);
    }
    for d in [root, one, two, three] {
        let _ = std::fs::remove_dir_all(d);
    }
}
