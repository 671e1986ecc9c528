use super::grid::{apply, glob, Op};
use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("picnic-sweep-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A sweep over ingress-flood shortened to 300 ms (a case runs in well under a second).
fn tiny(params: &str, seeds: &str) -> String {
    let base = repo().join("scenarios/ingress-flood.toml");
    format!(
        r#"
name = "tiny"
scenario = "{}"
seeds = {seeds}
modes = ["picnic", "victim-alone"]
metrics = ["victim.p99_us", "victim_p99_ratio", "attack1.throughput_mbps"]
[set]
duration_ms = 300
"workloads.flood*" = {{ start_ms = 100, stop_ms = 200 }}
{params}
"#,
        base.display()
    )
}

fn sweep_of(text: &str) -> Sweep {
    Sweep::parse(text, Path::new("/"), "t").unwrap()
}

#[test]
fn grid_is_the_product_of_levels_and_seeds_first_param_slowest_seeds_innermost() {
    let s = sweep_of(&tiny(
        r#"
[[params]]
path = "access_link_mbps"
values = [50, 100]
[[params]]
name = "flood"
path = "workloads.flood*.rate_pps"
values = [1000, 2000, 4000]
"#,
        "[7, 8]",
    ));
    assert_eq!(s.cases.len(), 2 * 3 * 2);
    let ids: Vec<&str> = s.cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids[0], "access_link_mbps=50__flood=1000__seed=7");
    assert_eq!(ids[1], "access_link_mbps=50__flood=1000__seed=8");
    assert_eq!(ids[2], "access_link_mbps=50__flood=2000__seed=7");
    assert_eq!(ids[6], "access_link_mbps=100__flood=1000__seed=7");
    assert_eq!(ids[11], "access_link_mbps=100__flood=4000__seed=8");
    assert!(s.cases.iter().enumerate().all(|(i, c)| c.index == i));
    // Same scenario for both seeds of a combination, different fingerprints.
    assert_eq!(s.cases[0].scenario_text, s.cases[1].scenario_text);
    assert_ne!(s.cases[0].fingerprint, s.cases[1].fingerprint);
    assert_ne!(s.cases[0].scenario_text, s.cases[2].scenario_text);
    // Every case's overrides land in the scenario that runs.
    let spec = Spec::parse(&s.cases[11].scenario_text).unwrap();
    assert_eq!(spec.scenario.access_link_mbps, 100);
    assert_eq!(spec.scenario.duration_ms, 300);
    assert_eq!(spec.sim.modes, ["picnic", "victim-alone"]);
    let floods: Vec<_> = spec
        .scenario
        .workloads
        .iter()
        .filter(|w| w.name.starts_with("flood"))
        .collect();
    assert_eq!(floods.len(), 2);
    for w in floods {
        assert_eq!(w.rate_pps, Some(4000));
        assert_eq!((w.start_ms, w.stop_ms), (100, Some(200)));
    }
    // No parameters: one combination, one case per seed.
    assert_eq!(sweep_of(&tiny("", "[1, 2, 3]")).cases.len(), 3);
}

#[test]
fn paths_select_by_key_name_glob_and_index_and_refuse_what_matches_nothing() {
    let mut t: toml::Table = toml::from_str(
        r#"
a = 1
[[w]]
name = "flood1"
r = 1
[[w]]
name = "flood2"
r = 1
[[w]]
name = "probe"
r = 1
"#,
    )
    .unwrap();
    let set = |p: &str, v: i64| Op::Set(p.into(), toml::Value::Integer(v));
    apply(&mut t, &[set("w.flood2.r", 5), set("w.2.r", 7)]).unwrap();
    let r = |t: &toml::Table, i: usize| t["w"][i]["r"].as_integer().unwrap();
    assert_eq!((r(&t, 0), r(&t, 1), r(&t, 2)), (1, 5, 7));
    apply(&mut t, &[set("w.flood*.r", 9)]).unwrap();
    assert_eq!((r(&t, 0), r(&t, 1), r(&t, 2)), (9, 9, 7));
    // A missing table on the way is created, as `sim` in a lab file.
    apply(&mut t, &[set("sim.replicas", 4)]).unwrap();
    assert_eq!(t["sim"]["replicas"].as_integer(), Some(4));
    apply(&mut t, &[Op::Remove("w.flood1".into())]).unwrap();
    let names: Vec<&str> = t["w"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["flood2", "probe"]);
    for bad in [
        set("w.flood9.r", 1),
        Op::Remove("w.flood1".into()),
        set("a.b", 1),
    ] {
        assert!(
            apply(&mut t.clone(), std::slice::from_ref(&bad)).is_err(),
            "{bad:?}"
        );
    }
    assert!(glob("flood*", "flood12") && glob("*2", "flood2") && glob("f*d*", "flood"));
    assert!(!glob("flood*", "probe") && !glob("flood", "flood1"));
}

#[test]
fn a_misspelt_field_or_an_unmatched_path_fails_the_expansion_not_a_run() {
    let misspelt = tiny(
        "[[params]]\npath = \"sim.replica\"\nvalues = [1, 2]\n",
        "[1]",
    );
    let e = format!(
        "{:#}",
        Sweep::parse(&misspelt, Path::new("/"), "t").unwrap_err()
    );
    assert!(e.contains("sim.replica=1") && e.contains("replica"), "{e}");
    let unmatched = tiny(
        "[[params]]\npath = \"workloads.flood7.rate_pps\"\nvalues = [1]\n",
        "[1]",
    );
    let e = format!(
        "{:#}",
        Sweep::parse(&unmatched, Path::new("/"), "t").unwrap_err()
    );
    assert!(e.contains("matches nothing"), "{e}");
    assert!(Sweep::parse(&tiny("", "[1, 1]"), Path::new("/"), "t").is_err());
    assert!(Sweep::parse(&tiny("", "[]"), Path::new("/"), "t").is_err());
}

#[test]
fn the_shipped_sweep_expands_to_attackers_times_rates_times_seeds() {
    let s = Sweep::load(&repo().join("scenarios/sim/victim-p99-sweep.toml")).unwrap();
    assert_eq!(s.name, "victim-p99-sweep");
    assert_eq!(s.cases.len(), 3 * 2 * 3);
    assert_eq!(s.modes().unwrap(), ["picnic", "picnic-off", "victim-alone"]);
    for c in &s.cases {
        let spec = Spec::parse(&c.scenario_text).unwrap();
        let attackers: usize = c.labels[0].1.parse().unwrap();
        let rate: u64 = c.labels[1].1.parse().unwrap();
        let floods: Vec<_> = spec
            .scenario
            .workloads
            .iter()
            .filter(|w| w.name.starts_with("flood"))
            .collect();
        assert_eq!(floods.len(), attackers, "{}", c.id);
        assert!(floods.iter().all(|w| w.rate_pps == Some(rate)), "{}", c.id);
        assert_eq!(spec.total_hosts(), 24);
    }
    // The issue's 144 hosts by `--set`, which changes every fingerprint but no id.
    let set = grid::parse_set("sim.replicas=24").unwrap();
    assert_eq!(set.1, toml::Value::Integer(24));
    let big =
        Sweep::load_with(&repo().join("scenarios/sim/victim-p99-sweep.toml"), &[set]).unwrap();
    for (a, b) in s.cases.iter().zip(&big.cases) {
        assert_eq!(a.id, b.id);
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(Spec::parse(&b.scenario_text).unwrap().total_hosts(), 144);
    }
    assert_eq!(
        grid::parse_set("name=x y").unwrap().1,
        toml::Value::String("x y".into())
    );
}

fn record(id: &str, seed: u64, mode_values: &[(&str, f64)]) -> Record {
    Record {
        id: id.into(),
        fingerprint: String::new(),
        seed,
        params: vec![],
        wall_s: 0.0,
        modes: mode_values
            .iter()
            .map(|(mode, v)| ModeMetrics {
                mode: mode.to_string(),
                metrics: [("victim.p99_us".to_string(), *v)].into_iter().collect(),
            })
            .collect(),
    }
}

#[test]
fn merge_takes_mean_and_students_t_interval_per_combination_and_mode() {
    let s = sweep_of(&tiny(
        "[[params]]\nname = \"n\"\npath = \"access_link_mbps\"\nvalues = [50, 100]\n",
        "[1, 2, 3]",
    ));
    let modes = vec!["picnic".to_string(), "victim-alone".to_string()];
    let mut recs = BTreeMap::new();
    // n=50: picnic 100, 200, 300 over the seeds; victim-alone only on seed 1 (one sample).
    let c = &s.cases;
    recs.insert(
        c[0].id.clone(),
        record(&c[0].id, 1, &[("picnic", 100.0), ("victim-alone", 10.0)]),
    );
    recs.insert(c[1].id.clone(), record(&c[1].id, 2, &[("picnic", 200.0)]));
    recs.insert(c[2].id.clone(), record(&c[2].id, 3, &[("picnic", 300.0)]));
    // n=100: nothing finished.
    let rows = merge(&s, &modes, &recs);
    assert_eq!(rows.len(), 4);
    assert_eq!(
        (rows[0].labels[0].as_str(), rows[0].mode.as_str()),
        ("50", "picnic")
    );
    let e = rows[0].values[0].unwrap();
    assert_eq!((e.n, e.mean), (3, 200.0));
    // s = 100, t(2) = 4.303: 4.303 * 100 / sqrt(3) = 248.43.
    assert!((e.ci95.unwrap() - 248.43).abs() < 0.01, "{e:?}");
    assert_eq!(rows[1].seeds, 1);
    assert_eq!(rows[1].values[0].unwrap().ci95, None);
    assert_eq!(rows[2].seeds, 0);
    assert!(rows[2].values[0].is_none());
    let csv = summary_csv(&s, &rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "n,mode,seeds,victim.p99_us_mean,victim.p99_us_ci95,victim.p99_us_n,\
         victim_p99_ratio_mean,victim_p99_ratio_ci95,victim_p99_ratio_n,\
         attack1.throughput_mbps_mean,attack1.throughput_mbps_ci95,attack1.throughput_mbps_n"
    );
    assert!(
        lines[1].starts_with("50,picnic,3,200,248.4"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "50,victim-alone,1,10,,1,,,0,,,0");
    assert_eq!(lines[3], "100,picnic,0,,,0,,,0,,,0");
    assert!(markdown(&s, &rows).contains("| 50 | picnic | 3 | 200 ± 248 | - | - |"));
}

fn args(sweep: &Path, out: &Path) -> SweepArgs {
    SweepArgs {
        sweep: sweep.to_path_buf(),
        out: Some(out.to_path_buf()),
        ray: false,
        ray_address: None,
        python: None,
        local: false,
        jobs: 2,
        list: false,
        case: None,
        set: vec![],
    }
}

#[test]
fn a_rerun_skips_finished_cases_and_reruns_those_whose_scenario_changed() {
    let dir = tmpdir("resume");
    let out = dir.join("out");
    let file = dir.join("tiny.toml");
    let params = "[[params]]\nname = \"rate\"\npath = \"workloads.flood*.rate_pps\"\nvalues = [5000, 20000]\n";
    std::fs::write(&file, tiny(params, "[1, 2]")).unwrap();
    assert_eq!(run_cli(args(&file, &out), &[]).unwrap(), 0);
    let sweep = Sweep::load(&file).unwrap();
    let first: Vec<Record> = sweep
        .cases
        .iter()
        .map(|c| finished(&out, c).expect("every case recorded"))
        .collect();
    assert_eq!(first.len(), 4);
    // The victim's ratio is there for the attacked mode, and the floods' rate moved the
    // attackers' throughput.
    let tput = |r: &Record| r.modes[0].metrics["attack1.throughput_mbps"];
    assert!(first[0].modes[0].metrics.contains_key("victim_p99_ratio"));
    assert!(tput(&first[2]) > 2.0 * tput(&first[0]), "{first:?}");
    // Same seed, same record (deterministic), whatever ran it.
    let again = run_case(&sweep.cases[1]).unwrap();
    assert_eq!(again.modes.len(), 2);
    for (a, b) in again.modes.iter().zip(&first[1].modes) {
        assert_eq!(a.simulated(), b.simulated());
    }

    // Mark one record: a rerun must leave it alone (skipped, not run again).
    let mut marked = first[3].clone();
    marked.wall_s = -1.0;
    write_record(&out, &marked).unwrap();
    // A half-written temporary (a killed run) is not a record.
    std::fs::write(out.join("cases").join(".x.tmp"), "{").unwrap();
    assert_eq!(run_cli(args(&file, &out), &[]).unwrap(), 0);
    assert_eq!(finished(&out, &sweep.cases[3]).unwrap().wall_s, -1.0);
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 1 + 2 * 2, "{summary}");
    // One plot per metric: the first parameter's levels on the x axis, a line (with error
    // bars, a dot per point) per mode.
    let svg = std::fs::read_to_string(out.join("plot-victim_p99_us.svg")).unwrap();
    for text in ["5000", "20000", "picnic", "victim-alone", "rate"] {
        assert!(
            svg.lines().any(|l| l.trim() == text),
            "no {text} in the plot"
        );
    }
    assert_eq!(svg.matches("<circle").count(), 2 * 2);

    // A changed scenario under the same labels makes the old records stale: every case
    // runs again, under the same ids.
    std::fs::write(
        &file,
        tiny(params, "[1, 2]").replace("duration_ms = 300", "duration_ms = 310"),
    )
    .unwrap();
    let changed = Sweep::load(&file).unwrap();
    assert!(changed.cases.iter().all(|c| finished(&out, c).is_none()));
    assert_eq!(changed.cases[3].id, sweep.cases[3].id);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_case_by_id_as_a_ray_task_runs_it() {
    let dir = tmpdir("case");
    let file = dir.join("tiny.toml");
    std::fs::write(&file, tiny("", "[4]")).unwrap();
    let mut a = args(&file, &dir.join("out"));
    a.case = Some("seed=4".into());
    assert_eq!(run_cli(a.clone(), &[]).unwrap(), 0);
    let sweep = Sweep::load(&file).unwrap();
    assert!(finished(&dir.join("out"), &sweep.cases[0]).is_some());
    a.case = Some("seed=5".into());
    assert!(format!("{:#}", run_cli(a, &[]).unwrap_err()).contains("no case `seed=5`"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ray_driver_is_the_shipped_script() {
    let shipped = std::fs::read_to_string(repo().join("scripts/sim_sweep_ray.py")).unwrap();
    assert_eq!(shipped, RAY_DRIVER);
}
