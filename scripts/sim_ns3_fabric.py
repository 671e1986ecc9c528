#!/usr/bin/env python3
"""The leaf-spine fabric beside ns-3 (issue 34, docs/sim.md "ns-3"): for each case (a CDF
and a load) writes the case's scenario file from scenarios/sim/fabric-{websearch,datamining}
.toml (its `load` set, its arrival window `stop_ms` scaled by 0.5 / load so every load has
about the same number of flows, and by `--scale` so that buckets hold enough flows to resolve
a p99, `duration_ms` 100 ms later), runs the simulator on it and the
ns-3 program `sim ns3` writes from it, and prints per case the aggregate throughput over the
arrival window and the FCT slowdown (FCT over the flow's completion alone on the fabric)
p50/p99 per size bucket, both sides with the error. A case whose outputs exist is not rerun.

  python3 scripts/sim_ns3_fabric.py --sim target/release/examples/sim \\
      --python /work/venv-ns3/bin/python --out /tmp/fabric [--cases ws30,ws50,dm70] [--jobs 2] \\
      [--scale ws=2,dm=5]
"""
import argparse
import csv
import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = {"ws": "scenarios/sim/fabric-websearch.toml", "dm": "scenarios/sim/fabric-datamining.toml"}
BUCKETS = [(0, 10_000, "<= 10 KB"), (10_000, 100_000, "10-100 KB"),
           (100_000, 1_000_000, "100 KB-1 MB"), (1_000_000, 1 << 62, "> 1 MB")]
MIN_FLOWS = 100


def case_file(case, out, scale):
    kind, load = case[:2], int(case[2:]) / 100
    text = open(os.path.join(ROOT, FILES[kind])).read()
    stop = int(re.search(r"^stop_ms = (\d+)", text, re.M).group(1))
    base_load = float(re.search(r"^load = ([0-9.]+)", text, re.M).group(1))
    stop = round(stop * base_load / load * scale.get(kind, 1.0))
    text = re.sub(r"^load = .*$", "load = %g" % load, text, flags=re.M)
    text = re.sub(r"^stop_ms = .*$", "stop_ms = %d" % stop, text, flags=re.M)
    text = re.sub(r"^duration_ms = .*$", "duration_ms = %d" % (stop + 100), text, flags=re.M)
    path = os.path.join(out, case + ".toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(case, args):
    d = os.path.join(args.out, case)
    os.makedirs(d, exist_ok=True)
    scen = case_file(case, args.out, args.scale)
    nice = ["nice", "-n", "19"]
    if not os.path.exists(os.path.join(d, "sim", "flows.csv")):
        subprocess.run(nice + [args.sim, scen, "--seed", str(args.seed), "--out",
                               os.path.join(d, "sim")], check=False,
                       stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "sim.log"), "w"))
    # Not ns3.py: the program would import itself as the ns3 package.
    prog = os.path.join(d, "program.py")
    subprocess.run([args.sim, "ns3", scen, "--seed", str(args.seed), "--out", prog], check=True)
    res = os.path.join(d, "ns3.json")
    if not os.path.exists(res) or os.path.getsize(res) == 0:
        with open(res + ".tmp", "w") as o:
            subprocess.run(nice + ["/usr/bin/time", "-f", "%e s wall %U s user %M KB",
                                   args.python, prog], check=True, stdout=o,
                           stderr=open(os.path.join(d, "ns3.log"), "w"))
        os.replace(res + ".tmp", res)
    return case


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def bootstrap(xs, q, rounds=1000):
    """The 95% bootstrap interval of quantile q of xs (how well these flows fix it)."""
    rng = random.Random(1)
    qs = sorted(quantile([rng.choice(xs) for _ in xs], q) for _ in range(rounds))
    return qs[int(0.025 * rounds)], qs[int(0.975 * rounds)]


def report(case, args):
    d = os.path.join(args.out, case)
    ns3 = json.load(open(os.path.join(d, "ns3.json")))
    ideal = {(f[0], f[2]): f[4] for f in ns3["flows"]}
    window = ns3["window_ms"]
    ns_flows = [(f[3], f[5] / f[4]) for f in ns3["flows"] if f[5] is not None]
    sim_flows = []
    with open(os.path.join(d, "sim", "flows.csv")) as f:
        for r in csv.DictReader(f):
            key = (int(r["src"]), int(r["start_ns"]))
            if key in ideal:
                sim_flows.append((int(r["bytes"]), float(r["fct_us"]) * 1e3 / ideal[key]))
    bins = [0.0] * (window[1] - window[0])
    with open(os.path.join(d, "sim", "rates.csv")) as f:
        for r in csv.DictReader(f):
            t = int(r["t_ms"])
            if window[0] <= t < window[1]:
                bins[t - window[0]] += float(r["mbps"])
    sim_mbps = sum(bins) / len(bins)
    n = len(ns3["flows"])
    err = lambda a, b: "%+.1f%%" % ((a / b - 1) * 100) if a is not None and b else "-"
    print("\n### %s: %d flows, arrivals %d-%d ms" % (case, n, window[0], window[1]))
    print("\ncompleted: simulator %d, ns-3 %d of %d; ns-3 timeouts %d, retransmissions %d\n"
          % (len(sim_flows), len(ns_flows), n, ns3["timeouts"], ns3["retransmissions"]))
    print("| | simulator | ns-3 (95% bootstrap interval) | error |\n|---|---|---|---|")
    print("| aggregate throughput, Mb/s | %.1f | %.1f | %s |"
          % (sim_mbps, ns3["aggregate_mbps"], err(sim_mbps, ns3["aggregate_mbps"])))
    for lo, hi, name in BUCKETS:
        s = [x for b, x in sim_flows if lo < b <= hi]
        m = [x for b, x in ns_flows if lo < b <= hi]
        mark = "" if min(len(s), len(m)) >= MIN_FLOWS else " (< %d flows)" % MIN_FLOWS
        for q in (0.5, 0.99):
            a, b = quantile(s, q), quantile(m, q)
            ci = " (%.2f-%.2f)" % bootstrap(m, q) if m else ""
            print("| %s p%d slowdown, %d / %d flows%s | %s | %s%s | %s |"
                  % (name, q * 100, len(s), len(m), mark,
                     "%.2f" % a if a else "-", "%.2f" % b if b else "-", ci, err(a, b)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sim", default=os.path.join(ROOT, "target/release/examples/sim"))
    p.add_argument("--python", default=os.environ.get("PICNIC_NS3_PYTHON", "python3"))
    p.add_argument("--out", default="/tmp/fabric")
    p.add_argument("--cases", default="ws30,ws50,ws70,dm30,dm50,dm70")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--scale", default="ws=1,dm=1",
                   help="arrival window multiplier per CDF (web search's buckets reach 100 "
                        "flows at 1, data mining's > 1 MB at about 6)")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    args.scale = {k: float(v) for k, v in (kv.split("=") for kv in args.scale.split(","))}
    cases = args.cases.split(",")
    if not args.report_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            for c in pool.map(lambda c: run(c, args), cases):
                print("done", c, file=sys.stderr)
    for c in cases:
        report(c, args)


if __name__ == "__main__":
    main()
