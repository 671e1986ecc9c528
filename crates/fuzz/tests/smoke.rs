//! The CI smoke of every fuzz target, on stable: the seed corpus (`fuzz/seeds/<target>/`)
//! replayed, then a fixed number of deterministic mutations of it (byte flips, inserts,
//! deletes, truncation, splices of two seeds). The long runs are libFuzzer's, with the
//! command and counts in docs/fuzzing.md.

use std::path::PathBuf;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Mutated inputs per target: a few seconds in all, in release.
const MUTATIONS: usize = 10_000;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    out.sort();
    out
}

fn mutate(rng: &mut SmallRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.gen_range(0..seeds.len())].clone();
    for _ in 0..rng.gen_range(1..=4) {
        let at = rng.gen_range(0..=v.len());
        match rng.gen_range(0..5) {
            0 if at < v.len() => v[at] ^= 1 << rng.gen_range(0..8),
            1 => v.insert(at, rng.gen()),
            2 if at < v.len() => {
                v.remove(at);
            }
            3 => v.truncate(at),
            _ => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let from = rng.gen_range(0..=other.len());
                let tail = v.split_off(at);
                v.extend_from_slice(&other[from..]);
                v.extend_from_slice(&tail[..tail.len().min(64)]);
            }
        }
    }
    v
}

#[test]
fn every_target_survives_its_seeds_and_their_mutations() {
    for &(name, body) in picnic_fuzz::TARGETS {
        let seeds = seeds(name);
        assert!(seeds.len() >= 3, "{name}: fewer than 3 seeds");
        for seed in &seeds {
            body(seed);
        }
        let mut rng = SmallRng::seed_from_u64(15);
        for _ in 0..MUTATIONS {
            body(&mutate(&mut rng, &seeds));
        }
    }
}

#[test]
fn seeds_reach_the_code_behind_the_parsers() {
    // A seed corpus of inputs that all fail to parse would fuzz only the error paths.
    let text = |t: &str| seeds(t).into_iter().map(|s| String::from_utf8(s).unwrap());
    let configs = text("switch_config")
        .filter(|t| picnic_switch::config::Config::parse(t).is_ok())
        .count();
    assert!(configs >= 2, "only {configs} switch_config seeds are valid");
    let scenarios = text("scenario")
        .filter(|t| picnic_scenario::Scenario::parse(t).is_ok())
        .count();
    assert!(scenarios >= 2, "only {scenarios} scenario seeds are valid");
    let frames = seeds("wire")
        .iter()
        .filter(|s| picnic_wire::decap(s).is_ok())
        .count();
    assert!(frames >= 2, "only {frames} wire seeds decapsulate");
    let limited = seeds("feedback")
        .iter()
        .filter(|s| picnic_fuzz::feedback_limits(s) > 0)
        .count();
    assert!(
        limited >= 3,
        "only {limited} feedback seeds end with a limit applied"
    );
}
