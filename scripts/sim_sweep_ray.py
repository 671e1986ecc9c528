#!/usr/bin/env python3
"""Ray driver of `picnic sim sweep --ray` (the binary carries a copy and writes it to OUT/.ray/).

Runs each pending case of a sweep as a Ray task: the task runs the single-case invocation
`WORKER... SWEEP --case ID` (WORKER is `picnic sim sweep`), which prints the case's record as
JSON; the driver writes it to OUT/cases/ID.json (atomically), so a later run skips it. The
binary then merges the records. By hand:

    python3 scripts/sim_sweep_ray.py --sweep S.toml --out DIR --cases ids.txt \
        [--address ray://host:10001] -- /path/to/picnic sim sweep

Without --address a local Ray is started for the run (and stopped after it). With a cluster,
the binary, the sweep file and its scenario must be at the same paths on every node; the
records come back through Ray, so OUT need only exist here.
Exit: 0 every case finished, 1 some failed, 2 bad arguments, 3 no Ray in this Python.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", required=True, help="file with one case id a line")
    ap.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    ap.add_argument("worker", nargs="+", help="the single-case command, e.g. picnic sim sweep")
    a = ap.parse_args()
    try:
        import ray
    except ImportError:
        print("[ray] no `ray` module in %s (bash scripts/setup_ray.sh)" % sys.executable,
              file=sys.stderr)
        return 3
    with open(a.cases) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        return 0

    @ray.remote(num_cpus=1)
    def run_case(case_id):
        t0 = time.time()
        p = subprocess.run(a.worker + [a.sweep, "--case", case_id],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return case_id, p.returncode, p.stdout, p.stderr[-2000:], time.time() - t0

    started = time.time()
    if a.address:
        ray.init(address=a.address, log_to_driver=False)
    else:
        ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    print("[ray] %d cases on %s (%s CPUs), Ray up in %.1f s" % (
        len(ids), a.address or "a local Ray", int(ray.cluster_resources().get("CPU", 0)),
        time.time() - started), file=sys.stderr)
    os.makedirs(os.path.join(a.out, "cases"), exist_ok=True)
    waiting = [run_case.remote(i) for i in ids]
    done = failed = 0
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1)
        case_id, rc, out, err, wall = ray.get(ready[0])
        done += 1
        record = None
        if rc == 0:
            try:
                record = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                record = None
        if record is None or record.get("id") != case_id:
            failed += 1
            print("[ray] %d/%d %s failed (exit %s): %s" % (
                done, len(ids), case_id, rc, err.strip().splitlines()[-1:] or ""),
                file=sys.stderr)
            continue
        path = os.path.join(a.out, "cases", case_id + ".json")
        tmp = os.path.join(a.out, "cases", "." + case_id + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        print("[ray] %d/%d %s in %.1f s" % (done, len(ids), case_id, wall), file=sys.stderr)
    ray.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
