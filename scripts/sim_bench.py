#!/usr/bin/env python3
"""The simulator's speed as a ratio: the current tree's build beside a reference build (a
pinned earlier commit), on the same scenario, in one run (docs/sim.md "Performance").

    python3 scripts/sim_bench.py [--ref COMMIT] [--runs N] [--scenario FILE] [--seed N]

The reference's source is exported with `git archive` (no worktree is left behind) and built
into its own target directory under --work; the current tree is built with the usual
`cargo build --release -p picnic-sim --example sim` ($CARGO_TARGET_DIR respected). The
builds then run the scenario alternately (reference first in odd rounds, current first in
even ones, so a drift in the machine's load falls on both), each run timed by
/usr/bin/time. Reported per build: the median CPU time (user + system) of a run, its events
(sim.json, all modes) per CPU second, wall time and peak RSS; then the speed ratio, current
/ reference in events per CPU second, as the median over rounds of each round's pair (the two
runs of a round saw about the same machine) with the rounds' range, and whether the two
builds' results (summary.json, timeseries.csv, latency.csv) are byte-identical, and each
build's own runs with each other. On a shared machine the CPU time is the steadier figure,
but it still moves with the load: only the ratio from one invocation means much.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

# main on 2026-11-28 before issue 34's speed work (docs/sim.md "Performance"): move the pin
# when a faster build is the one to defend.
DEFAULT_REF = "5f22e199c12f049d1b53f41a04286c1a74aafda0"
DEFAULT_SCENARIO = "scenarios/sim/speed-bench.toml"
RESULT_FILES = ("summary.json", "timeseries.csv", "latency.csv")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout.strip()


def build(src: Path, target: Path) -> Path:
    """Builds the simulator's example binary of the tree at `src` into `target`."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    print(f"building {src} into {target}", file=sys.stderr)
    subprocess.run(
        ["cargo", "build", "--release", "-p", "picnic-sim", "--example", "sim"],
        cwd=src,
        env=env,
        check=True,
    )
    return target / "release" / "examples" / "sim"


def export(repo: Path, sha: str, dest: Path):
    """The tree of commit `sha` at `dest` (once)."""
    if (dest / "Cargo.toml").exists():
        return
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        sys.exit(f"git archive {sha} failed")


def run_once(binary: Path, scenario: Path, seed: int, out: Path) -> dict:
    """One run: CPU seconds, wall seconds, peak RSS and the events of every mode."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    timing = out / "time.txt"
    cmd = ["/usr/bin/time", "-f", "%U %S %e %M", "-o", str(timing),
           str(binary), str(scenario), "--out", str(out), "--seed", str(seed)]
    with open(out / "log.txt", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    # 0: every pass mark held, 1: some failed (a verdict, not an error).
    if code not in (0, 1):
        sys.exit(f"{binary} exited with {code}: see {out / 'log.txt'}")
    user, system, wall, rss_kb = timing.read_text().split()[-4:]
    modes = json.loads((out / "sim.json").read_text())
    return {
        "cpu_s": float(user) + float(system),
        "wall_s": float(wall),
        "rss_mb": int(rss_kb) / 1024,
        "events": sum(m["events"] for m in modes),
        "out": out,
    }


def same_results(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in RESULT_FILES)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default=DEFAULT_REF, help="reference commit (default: the pin)")
    ap.add_argument("--runs", type=int, default=3, help="runs per build")
    ap.add_argument("--scenario", default=DEFAULT_SCENARIO)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="target/sim-bench",
                    help="reference sources, its target directory and the runs' outputs")
    args = ap.parse_args()

    repo = Path(sh(["git", "rev-parse", "--show-toplevel"]))
    work = (repo / args.work).resolve()
    scenario = (repo / args.scenario).resolve()
    sha = sh(["git", "-C", str(repo), "rev-parse", f"{args.ref}^{{commit}}"])
    head = sh(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"])
    dirty = sh(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])

    ref_src = work / f"ref-{sha[:12]}"
    export(repo, sha, ref_src)
    # Copies, so a later build of either tree cannot change a binary between rounds.
    binaries = {}
    for name, src, target in [
        ("reference", ref_src, work / "target-ref"),
        ("current", repo, Path(os.environ.get("CARGO_TARGET_DIR", repo / "target")).resolve()),
    ]:
        built = build(src, target)
        binaries[name] = work / f"sim-{name}"
        shutil.copy2(built, binaries[name])

    runs = {"reference": [], "current": []}
    for r in range(args.runs):
        order = ["reference", "current"] if r % 2 == 0 else ["current", "reference"]
        for name in order:
            res = run_once(binaries[name], scenario, args.seed, work / "runs" / f"{name}-{r}")
            runs[name].append(res)
            print(f"round {r + 1}/{args.runs} {name}: {res['cpu_s']:.1f} s CPU, "
                  f"{res['events'] / res['cpu_s'] / 1e6:.2f} M events/CPU-s", file=sys.stderr)

    summary = {
        "scenario": args.scenario,
        "seed": args.seed,
        "reference": sha[:12],
        "current": head + (" (with uncommitted changes)" if dirty else ""),
        "runs": args.runs,
    }
    print(f"\n{args.scenario}, seed {args.seed}, {args.runs} runs each, alternating")
    print(f"{'build':<28} {'events':>12} {'CPU s (median)':>15} {'M ev/CPU-s':>11} "
          f"{'wall s':>8} {'RSS MB':>7} {'runs agree':>10}")
    rate = {}
    for name, label in [("reference", sha[:12]), ("current", summary["current"])]:
        rs = runs[name]
        cpu = statistics.median(r["cpu_s"] for r in rs)
        rate[name] = rs[0]["events"] / cpu
        agree = all(same_results(rs[0]["out"], r["out"]) and r["events"] == rs[0]["events"]
                    for r in rs)
        summary[name] = {
            "events": rs[0]["events"],
            "cpu_s_median": cpu,
            "events_per_cpu_s": rate[name],
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "rss_mb_max": max(r["rss_mb"] for r in rs),
            "runs_identical": agree,
        }
        s = summary[name]
        print(f"{name + ' ' + label:<28} {s['events']:>12,} {cpu:>15.1f} "
              f"{rate[name] / 1e6:>11.2f} {s['wall_s_median']:>8.1f} {s['rss_mb_max']:>7.0f} "
              f"{'yes' if agree else 'NO':>10}")
    per_round = sorted(
        (c["events"] / c["cpu_s"]) / (r["events"] / r["cpu_s"])
        for r, c in zip(runs["reference"], runs["current"])
    )
    summary["ratio_per_round"] = per_round
    summary["ratio_events_per_cpu_s"] = statistics.median(per_round)
    summary["same_results"] = same_results(runs["reference"][0]["out"], runs["current"][0]["out"])
    print(f"speed ratio (current / reference, events per CPU second, median of the rounds' "
          f"pairs): {summary['ratio_events_per_cpu_s']:.2f}x "
          f"(rounds {per_round[0]:.2f}-{per_round[-1]:.2f})")
    print("results byte-identical to the reference's: "
          + ("yes" if summary["same_results"] else "no (the builds simulate differently)"))
    (work / "bench.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {work / 'bench.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
