#!/usr/bin/env python3
"""Summarize an Nsight Compute CSV written by scripts/gpu_profile.sh (`--csv`, with
`--metrics` or `--page details`): one line per kernel launch with the metrics that say
whether it is bound by DRAM, by instruction issue or by occupancy.

    usage: scripts/ncu_summary.py NCU_CSV[.gz] [KERNEL_PREFIX ...]

Only launches whose kernel name starts with one of the prefixes are printed (all when none
is given). ncu's own notes before the header line are skipped.
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


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path, prefixes = sys.argv[1], tuple(sys.argv[2:])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    launches = collections.OrderedDict()
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
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
