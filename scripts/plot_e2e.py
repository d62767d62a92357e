#!/usr/bin/env python3
"""Plots a `liger bench --e2e` CSV: training-step throughput (tokens/s) and peak pool
memory (MiB) over the sequence length, liger on and off, one row of two panels per
model. Lengths where a mode did not run (oom, timeout, error, skipped) have no point;
the first failure of each mode is marked with an x on the axis and named in the legend.
When the CSV holds several runs, the latest date and commit of each model is plotted.

Rows of the runs before the models took attention in head groups (UNGROUPED_COMMITS)
whose eager attention held more than 2^31 - 1 score elements in one tensor (batch x
query heads x seq^2) are left out and named in the title: CubeCL could not index such
tensors and those steps did not compute their attention in full (H200, 2026-11-22).
Pass --keep-unindexable to plot them anyway. Later runs mark such steps themselves
(status `invalid`: less memory in use than eager attention must keep), and those rows
get no point, like failures.

usage: scripts/plot_e2e.py RESULTS.csv OUT.png [--keep-unindexable]   (needs matplotlib)
"""
import csv
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Query heads of the e2e models (score elements = batch x heads x seq^2).
QUERY_HEADS = {"llama3.2-1b": 32, "qwen2.5-1.5b": 12, "tiny-llama": 4, "tiny-qwen3": 4}
MAX_SCORE_ELEMENTS = 2**31 - 1
# Commits whose e2e runs took each layer's attention in one [batch, heads, seq, seq] tensor.
UNGROUPED_COMMITS = {"a53c3a4"}

MODES = [("off", "#777777", "liger off (stock Burn)"), ("on", "#d95f02", "liger on (fused)")]


def label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def indexable(r):
    heads = QUERY_HEADS.get(r["model"])
    if heads is None or r["commit"] not in UNGROUPED_COMMITS:
        return True
    return int(r["batch"]) * heads * int(r["seq"]) ** 2 <= MAX_SCORE_ELEMENTS


def main(path, out, keep_unindexable=False):
    rows = list(csv.DictReader(open(path)))
    dropped = sorted({(r["model"], int(r["seq"])) for r in rows if not indexable(r)})
    if not keep_unindexable:
        rows = [r for r in rows if indexable(r)]
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
                if mode == "on" and any("attention=recompute" in r["config"] for r in sel):
                    name = "liger on (fused kernels + attention)"
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
    title = f"liger bench --e2e, batch {batch}, {dtype}: {meta['gpu']}, commit {meta['commit']}, {meta['date']}"
    if dropped and not keep_unindexable:
        left = ", ".join(f"{m} {label(n)}" for m, n in dropped)
        title += "\n" + textwrap.fill(
            f"left out, attention scores beyond 32-bit indexing (results invalid): {left}", 110)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], keep_unindexable="--keep-unindexable" in sys.argv)
