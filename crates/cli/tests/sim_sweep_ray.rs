//! `picnic sim sweep --ray` end to end: a two-case sweep on a local Ray, its records the same
//! as the in-process runner's. Runs only where a Python with Ray is at hand
//! (`$PICNIC_PYTHON`, else `python3`; `bash scripts/setup_ray.sh` makes one); otherwise it
//! says why and returns.

use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> String {
    std::env::var("PICNIC_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn ray_available(py: &str) -> Result<(), String> {
    match Command::new(py).args(["-c", "import ray"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{py} -c 'import ray'` failed ({}); bash scripts/setup_ray.sh and PICNIC_PYTHON=target/venv-ray/bin/python run it",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        )),
        Err(e) => Err(format!("cannot start {py}: {e}")),
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn records(out: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("cases"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

/// A record's metrics without the wall-clock ones (which differ between any two runs).
fn simulated(r: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    let mut v = Vec::new();
    for m in r["modes"].as_array().unwrap() {
        for (k, x) in m["metrics"].as_object().unwrap() {
            if k != "sim.wall_s" && k != "sim.events_per_sec" {
                v.push((format!("{}/{k}", m["mode"]), x.clone()));
            }
        }
    }
    v
}

#[test]
fn a_two_case_sweep_runs_on_a_local_ray_and_matches_the_in_process_run() {
    let py = python();
    if let Err(why) = ray_available(&py) {
        eprintln!("skipped: no Ray: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("picnic-ray-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sweep = dir.join("two.toml");
    std::fs::write(
        &sweep,
        format!(
            r#"
scenario = "{}"
seeds = [1, 2]
modes = ["picnic", "victim-alone"]
metrics = ["victim.p99_us", "victim_p99_ratio"]
[set]
duration_ms = 300
"workloads.flood*" = {{ start_ms = 100, stop_ms = 200 }}
"#,
            repo().join("scenarios/ingress-flood.toml").display()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_picnic");
    let run = |out: &Path, extra: &[&str]| {
        let o = Command::new(bin)
            .args(["sim", "sweep"])
            .arg(&sweep)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "exit {:?}\n{err}", o.status.code());
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let (table, err) = run(&dir.join("ray"), &["--ray", "--python", &py]);
    assert!(err.contains("[ray] 2 cases on a local Ray"), "{err}");
    assert!(err.contains("2 of 2 cases finished"), "{err}");
    assert!(table.contains("| picnic | 2 |"), "{table}");
    let on_ray = records(&dir.join("ray"));
    assert_eq!(on_ray.len(), 2);

    let (_, _) = run(&dir.join("local"), &["--local"]);
    let local = records(&dir.join("local"));
    for (a, b) in on_ray.iter().zip(&local) {
        assert_eq!(a["id"], b["id"]);
        assert_eq!(a["fingerprint"], b["fingerprint"]);
        assert_eq!(simulated(a), simulated(b), "{}", a["id"]);
    }
    // Resumed on Ray: nothing left to run, Ray not even started.
    let (_, err) = run(&dir.join("ray"), &["--ray", "--python", &py]);
    assert!(
        err.contains("2 finished earlier") && !err.contains("[ray]"),
        "{err}"
    );
    let summary = std::fs::read_to_string(dir.join("ray/summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 3, "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}
