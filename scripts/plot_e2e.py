#!/usr/bin/env python3
"""Plots whole-training-step benchmarks: throughput (tokens/s) and peak memory (MiB) over
the sequence length, one row of two panels per model, one line per provider:

  torch               transformers as is          scripts/device/anchor_e2e.py
  torch+liger-kernel  transformers + Liger-Kernel  scripts/device/anchor_e2e.py
  burn                stock Burn (liger off)       liger bench --e2e
  liger-burn          liger-burn (liger on)        liger bench --e2e

A run with another memory pool (`--memory-pool exact`) or AdamW implementation
(`--adamw-impl`) is its own line, e.g. "liger-burn (memory pool exact)".

Memory: peak reserved (solid: what the allocator held from the device, PyTorch's
max_memory_reserved / on CUDA the high-water mark of CUDA's pool beneath CubeCL's
(`peak_device_reserved_MiB`), elsewhere CubeCL's pool bytes_reserved) and peak in use (dashed: live bytes,
read after each timed step and after each phase of the last one, by both). Lengths where a
provider did not run (oom, timeout, error, invalid) have no point; its first failure is an
x on the axis, named in the legend. When the CSVs hold several runs of a model and
provider at a length, the latest is drawn (latest date; on one date, the run appended
last).

Reads the bench layout (kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date;
rows of mode train_step) and the older `liger bench --e2e` layout
(model,seq,batch,liger,status,tokens_per_s,...). Rows of the runs before the models took
attention in head groups (UNGROUPED_COMMITS) whose eager attention held more than
2^31 - 1 score elements in one tensor are left out and named in the title: CubeCL could
not index such tensors (H200, 2026-11-22); --keep-unindexable plots them anyway.

usage: scripts/plot_e2e.py RESULTS.csv [MORE.csv ...] OUT.png [--gpu TEXT]
                           [--providers P,...] [--keep-unindexable]   (needs matplotlib)
  --gpu TEXT        only rows whose gpu column contains TEXT (e.g. H100)
  --providers P,... only these providers, in this order
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

PROVIDERS = {
    "torch": ("#777777", "PyTorch (transformers, sdpa)"),
    "torch+liger-kernel": ("#1f78b4", "PyTorch + Liger-Kernel"),
    "burn": ("#222222", "stock Burn"),
    "liger-burn": ("#d95f02", "liger-burn"),
}
FAILED = ("oom", "timeout", "error", "invalid")


def label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def config_value(config, key):
    for part in config.split():
        if part.startswith(key + "="):
            return part[len(key) + 1:]
    return None


def variant(provider, config):
    """The provider, named with the settings that make it another line: LoRA steps, a
    memory pool, an AdamW implementation, gradient checkpointing or a matmul ordering other
    than the default."""
    # `cubecl-stream` is the default matmul ordering (where CUPTI is found), named in the
    # rows of runs that asked for it explicitly.
    extra = [f"{key.replace('_', ' ')} {value}"
             for key in ("memory_pool", "adamw_impl", "gradient_checkpointing", "matmul_ordering")
             if (value := config_value(config, key))
             not in (None, "default", "none", "off", "cubecl-stream")]
    lora = config_value(config, "lora")
    if lora:
        # `r64:alpha128:targets`: LoRA steps are another workload, not another setting.
        extra.insert(0, "LoRA " + lora.split(":")[0])
    return f"{provider} ({', '.join(extra)})" if extra else provider


def batch_of(config):
    return int(config_value(config, "batch") or 1)


def number(text):
    return float(text) if text not in ("", None) else None


def load(path):
    """Records {model, seq, provider, status, tokens_per_s, reserved, in_use, config, gpu,
    commit, date} of one CSV, either layout."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    if "tokens_per_s" in rows[0]:  # the older `liger bench --e2e` layout
        return [dict(model=r["model"], seq=int(r["seq"]), batch=int(r["batch"]),
                     provider="liger-burn" if r["liger"] == "on" else "burn",
                     status=r["status"], tokens_per_s=number(r["tokens_per_s"]),
                     reserved=number(r["peak_mib"]), in_use=number(r["in_use_mib"]),
                     config=r["config"], gpu=r["gpu"], commit=r["commit"], date=r["date"])
                for r in rows]
    if "metric" not in rows[0]:
        sys.exit(f"{path}: neither the bench layout nor the e2e layout")
    records = {}
    for r in rows:
        if r["mode"] != "train_step":
            continue
        provider = variant(r["provider"], r["config"])
        key = (r["kernel"], int(r["x"]), provider, r["gpu"], r["commit"], r["date"])
        rec = records.setdefault(key, dict(
            model=r["kernel"], seq=int(r["x"]), batch=batch_of(r["config"]),
            provider=provider, status=config_value(r["config"], "status") or "ok",
            tokens_per_s=None, reserved=None, in_use=None, config=r["config"], gpu=r["gpu"],
            commit=r["commit"], date=r["date"]))
        field = {"tokens/s": "tokens_per_s", "peak_reserved_MiB": "reserved",
                 "peak_device_reserved_MiB": "device_reserved",
                 "peak_in_use_MiB": "in_use"}.get(r["metric"])
        if field:
            rec[field] = number(r["p50"])
    for rec in records.values():
        # On CUDA the device memory CubeCL's allocations held (CUDA's pool counter).
        device = rec.pop("device_reserved", None)
        if device is not None:
            rec["reserved"] = device
    return list(records.values())


def indexable(r):
    heads = QUERY_HEADS.get(r["model"])
    if heads is None or r["commit"] not in UNGROUPED_COMMITS:
        return True
    return r["batch"] * heads * r["seq"] ** 2 <= MAX_SCORE_ELEMENTS


def main(paths, out, gpu=None, providers=None, keep_unindexable=False):
    recs = [r for p in paths for r in load(p)]
    if gpu:
        recs = [r for r in recs if gpu.lower() in r["gpu"].lower()]
    if providers:
        recs = [r for r in recs if r["provider"] in providers]
    dropped = sorted({(r["model"], r["seq"]) for r in recs if not indexable(r)})
    if not keep_unindexable:
        recs = [r for r in recs if indexable(r)]
    if not recs:
        sys.exit("no training-step rows to plot (check --gpu / --providers)")
    # The latest run of each model, provider and length: the latest date, and on one date
    # the run appended last (the CSVs only grow; commit hashes have no order).
    latest = {}
    for i, r in enumerate(recs):
        k = (r["model"], r["provider"], r["seq"])
        latest[k] = max(latest.get(k, ("", -1, "")), (r["date"], i, r["commit"]))
    recs = [
        r
        for r in recs
        if (r["date"], r["commit"])
        == (latest[(r["model"], r["provider"], r["seq"])][0], latest[(r["model"], r["provider"], r["seq"])][2])
    ]
    models = list(dict.fromkeys(r["model"] for r in recs))
    order = providers or [p for p in PROVIDERS if any(r["provider"] == p for r in recs)]
    order += [p for p in dict.fromkeys(r["provider"] for r in recs) if p not in order]
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.2 * len(models)), squeeze=False)
    for row_axes, model in zip(axes, models):
        sel = [r for r in recs if r["model"] == model]
        seqs = sorted({r["seq"] for r in sel})
        ax_t, ax_m = row_axes
        for provider in order:
            base = provider.split(" (")[0]
            color, name = PROVIDERS.get(base, (None, base))
            marker = "o"
            if provider != base:
                # Another line of the same provider: its color lightened, triangles.
                name = provider.replace(base, name, 1)
                rgb = matplotlib.colors.to_rgb(color or "#888888")
                color = tuple(0.45 * c + 0.55 for c in rgb)
                marker = "^"
            pts = {r["seq"]: r for r in sel if r["provider"] == provider}
            if not pts:
                continue
            ok = [n for n in seqs if n in pts and pts[n]["status"] == "ok"]
            tps = [n for n in ok if pts[n]["tokens_per_s"] is not None]
            line = ax_t.plot(tps, [pts[n]["tokens_per_s"] for n in tps], marker + "-",
                             color=color, label=name)[0]
            color = line.get_color()
            res = [n for n in ok if pts[n]["reserved"] is not None]
            ax_m.plot(res, [pts[n]["reserved"] for n in res], marker + "-", color=color,
                      label=f"{name}: reserved")
            use = [n for n in ok if pts[n]["in_use"] is not None]
            ax_m.plot(use, [pts[n]["in_use"] for n in use], "s--", color=color, alpha=0.7,
                      markersize=4, label=f"{name}: in use")
            failed = [n for n in seqs if n in pts and pts[n]["status"] in FAILED]
            if failed:
                n = failed[0]
                for ax in (ax_t, ax_m):
                    ax.plot([n], [0], "x", color=color, markersize=10, clip_on=False,
                            label=f"{name}: {pts[n]['status']} at {label(n)}")
        for ax, title in [(ax_t, "training step throughput (tokens/s, p50 step)"),
                          (ax_m, "peak memory over the timed steps (MiB)")]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs)
            ax.set_xticklabels([label(n) for n in seqs])
            ax.minorticks_off()
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{model}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    gpus = ", ".join(sorted({r["gpu"] for r in recs}))
    runs = ", ".join(sorted({f"{r['provider']} {r['commit']} {r['date']}" for r in recs}))
    batches = ", ".join(str(b) for b in sorted({r["batch"] for r in recs}))
    dtypes = ", ".join(sorted({config_value(r["config"], "dtype") or "?" for r in recs}))
    title = f"training steps, batch {batches}, {dtypes}: {gpus}\n" + textwrap.fill(runs, 140)
    if dropped and not keep_unindexable:
        left = ", ".join(f"{m} {label(n)}" for m, n in dropped)
        title += "\n" + textwrap.fill(
            f"left out, attention scores beyond 32-bit indexing (results invalid): {left}", 140)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def cli(argv):
    opts = {"gpu": None, "providers": None, "keep_unindexable": False}
    files = []
    it = iter(argv)
    for a in it:
        if a == "--gpu":
            opts["gpu"] = next(it, None)
        elif a == "--providers":
            opts["providers"] = [p for p in next(it, "").split(",") if p]
        elif a == "--keep-unindexable":
            opts["keep_unindexable"] = True
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a.startswith("--"):
            sys.exit(f"unknown option {a}\n\n{__doc__}")
        else:
            files.append(a)
    if len(files) < 2:
        sys.exit(__doc__)
    main(files[:-1], files[-1], **opts)


if __name__ == "__main__":
    cli(sys.argv[1:])
