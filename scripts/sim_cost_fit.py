#!/usr/bin/env python3
"""The simulator's `[sim.cost]` fitted from the switch's own measured cost model (docs/sim.md
"Cost model").

    python3 scripts/sim_cost_fit.py [--mode picnic] [--csv OUT.csv] LAB_LOG_OR_CSV ...

Each switch of a `picnic lab run` prints, per run, the cost model its loop fitted to its own
CPU clock (`picnic_core::cost::CostFit`, docs/switch.md "CPU as a tenant resource"):

    [picnic h2] switch ... cpu 421.6 ms (...) model 9017 ns/iteration + 0 ns/frame + 14.61 ns/byte

This reads those lines from the given logs (the lab's stderr), keeps the runs of --mode (the
`mode NAME run i/n` line before them), and prints a `[sim.cost]` table whose terms are the
medians over every switch of every run: `poll_ns` (the loop's fixed cost per iteration; the
simulator's poll is one iteration of the same loop), `base_ns` (per frame handled) and
`per_byte_ps`, with no rule term (the switch's fit has none) and the simulator's default
variance. The medians, not a refit: each switch fits its own iterations, and a median over
switches and scenarios keeps one odd fit (a term at 0 or at 18 us) from setting the model.
The spread (quartiles) is printed as comments beside each term. --csv writes the switch lines
it used (file, mode, run, host, the three terms) to a CSV, which this script also reads in
place of the logs (docs/sim/lab-cost-models.csv is the run the default table came from).
"""

import argparse
import csv
import os
import re
import statistics
import sys

MODE = re.compile(r"\] mode (\S+) run (\d+)/\d+")
SWITCH = re.compile(
    r"\[\S+ (h\d+)\] switch .* model (\d+(?:\.\d+)?) ns/iteration \+ (\d+(?:\.\d+)?) ns/frame"
    r" \+ (\d+(?:\.\d+)?) ns/byte"
)


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="picnic")
    ap.add_argument("--csv")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    rows = []
    for path in a.logs:
        with open(path) as f:
            if path.endswith(".csv"):
                rows += [r for r in csv.DictReader(f)]
                continue
            mode, run = None, None
            for line in f:
                m = MODE.search(line)
                if m:
                    mode, run = m.group(1), m.group(2)
                    continue
                m = SWITCH.search(line)
                if m and mode:
                    rows.append({"log": os.path.basename(path), "mode": mode, "run": run,
                                 "host": m.group(1), "fixed_ns": m.group(2),
                                 "per_frame_ns": m.group(3), "per_byte_ns": m.group(4)})
    rows = [r for r in rows if r["mode"] == a.mode]
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["log"])
            w.writeheader()
            w.writerows(rows)
    fits = [tuple(float(r[k]) for k in ("fixed_ns", "per_frame_ns", "per_byte_ns")) for r in rows]
    if len(fits) < 2:
        sys.exit(f"{len(fits)} switch cost models of mode {a.mode!r} in the logs: need 2 or more")
    fixed, frame, byte = zip(*fits)
    print(f"# {len(fits)} switch runs of mode {a.mode} in {len(a.logs)} files; median (quartiles)")
    print("[sim.cost]")
    for key, xs, scale in (("poll_ns", fixed, 1), ("base_ns", frame, 1), ("per_byte_ps", byte, 1000)):
        lo, hi = quartiles(xs)
        print(f"{key} = {round(statistics.median(xs) * scale)}"
              f"   # {lo * scale:.0f}-{hi * scale:.0f}")
    print("per_rule_ns = 0")
    print("rules = 0")


if __name__ == "__main__":
    main()
