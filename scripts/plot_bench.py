#!/usr/bin/env python3
"""Plots a `liger bench` CSV: forward / backward / full time of the fused op (liger) and
the stock Burn path (burn) per op and shape, as grouped bars, speedup on top.

usage: scripts/plot_bench.py RESULTS.csv OUT.png   (needs matplotlib)
"""
import csv
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    rows = [r for r in csv.DictReader(open(path)) if r["metric"] == "ms" and r["kernel"] != "copy"]
    cases = OrderedDict()
    for r in rows:
        cases.setdefault((r["kernel"], r["x"]), {})[(r["provider"], r["mode"])] = float(r["p50"])
    meta = rows[0]
    modes = ["forward", "backward", "full"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4.5))
    labels = [f"{k}\n{x}" for k, x in cases]
    for ax, mode in zip(axes, modes):
        liger = [c.get(("liger", mode), 0) for c in cases.values()]
        burn = [c.get(("burn", mode), 0) for c in cases.values()]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], burn, 0.4, label="stock Burn", color="#999999")
        ax.bar([x + 0.2 for x in xs], liger, 0.4, label="liger", color="#d95f02")
        for x, b, l in zip(xs, burn, liger):
            if l > 0:
                ax.text(x, max(b, l) * 1.02, f"{b / l:.1f}x", ha="center", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7, rotation=20)
        ax.set_title(f"{mode} (ms, p50)")
        ax.set_ylabel("ms")
    axes[0].legend()
    fig.suptitle(f"{meta['gpu']}, {meta['config'].split()[0]}, commit {meta['commit']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
