#!/usr/bin/env python3
"""The PyTorch anchors of `liger bench --op fused_linear_dpo` and `--op fused_linear_jsd`:
the same losses on the same shapes, composed by PyTorch eager (provider `torch`) and by
Liger-Kernel's chunked losses (provider `liger-kernel`), as rows of the project's bench
CSV (scripts/device/bench_csv.py).

Ops (shapes and inputs as verify/src/bench/ops.rs):
  fused_linear_dpo 8x1024x4096x128256   (pairs x tokens x hidden x vocabulary): hidden
      states x [2B, T, H] (chosen sequences then rejected), a policy head W [V, H] and a
      frozen reference head W_ref [V, H] over the same x, targets [2B, T] (no ignored
      position), DPO sigmoid, beta 0.1, summed log-probabilities.
      torch: logits = x @ W^T, f32 log_softmax, gather, sum per sequence, the reference's
      under no_grad, -logsigmoid(beta * margins).mean() (TRL's DPO without Liger).
      liger-kernel: LigerFusedLinearDPOLoss(use_ref_model=True, compiled=True, chunk_size=1).
  fused_linear_jsd 8192x4096x128256     (rows x hidden x vocabulary): student x [N, H] and
      W [V, H], teacher x [N, H] and W [V, H] (frozen), targets [N]; generalized JSD
      beta 0.5, temperature 1, weights hard 0.5 / soft 0.5.
      torch: both heads' logits, f32 log_softmax, the JSD (Liger-Kernel's formula), the
      hard cross entropy, mean over the rows.
      liger-kernel: LigerFusedLinearJSDLoss(compiled=True, chunk_size=1024).

Modes: forward (no_grad) and full (forward + torch.autograd.grad with respect to the
student's x and W), the derived backward; metrics ms (CUDA events, p50/p20/p80 over
--repeats samples of --iters iterations after --warmup), TFLOP/s of the matrix products
(DPO: 2·2BT·H·V per head forward, + 4·2BT·H·V for the gradients; JSD likewise), MB (growth
of torch.cuda.memory_reserved over one iteration after empty_cache, outputs and gradients
alive) and MB_allocated (growth of max_memory_allocated). A measurement that runs out of
memory gives one ms row with status=oom and the run goes on.

Example (device machine; a few minutes on an H200, Liger-Kernel installed):
    python3 scripts/device/anchor_post.py --csv $OUT/anchor_post.csv
A smoke run on the CPU at small shapes (timings with time.perf_counter, no memory rows):
    python3 scripts/device/anchor_post.py --device cpu --dtype f32 \\
        --dpo-shape 2x16x32x101 --jsd-shape 64x32x101 --warmup 1 --iters 1 --repeats 2
"""
import argparse
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_csv  # noqa: E402

MIB = float(1 << 20)
BETA = 0.1
JSD_BETA = 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", metavar="PATH", help="append the rows to this CSV (default: print)")
    p.add_argument("--ops", default="fused_linear_dpo,fused_linear_jsd", metavar="OP,...")
    p.add_argument("--providers", default="torch,liger-kernel", metavar="P,...")
    p.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    p.add_argument("--dpo-shape", default="8x1024x4096x128256", metavar="BxTxHxV")
    p.add_argument("--jsd-shape", default="8192x4096x128256", metavar="NxHxV")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpu", default=os.environ.get("LIGER_GPU_NAME"))
    p.add_argument("--commit", default=None)
    return p.parse_args(argv)


def dims(text):
    return tuple(int(d) for d in text.lower().split("x"))


class Bench:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
        torch.manual_seed(args.seed)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def time(self, fn):
        a = self.args
        for _ in range(a.warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(a.repeats):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(a.iters):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / a.iters)
            else:
                t0 = time.perf_counter()
                for _ in range(a.iters):
                    fn()
                samples.append((time.perf_counter() - t0) / a.iters)
        return samples

    def memory(self, fn):
        if not self.cuda:
            return None
        torch = self.torch
        self.sync()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        res0 = torch.cuda.memory_reserved(self.device)
        alloc0 = torch.cuda.memory_allocated(self.device)
        held = fn()
        self.sync()
        grown = (torch.cuda.max_memory_reserved(self.device) - res0,
                 torch.cuda.max_memory_allocated(self.device) - alloc0)
        del held
        return grown

    def uniform(self, shape, lo, hi):
        return self.torch.empty(shape, device=self.device, dtype=self.dtype).uniform_(lo, hi)

    # -- inputs and losses ----------------------------------------------------------------

    def dpo_inputs(self, shape):
        b, t, h, v = shape
        s = 1.0 / math.sqrt(h)
        return dict(x=self.uniform((2 * b, t, h), -1.0, 1.0),
                    w=self.uniform((v, h), -2.0 * s, 2.0 * s),
                    w_ref=self.uniform((v, h), -2.0 * s, 2.0 * s),
                    targets=self.torch.randint(0, v, (2 * b, t), device=self.device))

    def jsd_inputs(self, shape):
        n, h, v = shape
        s = 1.0 / math.sqrt(h)
        return dict(x=self.uniform((n, h), -1.0, 1.0),
                    w=self.uniform((v, h), -2.0 * s, 2.0 * s),
                    tx=self.uniform((n, h), -1.0, 1.0),
                    tw=self.uniform((v, h), -2.0 * s, 2.0 * s),
                    targets=self.torch.randint(0, v, (n,), device=self.device))

    def loss_fn(self, op, provider):
        torch = self.torch
        F = torch.nn.functional
        if op == "fused_linear_dpo":
            if provider == "liger-kernel":
                from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss
                loss = LigerFusedLinearDPOLoss(beta=BETA, compiled=self.cuda, use_ref_model=True)

                def f(d):
                    out = loss(d["w"], d["x"], d["targets"], None, d["x"].detach(), d["w_ref"])
                    return out[0] if isinstance(out, tuple) else out
                return f

            def logps(x, w, y):
                logits = (x @ w.t()).float()
                return torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1).sum(-1)

            def f(d):
                b = d["x"].shape[0] // 2
                pol = logps(d["x"], d["w"], d["targets"])
                with torch.no_grad():
                    ref = logps(d["x"], d["w_ref"], d["targets"])
                margins = BETA * ((pol[:b] - ref[:b]) - (pol[b:] - ref[b:]))
                return -F.logsigmoid(margins).mean()
            return f
        if provider == "liger-kernel":
            from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
            loss = LigerFusedLinearJSDLoss(weight_hard_loss=0.5, weight_soft_loss=0.5, beta=JSD_BETA,
                                           compiled=self.cuda)

            def f(d):
                return loss(d["x"], d["w"], d["tx"], d["tw"], d["targets"])
            return f

        def f(d):
            s = (d["x"] @ d["w"].t()).float()
            with torch.no_grad():
                t = (d["tx"] @ d["tw"].t()).float()
            ls, lt = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
            hard = F.nll_loss(ls, d["targets"])
            log_m = torch.logsumexp(torch.stack([ls + math.log(1 - JSD_BETA), lt + math.log(JSD_BETA)]), 0)
            soft = (JSD_BETA * (lt.exp() * (lt - log_m)) + (1 - JSD_BETA) * (ls.exp() * (ls - log_m))).sum(-1).mean()
            return 0.5 * hard + 0.5 * soft
        return f

    def measure(self, op, shape, providers):
        torch = self.torch
        d = self.dpo_inputs(shape) if op == "fused_linear_dpo" else self.jsd_inputs(shape)
        leaves = [d["x"], d["w"]]
        x = "x".join(str(s) for s in shape)
        base = (f"dtype={self.args.dtype} iters={self.args.iters} repeats={self.args.repeats} "
                f"warmup={self.args.warmup}")
        rows_per_head = (2 * shape[0] * shape[1]) if op == "fused_linear_dpo" else shape[0]
        h, v = shape[-2], shape[-1]
        heads = 2
        flops = {"forward": 2.0 * rows_per_head * h * v * heads,
                 "full": 2.0 * rows_per_head * h * v * heads + 4.0 * rows_per_head * h * v}
        rows = []
        for provider in providers:
            times, mems = {}, {}
            for mode in ("forward", "full"):
                try:
                    fn = self.loss_fn(op, provider)
                    if mode == "forward":
                        def step(fn=fn):
                            with torch.no_grad():
                                return fn(d)
                    else:
                        for t in leaves:
                            t.requires_grad_(True)

                        def step(fn=fn):
                            out = fn(d)
                            return out, torch.autograd.grad(out, leaves)
                    times[mode] = self.time(step)
                    mems[mode] = self.memory(step)
                except Exception as exc:  # noqa: BLE001 - a failed measurement is a row
                    status = "oom" if "out of memory" in str(exc).lower() else "error"
                    traceback.print_exc()
                    rows.append(bench_csv.row(op, provider, mode, "ms", x, [float("nan")] * 3,
                                              f"status={status} {base} detail={' '.join(str(exc).split())[:200]}"))
                    if self.cuda:
                        torch.cuda.empty_cache()
                finally:
                    for t in leaves:
                        t.requires_grad_(False)
            if "forward" in times and "full" in times:
                times["backward"] = [a - b for a in times["full"] for b in times["forward"]]
            for mode in ("forward", "backward", "full"):
                if mode not in times:
                    continue
                t = bench_csv.p50_20_80(times[mode])
                cfg = f"status=ok {base}"
                rows.append(bench_csv.row(op, provider, mode, "ms", x, [s * 1e3 for s in t], cfg))
                if mode in flops:
                    rows.append(bench_csv.row(op, provider, mode, "TFLOP/s", x,
                                              bench_csv.rate(flops[mode] / 1e12, t),
                                              f"{cfg} flops={flops[mode]:.4e} (matrix products only)"))
                if mems.get(mode):
                    res, alloc = mems[mode]
                    rows.append(bench_csv.row(op, provider, mode, "MB", x, [res / MIB] * 3,
                                              f"{cfg} MB=MiB growth of torch.cuda.memory_reserved"))
                    rows.append(bench_csv.row(op, provider, mode, "MB_allocated", x, [alloc / MIB] * 3,
                                              f"{cfg} MB=MiB growth of torch.cuda.max_memory_allocated"))
        return rows


def main(argv=None):
    args = parse_args(argv)
    bench = Bench(args)
    providers = [p for p in args.providers.split(",") if p]
    rows = []
    for op in [o for o in args.ops.split(",") if o]:
        shape = dims(args.dpo_shape if op == "fused_linear_dpo" else args.jsd_shape)
        rows.extend(bench.measure(op, shape, providers))
    run = dict(gpu=args.gpu or (bench.torch.cuda.get_device_name(0) if bench.cuda else "cpu"),
               commit=args.commit or bench_csv.default_commit(), date=bench_csv.utc_date())
    if args.csv:
        bench_csv.append(args.csv, rows, run)
    for r in rows:
        print(bench_csv.line(r, run))


if __name__ == "__main__":
    main()
