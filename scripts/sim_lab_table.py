#!/usr/bin/env python3
"""The simulator's side of the lab-vs-simulator table (docs/sim.md "The lab's scenarios in
the simulator, medians of 3"): every shipped lab scenario (scenarios/*.toml) run by the
simulator with several seeds, each pass mark's value per mode as the median over the seeds
(min-max beside it) and how many seeds pass it.

    python3 scripts/sim_lab_table.py [--sim BINARY] [--seeds 1,2,3] [--modes M,M,...]
                                     [--cost FILE] [--out DIR] [SCENARIO ...]

BINARY is `target/release/examples/sim` by default (`cargo build --release -p picnic-sim
--example sim`; $CARGO_TARGET_DIR respected) or `picnic` (then `picnic sim` is run). Each
scenario is copied to --out with `sim.modes` set to --modes (the lab's pairing: `picnic`
and `picnic-off` against `picnic-alone`), so the files themselves are unchanged. A mark is
evaluated in every mode as the lab's summary evaluates it in the judged one
(crates/scenario/src/summary.rs `metric_value`), and judged on the median, as the lab judges
its medians of 3; the seeds passing it on their own are counted beside. --cost appends a
file's `[sim.cost]` table to every copy (`scripts/sim_cost_fit.py` writes one fitted from a
lab run). A scenario the simulator refuses is listed with its reason. The lab's side is not
run here: it comes from docs/RESULTS.md.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

MARK = re.compile(r"^\s*(\S+)\s*(<=|>=)\s*(\S+)\s*$")


def scenario_copy(src: Path, dst: Path, modes, cost):
    """The scenario with `sim.modes` set (a `[sim]` table is added or extended) and `cost`
    (a `[sim.cost]` table's text, or None) appended."""
    lines = src.read_text().splitlines()
    if cost and any(l.strip() == "[sim.cost]" for l in lines):
        sys.exit(f"{src}: already has a [sim.cost] table; not overriding it")
    line = "modes = [" + ", ".join(f'"{m}"' for m in modes) + "]"
    if any(re.match(r"^\s*modes\s*=", l) for l in lines):
        sys.exit(f"{src}: already sets a `modes` key; not overriding it")
    if "[sim]" in (l.strip() for l in lines):
        i = [l.strip() for l in lines].index("[sim]")
        lines.insert(i + 1, line)
    else:
        lines += ["", "[sim]", line]
    if cost:
        lines += ["", cost]
    dst.write_text("\n".join(lines) + "\n")


def mark_value(name, mode, summary):
    """A mark's value in `mode` (None where the mode has none), as the lab's summary."""
    victim = summary.get("victim")
    ratios = summary.get("ratios", {}).get(mode, {})
    tenants = summary["modes"].get(mode, {})
    v = tenants.get(victim, {}) if victim else {}
    if name in ("victim_p50_ratio", "victim_p99_ratio", "victim_p999_ratio",
                "victim_throughput_ratio"):
        return ratios.get(name)
    if name == "victim_loss":
        return v.get("loss")
    if name == "victim_p99_us":
        return v.get("p99_us")
    if name == "victim_throughput_mbps":
        return None if v.get("throughput_bps") is None else v["throughput_bps"] / 1e6
    return summary.get("metrics", {}).get(mode, {}).get(name)


def holds(value, op, bound):
    if value is None:
        return False
    return value <= bound if op == "<=" else value >= bound


def fmt(x):
    if x is None:
        return "-"
    a = abs(x)
    return f"{x:.3g}" if a < 100 else f"{x:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    ap.add_argument("--sim", default=str(target / "release/examples/sim"))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--modes", default="picnic,picnic-off,picnic-alone")
    ap.add_argument("--out", default="out/sim-lab-table")
    ap.add_argument("--cost", help="file with a [sim.cost] table to append to every scenario")
    ap.add_argument("scenarios", nargs="*")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    cost = Path(a.cost).read_text() if a.cost else None
    modes = a.modes.split(",")
    files = [Path(s) for s in a.scenarios] or sorted(Path("scenarios").glob("*.toml"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sim = [a.sim, "sim"] if Path(a.sim).name == "picnic" else [a.sim]
    judged = [m for m in modes if not m.endswith("alone")]
    print("| scenario | mark | " + " | ".join(f"sim {m}" for m in judged) + " |")
    print("|---|---|" + "---|" * len(judged))
    for f in files:
        name = f.stem
        copy = out / f"{name}.toml"
        scenario_copy(f, copy, modes, cost)
        runs = []
        for seed in seeds:
            d = out / f"{name}-seed{seed}"
            p = subprocess.run(sim + [str(copy), "--seed", str(seed), "--out", str(d)],
                               capture_output=True, text=True,
                               env={**os.environ, "RUST_BACKTRACE": "0"})
            if p.returncode not in (0, 1) or not (d / "summary.json").exists():
                reason = (p.stderr.strip().splitlines() or ["no output"])[-1].strip()
                runs = None
                print(f"| {name} | (refused: {reason}) |" + " |" * len(judged))
                break
            runs.append(json.loads((d / "summary.json").read_text()))
        if runs is None:
            continue
        marks = [c["name"] for c in runs[0]["checks"]]
        def p99_cell(mode):
            got = [v for v in (mark_value("victim_p99_us", mode, s) for s in runs) if v is not None]
            if not got:
                return "-"
            return f"{fmt(statistics.median(got))} ({fmt(min(got))}-{fmt(max(got))})"

        # The victim's own p99 (the ratios' numerators) and, alone, their base.
        alone = [m for m in modes if m.endswith("alone")]
        base = f", {alone[0]} {p99_cell(alone[0])}" if alone else ""
        print(f"| {name} | victim p99 us{base} | " + " | ".join(p99_cell(m) for m in judged) + " |")
        for mark in marks:
            m = MARK.match(mark)
            metric, op, bound = m.group(1), m.group(2), float(m.group(3))
            cells = []
            for mode in judged:
                vals = [mark_value(metric, mode, s) for s in runs]
                ok = sum(holds(v, op, bound) for v in vals)
                got = [v for v in vals if v is not None]
                if not got:
                    cells.append("-")
                    continue
                med = statistics.median(got)
                verdict = "pass" if holds(med, op, bound) else "FAIL"
                cells.append(f"{fmt(med)} ({fmt(min(got))}-{fmt(max(got))}), "
                             f"{verdict} (seeds passing {ok}/{len(seeds)})")
            print(f"| {name} | `{mark}` | " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
