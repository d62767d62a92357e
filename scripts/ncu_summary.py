#!/usr/bin/env python3
"""Summarize an Nsight Compute CSV written by scripts/gpu_profile.sh (`--csv`, with
`--metrics` or `--page details`): one line per kernel launch with the metrics that say
whether it is bound by DRAM, by instruction issue or by occupancy.

    usage: scripts/ncu_summary.py NCU_CSV[.gz] [KERNEL_PREFIX ...]
           scripts/ncu_summary.py --total NCU_CSV[.gz] [TOP]

Only launches whose kernel name starts with one of the prefixes are printed (all when none
is given). ncu's own notes before the header line are skipped.

--total: the sum of every launch's gpu__time_duration (all processes), then the TOP (default
25) kernel names by summed duration with their launch counts.
"""
import collections
import csv
import gzip
import io
import sys

WANTED = [
    ("Duration", "dur"),
    ("gpu__time_duration.sum", "dur"),
    ("DRAM Throughput", "dram%"),
    ("Memory Throughput", "mem"),
    ("Compute (SM) Throughput", "sm%"),
    ("Registers Per Thread", "regs"),
    ("Theoretical Occupancy", "occ.theor%"),
    ("Achieved Occupancy", "occ%"),
    ("Issued Warp Per Scheduler", "issued/sched"),
    ("Eligible Warps Per Scheduler", "eligible/sched"),
    ("Warp Cycles Per Issued Instruction", "cyc/instr"),
    ("dram__bytes_read.sum", "read"),
    ("dram__bytes_write.sum", "written"),
]


def rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no kernel rows (ncu profiled nothing; see its log)")
    return csv.DictReader(io.StringIO("\n".join(lines[start:])))


def total(path, top):
    scale = {"ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "nsecond": 1e-6,
             "second": 1e3, "s": 1e3}
    by_name = collections.defaultdict(lambda: [0.0, 0])
    launches, ms = 0, 0.0
    for r in rows(path):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", "")) * scale[r.get("Metric Unit", "ns")]
        name = r["Kernel Name"].split("(")[0].split("<")[0]
        by_name[name][0] += value
        by_name[name][1] += 1
        launches += 1
        ms += value
    print(f"{launches} launches, {ms:.3f} ms of kernel time")
    for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{t:10.3f} ms {n:6} x  {name[:90]}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--total":
        total(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25)
        return
    path, prefixes = sys.argv[1], tuple(sys.argv[2:])
    launches = collections.OrderedDict()
    for r in rows(path):
        if not r.get("Metric Name"):
            continue
        key = (int(r["ID"]), r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""))
        unit = r.get("Metric Unit", "")
        launches.setdefault(key, {})[r["Metric Name"]] = f"{r['Metric Value']}{unit if unit != '%' else '%'}"
    for (lid, name, grid, block), m in launches.items():
        if prefixes and not name.startswith(prefixes):
            continue
        fields = [f"{short}={m[metric]}" for metric, short in WANTED if metric in m]
        print(f"{lid:4} {name[:44]:44} grid {grid} block {block}")
        print("       " + "  ".join(fields))


if __name__ == "__main__":
    main()
