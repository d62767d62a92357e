#!/usr/bin/env python3
"""Plots a `liger bench --e2e` CSV: training-step throughput (tokens/s) and peak pool
memory (MiB) over the sequence length, liger on and off, one row of two panels per
model. Lengths where a mode did not run (oom, timeout, error, skipped) have no point;
the first failure of each mode is marked with an x on the axis and named in the legend.
When the CSV holds several runs, the latest date and commit of each model is plotted.

usage: scripts/plot_e2e.py RESULTS.csv OUT.png   (needs matplotlib)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = [("off", "#777777", "liger off (stock Burn)"), ("on", "#d95f02", "liger on (fused)")]


def label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def main(path, out):
    rows = list(csv.DictReader(open(path)))
    if not rows or "tokens_per_s" not in rows[0]:
        sys.exit(f"{path}: not a `liger bench --e2e` CSV (no tokens_per_s column)")
    # The latest run of each model (date, then commit as written).
    latest = {}
    for r in rows:
        key = (r["date"], r["commit"])
        if r["model"] not in latest or key > latest[r["model"]]:
            latest[r["model"]] = key
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 4.0 * len(models)), squeeze=False)
    for row_axes, model in zip(axes, models):
        sel = [r for r in rows if r["model"] == model and (r["date"], r["commit"]) == latest[model]]
        seqs = sorted({int(r["seq"]) for r in sel})
        for ax, column, title in [
            (row_axes[0], "tokens_per_s", "training step throughput (tokens/s, p50 step)"),
            (row_axes[1], "peak_mib", "peak pool memory over a step (MiB reserved)"),
        ]:
            for mode, color, name in MODES:
                pts = {int(r["seq"]): r for r in sel if r["liger"] == mode}
                ok = [n for n in seqs if n in pts and pts[n]["status"] == "ok" and pts[n][column]]
                ax.plot(ok, [float(pts[n][column]) for n in ok], "o-", color=color, label=name)
                failed = [n for n in seqs if n in pts and pts[n]["status"] not in ("ok", "skipped")]
                if failed:
                    n = failed[0]
                    ax.plot([n], [0], "x", color=color, markersize=10, clip_on=False,
                            label=f"{name}: {pts[n]['status']} at {label(n)}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs)
            ax.set_xticklabels([label(n) for n in seqs])
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{model}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    meta = rows[-1]
    batch = meta["batch"]
    dtype = meta["config"].split()[0]
    fig.suptitle(f"liger bench --e2e, batch {batch}, {dtype}: {meta['gpu']}, commit {meta['commit']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
