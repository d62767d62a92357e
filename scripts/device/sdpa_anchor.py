#!/usr/bin/env python3
"""Times torch's scaled_dot_product_attention (causal, enable_gqa, bf16) on the shapes of
`liger bench --attention` with the backends asked for (--backends: flash, the issue's anchor;
cudnn; efficient; default, the one torch picks by itself, as transformers' sdpa attention
calls it) and prints rows in its CSV schema:
kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date

Each shape is BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM (q: [batch, q_heads, seq, head_dim], k and v
with kv_heads). Modes: forward, full (forward + backward with a gradient of ones, as
`y.backward()` in liger's bench) and backward (derived: every difference full - forward of the
samples, as liger's bench derives it). Each sample is the mean of --iters launches between two
torch.cuda.Event records (inputs rotate among sets so the L2 never holds them); p50/p20/p80
over --repeats samples. TFLOP/s use FlashAttention's count: forward 4*b*h*s^2*d, halved for
causal; backward 2.5x forward; full 3.5x. MB: peak allocated growth over one iteration.

Usage (GPU machine with torch):
    python3 scripts/device/sdpa_anchor.py > sdpa.csv
    python3 scripts/device/sdpa_anchor.py --shape 1x4096x32x8x64,1x16384x12x2x128 --header
    python3 scripts/device/sdpa_anchor.py --backends flash,cudnn,default

Providers: torch-sdpa (flash), torch-sdpa-cudnn, torch-sdpa-efficient, torch-sdpa-default; the
default rows' config names the backend torch chose (torch._fused_sdp_choice).
"""

import argparse
import datetime
import subprocess
import sys

import torch
import contextlib

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": ("torch-sdpa", SDPBackend.FLASH_ATTENTION),
    "cudnn": ("torch-sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
    "efficient": ("torch-sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
    "default": ("torch-sdpa-default", None),
}

HEADER = "kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date"


def default_shapes():
    shapes = []
    for hq, hk, d in [(32, 8, 64), (16, 2, 128), (12, 2, 128)]:
        for s in [1024, 2048, 4096, 8192, 16384, 32768]:
            shapes.append((1, s, hq, hk, d))
        for s in [1024, 4096]:
            shapes.append((4, s, hq, hk, d))
    return shapes


def parse_shape(text):
    parts = [int(p) for p in text.split("x")]
    if len(parts) != 5 or any(p <= 0 for p in parts) or parts[2] % parts[3]:
        raise argparse.ArgumentTypeError(f"{text}: expected BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM")
    return tuple(parts)


def quantile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def time_samples(step, iters, repeats, warmup):
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    samples = []
    index = 0
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step(index)
            index += 1
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return samples


def peak_growth(step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = step(0)
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_allocated() - before
    del out
    return growth / 2**20


def field(s):
    return f'"{s}"' if "," in s else s


def number(x):
    return f"{x:.6f}".rstrip("0").rstrip(".")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=lambda s: [parse_shape(p) for p in s.split(",")], default=None)
    ap.add_argument("--iters", type=int, default=50, help="most launches per sample (fewer when a sample would exceed ~0.2 s)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--gpu", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--header", action="store_true", help="print the CSV header first")
    ap.add_argument("--backends", default="flash",
                    help="comma-separated: flash, cudnn, efficient, default (torch's own choice)")
    args = ap.parse_args()

    dev = torch.device("cuda")
    gpu = args.gpu or torch.cuda.get_device_name(dev)
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
        except Exception:
            commit = "unknown"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    if args.header:
        print(HEADER)
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    for name in backends:
        if name not in BACKENDS:
            ap.error(f"--backends: unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    for (b, s, hq, hk, d), name in [(shape, n) for shape in (args.shape or default_shapes()) for n in backends]:
        provider, backend = BACKENDS[name]
        x = f"{b}x{s}x{hq}x{hk}x{d}"
        dtype = torch.bfloat16
        nbytes = b * (hq + 2 * hk) * s * d * 2
        sets = max(2, min(8, -(-(256 << 20) // nbytes)))
        inputs = [
            [torch.randn(b, h, s, d, device=dev, dtype=dtype) for h in (hq, hk, hk)]
            for _ in range(sets)
        ]
        grad = torch.ones(b, hq, s, d, device=dev, dtype=dtype)

        def chosen():
            return sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()

        def forward(i):
            q, k, v = inputs[i % sets]
            with chosen():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def full(i):
            q, k, v = (t.detach().requires_grad_() for t in inputs[i % sets])
            with chosen():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.backward(grad)
            return out, q.grad, k.grad, v.grad

        label = name
        if backend is None:
            q, k, v = (t.detach().requires_grad_() for t in inputs[0])
            try:
                choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True))
                names = {int(m.value): n.lower() for n, m in SDPBackend.__members__.items()}
                label = f"default({names.get(choice, choice)})"
            except (AttributeError, RuntimeError, TypeError) as err:
                label = f"default(unknown: {err})".replace(",", ";")
        try:
            forward(0)
        except RuntimeError as err:
            print(f"# {x} {name}: {str(err).splitlines()[0]}", file=sys.stderr)
            continue
        results = {}
        for mode, step in (("forward", forward), ("full", full)):
            for i in range(args.warmup):
                step(i)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(0)
            end.record()
            end.synchronize()
            one = start.elapsed_time(end) / 1e3
            iters = max(1, min(args.iters, int(0.2 / max(one, 1e-6))))
            samples = time_samples(step, iters, args.repeats, 0)
            results[mode] = (samples, iters, peak_growth(step))
        fwd, full_s = results["forward"][0], results["full"][0]
        results["backward"] = ([a - f for a in full_s for f in fwd], results["full"][1], None)

        flops_fwd = 4 * b * hq * s * s * d / 2
        for mode in ("forward", "backward", "full"):
            samples, iters, mem = results[mode]
            t = [quantile(samples, q) for q in (0.5, 0.2, 0.8)]
            flops = flops_fwd * {"forward": 1.0, "backward": 2.5, "full": 3.5}[mode]
            config = (
                f"dtype=bf16 causal=1 enable_gqa=1 backend={label} torch={torch.__version__} "
                f"iters={iters} repeats={args.repeats} warmup={args.warmup} timer=cuda.Event "
                f"grad={'none' if mode == 'forward' else 'ones'}"
            )
            rows = [
                ("ms", [v * 1e3 for v in t], config),
                ("TFLOP/s", [flops / 1e12 / t[0], flops / 1e12 / t[2], flops / 1e12 / t[1]],
                 f"{config} flops={flops:.4e} (FlashAttention count: causal halved; backward 2.5x forward)"),
            ]
            if mem is not None:
                rows.append(("MB", [mem] * 3, f"{config} MB=MiB peak allocated growth over one iteration"))
            for metric, v, cfg in rows:
                print(",".join([
                    "attention", provider, mode, metric, x,
                    number(v[0]), number(v[1]), number(v[2]),
                    field(cfg), field(gpu), commit, date,
                ]))
        sys.stdout.flush()
        del inputs, grad
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
