//! The sweep file and its expansion into cases: a base scenario, fixed overrides (`set`),
//! parameters (each a list of levels), seeds and modes. Every case is the base scenario's
//! TOML with its levels' overrides applied, parsed as a [`Spec`] (so the lab's and the
//! simulator's validation apply to every case before anything runs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use crate::spec::Spec;

/// `SWEEP.toml` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Name in progress lines and tables (default: the file's stem).
    pub name: Option<String>,
    /// Base scenario, relative to the sweep file's directory.
    pub scenario: PathBuf,
    /// Seeds every parameter combination runs with (the repetitions the confidence
    /// intervals are over).
    pub seeds: Vec<u64>,
    /// Modes every case runs (`sim.modes` of the base scenario when absent).
    pub modes: Option<Vec<String>>,
    /// Metrics of the merged table (`TENANT.FIELD`, `victim.FIELD`, `victim_p99_ratio`,
    /// scenario metrics, `sim.events`, ...; see [`super::METRICS_DOC`]).
    #[serde(default = "default_metrics")]
    pub metrics: Vec<String>,
    /// Overrides applied to every case: `PATH = VALUE`.
    #[serde(default)]
    pub set: toml::Table,
    /// The grid's axes, in order: the first varies slowest.
    #[serde(default)]
    pub params: Vec<ParamFile>,
    /// Run on Ray (as `--ray`).
    pub ray: Option<RayTable>,
}

fn default_metrics() -> Vec<String> {
    [
        "victim.p50_us",
        "victim.p99_us",
        "victim.loss",
        "victim.throughput_mbps",
    ]
    .map(String::from)
    .to_vec()
}

/// `[ray]`: run the cases as Ray tasks.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RayTable {
    /// Address of an existing cluster (`ray.init(address=...)`); a local Ray when absent.
    pub address: Option<String>,
    /// Python interpreter with Ray (default: `$PICNIC_PYTHON`, else `python3`).
    pub python: Option<String>,
}

/// One `[[params]]` entry: either `path` + `values`, or `name` + `levels`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamFile {
    /// Column name (default: `path`).
    pub name: Option<String>,
    /// Path of the field every value sets.
    pub path: Option<String>,
    /// Values of `path`.
    #[serde(default)]
    pub values: Vec<toml::Value>,
    /// Levels, each a set of overrides and removals under a label.
    #[serde(default)]
    pub levels: Vec<LevelFile>,
}

/// One level of a `levels` parameter.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelFile {
    /// The level's value in the table.
    pub label: String,
    /// `PATH = VALUE` overrides.
    #[serde(default)]
    pub set: toml::Table,
    /// Paths removed (array elements by name: `workloads.flood3`).
    #[serde(default)]
    pub remove: Vec<String>,
}

/// One change to the scenario's TOML.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Set the field at the path (created when absent; every array element the path matches).
    Set(String, toml::Value),
    /// Remove the field or the matching array elements.
    Remove(String),
}

/// A parameter, normalized: a name and its levels.
#[derive(Debug, Clone)]
pub struct Param {
    /// Column name.
    pub name: String,
    /// (label, overrides) per level, in file order.
    pub levels: Vec<(String, Vec<Op>)>,
}

/// One case: a parameter combination and a seed.
#[derive(Debug, Clone)]
pub struct Case {
    /// Position in the grid (row-major over params, seeds innermost).
    pub index: usize,
    /// Stable name, also its record's file name: `p1=v1__p2=v2__seed=S`.
    pub id: String,
    /// (param name, level label) per parameter.
    pub labels: Vec<(String, String)>,
    /// Seed.
    pub seed: u64,
    /// The scenario's TOML with the overrides applied (what runs).
    pub scenario_text: String,
    /// Hash of `scenario_text` and the seed: a record is reused only with the same one.
    pub fingerprint: String,
}

/// An expanded sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Name.
    pub name: String,
    /// The file as read.
    pub file: SweepFile,
    /// The sweep file's path.
    pub path: PathBuf,
    /// Normalized parameters.
    pub params: Vec<Param>,
    /// Every case in grid order.
    pub cases: Vec<Case>,
}

/// Flattens nested tables into dotted paths (`{sim = {replicas = 4}}` and
/// `{"sim.replicas" = 4}` mean the same).
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<Op>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) if !t.is_empty() => flatten(&path, t, out),
            _ => out.push(Op::Set(path, v.clone())),
        }
    }
}

fn label_of(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `*` matches any run of characters; everything else itself.
pub fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, rest)) => {
            let Some(tail) = s.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}

fn element_matches(i: usize, v: &toml::Value, seg: &str) -> bool {
    seg == i.to_string()
        || v.get("name")
            .and_then(|n| n.as_str())
            .is_some_and(|n| glob(seg, n))
}

/// Applies `op` under `v`; returns how many places it changed.
fn apply_at(v: &mut toml::Value, segs: &[&str], op: &Op) -> Result<usize> {
    let (seg, rest) = segs.split_first().ok_or_else(|| anyhow!("empty path"))?;
    let last = rest.is_empty();
    match v {
        toml::Value::Table(t) => {
            let keys: Vec<String> = if seg.contains('*') {
                t.keys().filter(|k| glob(seg, k)).cloned().collect()
            } else {
                vec![seg.to_string()]
            };
            let mut n = 0;
            for k in keys {
                if last {
                    match op {
                        Op::Set(_, value) => {
                            t.insert(k, value.clone());
                            n += 1;
                        }
                        Op::Remove(_) => n += usize::from(t.remove(&k).is_some()),
                    }
                    continue;
                }
                if !t.contains_key(&k) {
                    match op {
                        // A missing table on the way is created (`sim` in a lab file); a
                        // misspelt field is then refused by the scenario's validation.
                        Op::Set(..) => {
                            t.insert(k.clone(), toml::Value::Table(toml::Table::new()));
                        }
                        Op::Remove(_) => continue,
                    }
                }
                if let Some(child) = t.get_mut(&k) {
                    n += apply_at(child, rest, op)?;
                }
            }
            Ok(n)
        }
        toml::Value::Array(a) => {
            if last {
                match op {
                    Op::Set(_, value) => {
                        let mut n = 0;
                        for (i, e) in a.iter_mut().enumerate() {
                            if element_matches(i, e, seg) {
                                *e = value.clone();
                                n += 1;
                            }
                        }
                        Ok(n)
                    }
                    Op::Remove(_) => {
                        let before = a.len();
                        let mut i = 0;
                        a.retain(|e| {
                            let keep = !element_matches(i, e, seg);
                            i += 1;
                            keep
                        });
                        Ok(before - a.len())
                    }
                }
            } else {
                let mut n = 0;
                for (i, e) in a.iter_mut().enumerate() {
                    if element_matches(i, e, seg) {
                        n += apply_at(e, rest, op)?;
                    }
                }
                Ok(n)
            }
        }
        other => bail!("`{seg}`: {} is not a table or an array", other.type_str()),
    }
}

/// Applies overrides to a scenario's TOML table; an override that matches nothing is an
/// error (a misspelt path must not run the base scenario under a new label).
pub fn apply(table: &mut toml::Table, ops: &[Op]) -> Result<()> {
    for op in ops {
        let path = match op {
            Op::Set(p, _) | Op::Remove(p) => p,
        };
        let segs: Vec<&str> = path.split('.').collect();
        if segs.iter().any(|s| s.is_empty()) {
            bail!("path `{path}`: empty segment");
        }
        let mut root = toml::Value::Table(std::mem::take(table));
        let n = apply_at(&mut root, &segs, op).with_context(|| format!("path `{path}`"))?;
        if let toml::Value::Table(t) = root {
            *table = t;
        }
        if n == 0 {
            bail!("path `{path}` matches nothing in the scenario");
        }
    }
    Ok(())
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn id_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-+.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Sweep {
    /// Reads and expands a sweep file.
    pub fn load(path: &Path) -> Result<Sweep> {
        Sweep::load_with(path, &[])
    }

    /// Reads a sweep file, adds `extra` to its `set` table (`--set PATH=VALUE`), expands it.
    pub fn load_with(path: &Path, extra: &[(String, toml::Value)]) -> Result<Sweep> {
        let mut text = std::fs::read_to_string(path)
            .with_context(|| format!("reading sweep {}", path.display()))?;
        if !extra.is_empty() {
            let mut t: toml::Table =
                toml::from_str(&text).map_err(|e| anyhow!("sweep {}: {e}", path.display()))?;
            let set = t
                .entry("set")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let set = set
                .as_table_mut()
                .ok_or_else(|| anyhow!("sweep {}: `set` is not a table", path.display()))?;
            for (k, v) in extra {
                set.insert(k.clone(), v.clone());
            }
            text = toml::to_string(&t)?;
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sweep".into());
        let mut sweep =
            Sweep::parse(&text, dir, &stem).with_context(|| format!("sweep {}", path.display()))?;
        sweep.path = path.to_path_buf();
        Ok(sweep)
    }

    /// Parses sweep text whose relative paths are under `dir`, and expands it.
    pub fn parse(text: &str, dir: &Path, default_name: &str) -> Result<Sweep> {
        let file: SweepFile = toml::from_str(text).map_err(|e| anyhow!("{e}"))?;
        let scenario_path = dir.join(&file.scenario);
        let base = std::fs::read_to_string(&scenario_path)
            .with_context(|| format!("reading scenario {}", scenario_path.display()))?;
        let mut sweep = Sweep::expand(file, &base)?;
        if sweep.file.name.is_none() {
            sweep.name = default_name.to_string();
        }
        Ok(sweep)
    }

    /// Expands `file` over the base scenario's text: every parameter combination (the first
    /// parameter varying slowest) times every seed (innermost).
    pub fn expand(file: SweepFile, base_text: &str) -> Result<Sweep> {
        if file.seeds.is_empty() {
            bail!("field `seeds`: needs at least one seed");
        }
        if file.seeds.iter().collect::<BTreeSet<_>>().len() != file.seeds.len() {
            bail!("field `seeds`: a seed is listed twice");
        }
        if file.metrics.is_empty() {
            bail!("field `metrics`: needs at least one metric");
        }
        let mut params = Vec::new();
        for (i, p) in file.params.iter().enumerate() {
            let levels: Vec<(String, Vec<Op>)> = match (&p.path, p.levels.is_empty()) {
                (Some(path), true) if !p.values.is_empty() => p
                    .values
                    .iter()
                    .map(|v| (label_of(v), vec![Op::Set(path.clone(), v.clone())]))
                    .collect(),
                (None, false) if p.values.is_empty() => p
                    .levels
                    .iter()
                    .map(|l| {
                        let mut ops = Vec::new();
                        flatten("", &l.set, &mut ops);
                        ops.extend(l.remove.iter().cloned().map(Op::Remove));
                        (l.label.clone(), ops)
                    })
                    .collect(),
                _ => bail!(
                    "params[{i}]: either `path` with non-empty `values`, or `levels` (with `name`)"
                ),
            };
            let name = p
                .name
                .clone()
                .or_else(|| p.path.clone())
                .ok_or_else(|| anyhow!("params[{i}]: a `levels` parameter needs a `name`"))?;
            if name == "mode" || name == "seed" || name == "seeds" {
                bail!("params[{i}]: `{name}` is a column of its own; name the parameter otherwise");
            }
            if params.iter().any(|q: &Param| q.name == name) {
                bail!("params[{i}]: a second parameter named `{name}`");
            }
            let labels: BTreeSet<&String> = levels.iter().map(|(l, _)| l).collect();
            if labels.len() != levels.len() {
                bail!("params[{i}] `{name}`: two levels with the same label");
            }
            params.push(Param { name, levels });
        }

        let base: toml::Table = toml::from_str(base_text).map_err(|e| anyhow!("{e}"))?;
        let mut fixed = Vec::new();
        flatten("", &file.set, &mut fixed);
        if let Some(modes) = &file.modes {
            if modes.is_empty() {
                bail!("field `modes`: needs at least one mode");
            }
            fixed.push(Op::Set(
                "sim.modes".into(),
                toml::Value::Array(modes.iter().cloned().map(toml::Value::String).collect()),
            ));
        }

        let combos: usize = params.iter().map(|p| p.levels.len()).product();
        let mut cases = Vec::with_capacity(combos * file.seeds.len());
        let mut ids = BTreeSet::new();
        for c in 0..combos {
            // Row-major: the last parameter varies fastest.
            let mut rem = c;
            let mut pick = vec![0; params.len()];
            for (k, p) in params.iter().enumerate().rev() {
                pick[k] = rem % p.levels.len();
                rem /= p.levels.len();
            }
            let mut table = base.clone();
            apply(&mut table, &fixed).context("field `set`")?;
            let mut labels = Vec::new();
            for (p, &l) in params.iter().zip(&pick) {
                let (label, ops) = &p.levels[l];
                apply(&mut table, ops)
                    .with_context(|| format!("parameter `{}` = {label}", p.name))?;
                labels.push((p.name.clone(), label.clone()));
            }
            let scenario_text = toml::to_string(&table)?;
            let spec = Spec::parse(&scenario_text).with_context(|| {
                let l: Vec<String> = labels.iter().map(|(n, v)| format!("{n}={v}")).collect();
                format!("case {}", l.join(" "))
            })?;
            // The name stays the base scenario's, so the lab's report keys do not change.
            let _ = spec;
            for &seed in &file.seeds {
                let mut id: Vec<String> = labels
                    .iter()
                    .map(|(n, v)| format!("{}={}", id_part(n), id_part(v)))
                    .collect();
                id.push(format!("seed={seed}"));
                let id = id.join("__");
                if !ids.insert(id.clone()) {
                    bail!("two cases are named {id}: make the labels differ in letters and digits");
                }
                let fingerprint = format!(
                    "{:016x}",
                    fnv64(format!("{scenario_text}\n#seed={seed}").as_bytes())
                );
                cases.push(Case {
                    index: cases.len(),
                    id,
                    labels: labels.clone(),
                    seed,
                    scenario_text: scenario_text.clone(),
                    fingerprint,
                });
            }
        }
        Ok(Sweep {
            name: file.name.clone().unwrap_or_else(|| "sweep".into()),
            file,
            path: PathBuf::new(),
            params,
            cases,
        })
    }

    /// The modes every case runs, in order.
    pub fn modes(&self) -> Result<Vec<String>> {
        let case = self.cases.first().ok_or_else(|| anyhow!("no cases"))?;
        Ok(Spec::parse(&case.scenario_text)?.sim.modes)
    }

    /// The case named `id`.
    pub fn case(&self, id: &str) -> Result<&Case> {
        self.cases.iter().find(|c| c.id == id).ok_or_else(|| {
            anyhow!(
                "no case `{id}` in sweep {} (`picnic sim sweep FILE --list` lists them)",
                self.name
            )
        })
    }
}

/// `PATH=VALUE` of `--set`: VALUE as TOML (`24`, `true`, `"x"`, `[1, 2]`), else as a string.
pub fn parse_set(arg: &str) -> Result<(String, toml::Value)> {
    let (path, value) = arg
        .split_once('=')
        .ok_or_else(|| anyhow!("--set {arg}: PATH=VALUE"))?;
    let value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.into()),
    };
    Ok((path.trim().to_string(), value))
}
