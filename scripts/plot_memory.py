#!/usr/bin/env python3
"""Plots memory and time of one kernel over its first dimension (e.g. fused linear cross
entropy over N = 2K..32K) from a `liger bench` CSV: pool growth (MiB) and full-step time
of the fused op (liger) and the stock Burn path (burn), one line each. A provider that
failed at a size (out of memory) has no point there; the plot says so.

usage: scripts/plot_memory.py RESULTS.csv KERNEL OUT.png   (needs matplotlib)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, kernel, out):
    rows = [r for r in csv.DictReader(open(path)) if r["kernel"] == kernel and r["mode"] == "full"]
    if not rows:
        sys.exit(f"no full-mode rows of {kernel} in {path}")
    series = {}
    for r in rows:
        n = int(r["x"].split("x")[0])
        series.setdefault((r["provider"], r["metric"]), {})[n] = float(r["p50"])
    sizes = sorted({int(r["x"].split("x")[0]) for r in rows})
    meta = rows[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in [(axes[0], "MB", "pool growth over one step (MiB)"), (axes[1], "ms", "forward + backward (ms, p50)")]:
        for provider, color, label in [("burn", "#777777", "stock Burn"), ("liger", "#d95f02", "liger (fused)")]:
            pts = series.get((provider, metric), {})
            xs = [n for n in sizes if n in pts]
            ax.plot(xs, [pts[n] for n in xs], "o-", color=color, label=label)
            missing = [n for n in sizes if n not in pts]
            if missing:
                ax.text(0.02, 0.9 if provider == "burn" else 0.82, f"{label}: no result at N={missing}", transform=ax.transAxes, fontsize=8, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{n // 1024}K" if n >= 1024 else str(n) for n in sizes])
        ax.set_xlabel("N (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    shape = meta["x"].split("x", 1)[1]
    fig.suptitle(f"{kernel} Nx{shape}: {meta['gpu']}, {meta['config'].split()[0]}, commit {meta['commit']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
