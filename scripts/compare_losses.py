#!/usr/bin/env python3
"""Step-by-step loss comparison of two providers' training runs from the same start.

`liger bench --e2e --e2e-save-start DIR` writes each case's random model, LoRA adapter and
token ids; `scripts/device/anchor_e2e.py --start DIR` trains PyTorch (+ PEFT + Liger-Kernel)
from them. Both list every step's loss in their CSV rows' config (`losses=a/b/c...`). This
script pairs the rows of the same model, sequence length, LoRA and optimizer settings and
checks, step by step, that

    |loss_a[i] - loss_b[i]| <= 2^-p * max(|loss_b[0]|, ..., |loss_b[i]|) + r

with p the run dtype's significand bits (bf16 8, f16 11, f32 24) and r the CSV's print
resolution (10^-decimals, half from each side): the two runs agree to within one rounding,
in that dtype, of the largest loss the run has gone through. The largest rather than the
current loss because a difference made at an early, large loss stays in the weights: as
the loss falls the same absolute difference is a growing fraction of it. The strict
per-step relative difference |a - b| / |b| is reported beside it. The same number of
steps is required, and every loss must be finite.

Usage:
    python3 scripts/compare_losses.py benches/data/h200.csv \\
        --a liger-burn --b torch+liger-kernel --config lora=r64 [--steps-csv OUT.csv] [--plot OUT.png]
    python3 scripts/compare_losses.py --self-test

Exit status 1 when a pair disagrees or no pair is found.
"""
import argparse
import csv
import math
import sys

# Significand bits (implicit bit included) of each dtype: its unit roundoff is 2^-p.
SIGNIFICAND_BITS = {"bf16": 8, "f16": 11, "f32": 24}


def config_fields(config):
    """The `key=value` fields of a config column."""
    fields = {}
    for part in config.split():
        if "=" in part:
            key, value = part.split("=", 1)
            fields[key] = value
    return fields


def parse_losses(text):
    return [float(v) for v in text.split("/")]


def resolution(text):
    """The print resolution of a `losses=` list: 10^-(most decimals of its values)."""
    decimals = max((len(v.split(".")[1]) if "." in v else 0) for v in text.split("/"))
    return 10.0 ** -decimals


def runs(paths, provider, required):
    """The last tokens/s row of each (model, seq, lora, optimizer, dtype) of `provider`
    whose config contains every string of `required`, with its losses."""
    found = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["provider"] != provider or row["metric"] != "tokens/s":
                    continue
                if not all(r in row["config"] for r in required):
                    continue
                fields = config_fields(row["config"])
                if fields.get("status") != "ok" or "losses" not in fields:
                    continue
                key = (row["kernel"], int(row["x"]), fields.get("lora", ""),
                       fields.get("optimizer", ""), fields.get("dtype", ""))
                found[key] = {"losses": parse_losses(fields["losses"]),
                              "resolution": resolution(fields["losses"]),
                              "gpu": row.get("gpu", ""), "commit": row.get("commit", ""),
                              "date": row.get("date", "")}
    return found


def compare(a, b, dtype, printed=0.0):
    """Problems with series `a` against `b` (empty: they agree; `printed` is the print
    resolution of the values), and the largest strict per-step relative difference."""
    bits = SIGNIFICAND_BITS[dtype]
    unit = 2.0 ** -bits
    problems = []
    if len(a) != len(b):
        problems.append(f"{len(a)} steps against {len(b)}")
    worst = 0.0
    largest = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        if not (math.isfinite(x) and math.isfinite(y)):
            problems.append(f"step {i}: a non-finite loss ({x}, {y})")
            continue
        largest = max(largest, abs(y))
        rel = abs(x - y) / abs(y) if y != 0 else (0.0 if x == 0 else math.inf)
        worst = max(worst, rel)
        allowed = unit * largest + printed
        if abs(x - y) > allowed:
            problems.append(f"step {i}: {x:.5f} against {y:.5f} (|difference| "
                            f"{abs(x - y):.2e} > 2^-{bits} x {largest:.4f} + {printed:g})")
    return problems, worst


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="*", help="bench CSV files holding both providers' rows")
    p.add_argument("--a", default="liger-burn", help="provider under test (default liger-burn)")
    p.add_argument("--b", default="torch+liger-kernel",
                   help="reference provider (default torch+liger-kernel)")
    p.add_argument("--config", action="append", default=[], metavar="TEXT",
                   help="keep only rows whose config contains TEXT (repeatable), e.g. lora=r64")
    p.add_argument("--steps-csv", metavar="PATH",
                   help="write model,seq,step,loss_a,loss_b,relative,gpu,commit_a,commit_b,date "
                        "rows here")
    p.add_argument("--plot", metavar="PNG", help="draw both providers' loss curves (matplotlib)")
    p.add_argument("--self-test", action="store_true",
                   help="check that the comparison rejects wrong series, then exit")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.csv:
        p.error("give at least one CSV (or --self-test)")
    a_runs = runs(args.csv, args.a, args.config)
    b_runs = runs(args.csv, args.b, args.config)
    pairs = sorted(set(a_runs) & set(b_runs))
    if not pairs:
        print(f"no case has rows of both {args.a} and {args.b} with losses "
              f"(config filter {args.config}); {len(a_runs)} and {len(b_runs)} rows found")
        return 1
    failed = 0
    steps_rows = []
    print(f"{'model':<14} {'seq':>6} {'steps':>5} {args.a + ' first/last':>22} "
          f"{args.b + ' first/last':>30} {'max rel':>9}  verdict (max rel: the strict "
          "per-step |a - b| / |b|)")
    for key in pairs:
        model, seq, lora, optimizer, dtype = key
        a, b = a_runs[key]["losses"], b_runs[key]["losses"]
        printed = max(a_runs[key]["resolution"], b_runs[key]["resolution"])
        problems, worst = compare(a, b, dtype, printed)
        verdict = "agree" if not problems else "DIFFER: " + "; ".join(problems[:3])
        failed += bool(problems)
        print(f"{model:<14} {seq:>6} {len(a):>5} {a[0]:>10.4f} / {a[-1]:<9.4f} "
              f"{b[0]:>18.4f} / {b[-1]:<9.4f} {worst:>9.2e}  {verdict}")
        run_a, run_b = a_runs[key], b_runs[key]
        for i, (x, y) in enumerate(zip(a, b)):
            steps_rows.append([model, seq, i, f"{x:.6f}", f"{y:.6f}", f"{abs(x - y) / abs(y):.3e}",
                               run_a["gpu"], run_a["commit"], run_b["commit"], run_a["date"]])
    if args.steps_csv:
        with open(args.steps_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "seq", "step", f"loss_{args.a}", f"loss_{args.b}", "relative",
                        "gpu", f"commit_{args.a}", f"commit_{args.b}", "date"])
            w.writerows(steps_rows)
    if args.plot:
        plot(args, pairs, a_runs, b_runs)
    return 1 if failed else 0


def plot(args, pairs, a_runs, b_runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), squeeze=False)
    for ax, key in zip(axes[0], pairs):
        model, seq = key[0], key[1]
        for runs_of, name, style in ((a_runs, args.a, "-"), (b_runs, args.b, "--")):
            losses = runs_of[key]["losses"]
            ax.plot(range(len(losses)), losses, style, label=name)
        ax.set_title(f"{model}, {seq} tokens")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Training loss from the same start (" + ", ".join(args.config or ["all"]) + ")")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


def self_test():
    """The comparison must reject: a doubled series, zeros, a dropped step, a series one
    step behind, a NaN; and accept the reference itself and one rounding away."""
    b = [12.0 * 0.9 ** i for i in range(50)]
    tol = 2.0 ** -SIGNIFICAND_BITS["bf16"]
    wrong = {
        "doubled": [2 * x for x in b],
        "zeros": [0.0 for _ in b],
        "dropped step": b[:20] + b[21:],
        "one step behind": [b[0]] + b[:-1],
        "a late divergence": b[:40] + [x + 0.1 for x in b[40:]],
        "a NaN": b[:10] + [math.nan] + b[11:],
    }
    for name, a in wrong.items():
        problems, _ = compare(a, b, "bf16")
        assert problems, f"the comparison accepted a series with {name}"
    near = [x + tol / 2 * b[0] for x in b]
    for name, a in {"itself": b, "half a tolerance off": near}.items():
        problems, _ = compare(a, b, "bf16")
        assert not problems, f"the comparison rejected {name}: {problems}"
    # f32's tolerance is far tighter: half bf16's tolerance off fails there.
    problems, _ = compare(near, b, "f32")
    assert problems, "f32's tolerance accepted a bf16-sized difference"
    print("compare_losses self-test: wrong series rejected, right ones accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
