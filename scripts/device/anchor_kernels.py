#!/usr/bin/env python3
"""The PyTorch kernel anchors of `liger bench`: the ops it benchmarks, run by PyTorch
eager as transformers writes them (provider `torch`) and by Liger-Kernel (provider
`liger-kernel`), on its default shapes, plus the device's ceilings measured in the same
call (a 4 GiB device-to-device copy, an 8192^3 bf16 matrix product) and cuBLAS
(torch.matmul) on the GEMM shapes of Llama-3.2-1B and Qwen2.5-1.5B at 4096 tokens, as rows
of the project's bench CSV (examples/src/csv.rs).

Ops (names, shapes and input distributions as examples/src/bench/ops.rs):
  rms_norm 8192x4096        torch: LlamaRMSNorm's code (f32 variance, eps 1e-6);
                            liger: liger_rms_norm (llama casting, in place backward)
  layer_norm 8192x4096      torch: F.layer_norm (weight, bias, eps 1e-5); liger: liger_layer_norm
  swiglu 8192x14336         torch: silu(gate) * up; liger: liger_swiglu
  rope 4x2048x32x8x128      (batch x seq x q heads x kv heads x head dim) torch:
                            transformers' apply_rotary_pos_emb (rotate_half); liger: liger_rope.
                            q, k stored [batch, seq, heads, dim] and viewed [batch, heads,
                            seq, dim], as transformers' attention makes them
  cross_entropy 8192x128256 torch: F.cross_entropy (mean); liger: liger_cross_entropy
  fused_linear_cross_entropy 8192x4096x128256  (rows x hidden x vocabulary) torch: x @ W^T,
                            logits upcast to f32, F.cross_entropy (transformers' loss);
                            liger: liger_fused_linear_cross_entropy

Modes and metrics (as `liger bench`):
  forward   inputs without gradient, under torch.no_grad
  full      forward + backward: torch.autograd.grad of the output with respect to every
            float input (x, weight, bias; q, k; logits; x, W) with a gradient of ones (the
            scalar losses: 1)
  backward  derived: the quantiles of every difference full_i - forward_j of the samples
  ms        CUDA-event time per iteration; a sample is the mean of --iters iterations, and
            p50/p20/p80 are over --repeats samples, after --warmup iterations. Inputs rotate
            over several sets (at least 2, up to 16, at least 256 MiB in all) so that no two
            consecutive iterations share an input held in L2
  GB/s      the op's minimal bytes (the same formulas as `liger bench`, in the config) over
            the time; TFLOP/s for the products (fused linear cross entropy: 2NHV forward,
            6NHV full)
  MB        growth of torch.cuda.memory_reserved over one iteration after empty_cache, with
            its outputs and gradients alive (MiB; the meaning of `liger bench`'s MB, pool
            bytes reserved); MB_allocated: the growth of max_memory_allocated over the same
            iteration (Liger-Kernel's own benchmarks report this one)
Ceilings: kernel copy (dst.copy_(src) of --copy-gib GiB; GB/s counts the read and the
write), kernel matmul at 8192x8192x8192 (random bf16; TFLOP/s = 2mkn / t). GEMMs: kernel
matmul, x = MxKxN, config names the model's product and its layout (linear: x @ W^T as
nn.Linear; wgrad: dY^T @ X, the weight gradient).

A measurement that runs out of memory or fails gives one ms row with empty numbers and
status=oom|error in the config; the run goes on.

Example (device machine; about 2 to 3 minutes on an H100):
    python3 scripts/device/anchor_kernels.py --csv $OUT/anchor_kernels.csv
"""
import argparse
import math
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_csv  # noqa: E402

OPS = ("rms_norm", "layer_norm", "swiglu", "rope", "cross_entropy",
       "fused_linear_cross_entropy")
DEFAULT_SHAPES = {
    "rms_norm": (8192, 4096),
    "layer_norm": (8192, 4096),
    "swiglu": (8192, 14336),
    "rope": (4, 2048, 32, 8, 128),
    "cross_entropy": (8192, 128256),
    "fused_linear_cross_entropy": (8192, 4096, 128256),
}
PROVIDERS = ("torch", "liger-kernel")
RMS_EPS = 1e-6
LN_EPS = 1e-5
STAT_BYTES = 4
ROTATION_BYTES = 256 << 20
MAX_SETS = 16
MIB = float(1 << 20)

# (model, product, m, k, n, layout) at 4096 tokens. linear: x [m,k] @ W[n,k]^T;
# wgrad: dY[k,m]^T @ X[k,n] (the lm_head weight gradient, [vocab, tokens] x [tokens, hidden]).
GEMMS = [
    ("llama3.2-1b", "q_proj/o_proj", 4096, 2048, 2048, "linear"),
    ("llama3.2-1b", "k_proj/v_proj", 4096, 2048, 512, "linear"),
    ("llama3.2-1b", "gate_proj/up_proj", 4096, 2048, 8192, "linear"),
    ("llama3.2-1b", "down_proj", 4096, 8192, 2048, "linear"),
    ("llama3.2-1b", "lm_head", 4096, 2048, 128256, "linear"),
    ("llama3.2-1b", "lm_head_wgrad", 128256, 4096, 2048, "wgrad"),
    ("qwen2.5-1.5b", "q_proj/o_proj", 4096, 1536, 1536, "linear"),
    ("qwen2.5-1.5b", "k_proj/v_proj", 4096, 1536, 256, "linear"),
    ("qwen2.5-1.5b", "gate_proj/up_proj", 4096, 1536, 8960, "linear"),
    ("qwen2.5-1.5b", "down_proj", 4096, 8960, 1536, "linear"),
    ("qwen2.5-1.5b", "lm_head", 4096, 1536, 151936, "linear"),
    ("qwen2.5-1.5b", "lm_head_wgrad", 151936, 4096, 1536, "wgrad"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Ops ("):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", metavar="PATH",
                   help="append the rows to this CSV (bench layout; header written when new)")
    p.add_argument("--ops", default=",".join(OPS), metavar="OP,...",
                   help=f"ops, comma list (default all: {', '.join(OPS)}); `none` for the "
                        "ceilings and GEMMs alone")
    p.add_argument("--providers", default=",".join(PROVIDERS), metavar="P,...",
                   help="torch and/or liger-kernel (default both)")
    p.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16",
                   help="dtype of inputs, weights and outputs (default bf16)")
    p.add_argument("--warmup", type=int, default=10, metavar="N",
                   help="untimed iterations first (default 10, as `liger bench`)")
    p.add_argument("--iters", type=int, default=50, metavar="N",
                   help="iterations per timed sample (default 50, as `liger bench`)")
    p.add_argument("--repeats", type=int, default=10, metavar="N",
                   help="timed samples; p50/p20/p80 over them (default 10, as `liger bench`)")
    p.add_argument("--hold-gib", type=float, default=0.0, metavar="GIB",
                   help="keep the iterations' outputs (and gradients) alive within a sample up to "
                        "this many GiB, as `liger bench --hold-gib` does, so each iteration writes "
                        "memory of its own instead of the block the caching allocator hands back "
                        "(default 0: released at once)")
    p.add_argument("--copy-gib", type=float, default=4.0, metavar="GIB",
                   help="size of the copy ceiling's tensor (default 4 GiB); 0 skips it")
    p.add_argument("--matmul-size", type=int, default=8192, metavar="N",
                   help="the square bf16 product of the matmul ceiling, N^3 (default 8192); "
                        "0 skips it")
    p.add_argument("--no-gemms", action="store_true",
                   help="skip cuBLAS on the models' GEMM shapes")
    p.add_argument("--shapes", default="", metavar="OP=AxB,...",
                   help="shapes in place of an op's default, comma list; an op may appear "
                        "several times (e.g. rms_norm=16384x1536,rms_norm=16384x2048)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--gpu", default=os.environ.get("LIGER_GPU_NAME"),
                   help="gpu column (default $LIGER_GPU_NAME, else the device's name)")
    p.add_argument("--commit", default=None,
                   help="commit column (default $LIGER_COMMIT, else .gpu/commit, else git HEAD)")
    a = p.parse_args(argv)
    a.ops = [] if a.ops == "none" else [o for o in a.ops.split(",") if o]
    a.providers = [v for v in a.providers.split(",") if v]
    spec, a.shapes = a.shapes, {}
    for item in [i for i in spec.split(",") if i]:
        op, _, dims = item.partition("=")
        if op not in OPS or not dims:
            p.error(f"--shapes: expected OP=AxB with a known op, got {item!r}")
        try:
            a.shapes.setdefault(op, []).append(tuple(int(d) for d in dims.split("x")))
        except ValueError:
            p.error(f"--shapes: {item!r}: dimensions must be integers joined by x")
        if len(a.shapes[op][-1]) != len(DEFAULT_SHAPES[op]):
            p.error(f"--shapes: {item!r}: {op} takes {len(DEFAULT_SHAPES[op])} dimensions")
    for o in a.ops:
        if o not in OPS:
            p.error(f"--ops: unknown op {o!r} (known: {', '.join(OPS)})")
    for v in a.providers:
        if v not in PROVIDERS:
            p.error(f"--providers: unknown provider {v!r} (known: {', '.join(PROVIDERS)})")
    if min(a.iters, a.repeats) < 1 or a.warmup < 0:
        p.error("--iters and --repeats must be at least 1, --warmup at least 0")
    return a


def label(shape):
    return "x".join(str(d) for d in shape)


def rows_width(op, shape):
    if op in ("cross_entropy", "fused_linear_cross_entropy"):
        return shape[0], shape[-1]
    return math.prod(shape[:-1]), shape[-1]


def input_bytes(op, shape, e):
    """Bytes of one input set (sizes the rotation)."""
    if op == "rope":
        b, s, hq, hk, d = shape
        return (b * (hq + hk) * s * d + 2 * s * d) * e
    if op == "swiglu":
        return 2 * shape[0] * shape[1] * e
    if op == "fused_linear_cross_entropy":
        n, h, v = shape
        return (n + v) * h * e
    rows, width = rows_width(op, shape)
    return rows * width * e


def op_bytes(op, mode, shape, e):
    """(bytes, formula) as examples/src/bench/ops.rs `bytes`; None where not memory-bound."""
    rows, width = rows_width(op, shape)
    n, s, w = rows * width, rows * STAT_BYTES, width * e
    if op == "rms_norm":
        fwd, bwd = (2 * n * e + w + s, "x+w+y+rstd"), (3 * n * e + 2 * w + s, "dy+x+w+rstd+dx+dw")
    elif op == "layer_norm":
        fwd = (2 * n * e + 2 * w + 2 * s, "x+w+b+y+mean+rstd")
        bwd = (3 * n * e + 3 * w + 2 * s, "dy+x+w+mean+rstd+dx+dw+db")
    elif op == "swiglu":
        fwd, bwd = (3 * n * e, "gate+up+y"), (5 * n * e, "dy+gate+up+dgate+dup")
    elif op == "rope":
        b, sq, hq, hk, d = shape
        qk = b * (hq + hk) * sq * d * e
        tables = 2 * sq * d * e
        fwd = (2 * qk + tables, "q+k+cos+sin+q'+k'")
        bwd = (2 * qk + tables, "dq'+dk'+cos+sin+dq+dk")
    elif op == "cross_entropy":
        if mode == "forward":
            return n * e + rows * 4, "logits+targets"
        if mode == "full":
            return (2 * n * e + rows * 4,
                    "logits+targets+dlogits (gradient written by the forward)")
        return None
    else:
        return None
    if mode == "forward":
        return fwd
    if mode == "backward":
        return bwd
    return fwd[0] + bwd[0], f"fwd({fwd[1]})+bwd({bwd[1]})"


def tensor_bytes(value):
    """Bytes of the tensors in a (nested) tuple or list of outputs."""
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return value.numel() * value.element_size() if hasattr(value, "numel") else 0


def op_flops(op, mode, shape):
    if op != "fused_linear_cross_entropy" or mode == "backward":
        return None
    nhv = float(math.prod(shape))
    return 2 * nhv if mode == "forward" else 6 * nhv


class Bench:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
        self.e = torch.tensor([], dtype=self.dtype).element_size()
        torch.manual_seed(args.seed)

    def sync(self):
        self.torch.cuda.synchronize(self.device)

    def time(self, fn, sets, warmup=None, iters=None, repeats=None):
        """Seconds per iteration, one sample per --iters iterations (CUDA events)."""
        torch = self.torch
        a = self.args
        warmup = a.warmup if warmup is None else warmup
        iters = a.iters if iters is None else iters
        repeats = a.repeats if repeats is None else repeats
        k = 0
        for _ in range(warmup):
            fn(k % sets)
            k += 1
        self.sync()
        samples = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            held, held_bytes = [], 0
            start.record()
            for _ in range(iters):
                out = fn(k % sets)
                if a.hold_gib > 0:
                    held.append(out)
                    held_bytes += tensor_bytes(out)
                    if held_bytes > a.hold_gib * 2**30:
                        held, held_bytes = [], 0
                k += 1
            end.record()
            end.synchronize()
            held.clear()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        return samples

    def memory(self, fn):
        """(reserved growth, peak allocated growth) in bytes over one iteration after
        empty_cache, its outputs kept until the end."""
        torch = self.torch
        self.sync()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        res0 = torch.cuda.memory_reserved(self.device)
        alloc0 = torch.cuda.memory_allocated(self.device)
        held = fn(0)
        self.sync()
        grown = (torch.cuda.max_memory_reserved(self.device) - res0,
                 torch.cuda.max_memory_allocated(self.device) - alloc0)
        del held
        return grown

    # -- inputs --------------------------------------------------------------------------

    def uniform(self, shape, lo, hi, dtype=None):
        t = self.torch.empty(shape, device=self.device, dtype=dtype or self.dtype)
        return t.uniform_(lo, hi)

    def inputs(self, op, shape):
        """One input set: a dict of tensors (float ones without gradient)."""
        torch = self.torch
        if op == "rope":
            b, s, hq, hk, d = shape
            # Stored [b, s, h, d], viewed [b, h, s, d], as transformers' q/k projections are.
            q = self.uniform((b, s, hq, d), -2.0, 2.0).transpose(1, 2)
            k = self.uniform((b, s, hk, d), -2.0, 2.0).transpose(1, 2)
            # Rotation tables of random angles: |cos|, |sin| <= 1 as real ones (Liger's RoPE
            # rotates q and k in place, so repeated iterations must not grow them).
            theta = self.uniform((1, s, d), -math.pi, math.pi, torch.float32)
            return dict(q=q, k=k, cos=theta.cos().to(self.dtype), sin=theta.sin().to(self.dtype))
        if op in ("cross_entropy", "fused_linear_cross_entropy"):
            n, v = shape[0], shape[-1]
            targets = torch.randint(0, v, (n,), device=self.device)
            if op == "cross_entropy":
                return dict(x=self.uniform((n, v), -4.0, 4.0), targets=targets)
            h = shape[1]
            scale = 1.0 / math.sqrt(h)
            return dict(x=self.uniform((n, h), -1.0, 1.0),
                        w=self.uniform((v, h), -2.0 * scale, 2.0 * scale), targets=targets)
        rows, width = rows_width(op, shape)
        d = dict(x=self.uniform((rows, width), -2.0, 2.0))
        if op == "swiglu":
            d["up"] = self.uniform((rows, width), -2.0, 2.0)
        if op in ("rms_norm", "layer_norm"):
            d["w"] = self.uniform((width,), -0.5, 1.5)
        if op == "layer_norm":
            d["b"] = self.uniform((width,), -1.0, 1.0)
        return d

    # -- the ops -------------------------------------------------------------------------

    def forward_fn(self, op, provider):
        """f(inputs) -> outputs (a tuple), for provider."""
        torch = self.torch
        F = torch.nn.functional
        if provider == "liger-kernel":
            from liger_kernel.transformers import functional as L
        if op == "rms_norm":
            if provider == "torch":
                def f(d):
                    # transformers' LlamaRMSNorm.forward
                    x = d["x"]
                    h = x.to(torch.float32)
                    var = h.pow(2).mean(-1, keepdim=True)
                    h = h * torch.rsqrt(var + RMS_EPS)
                    return (d["w"] * h.to(x.dtype),)
                return f
            return lambda d: (L.liger_rms_norm(d["x"], d["w"], RMS_EPS),)
        if op == "layer_norm":
            if provider == "torch":
                return lambda d: (F.layer_norm(d["x"], (d["x"].shape[-1],), d["w"], d["b"],
                                               LN_EPS),)
            return lambda d: (L.liger_layer_norm(d["x"], d["w"], d["b"], LN_EPS),)
        if op == "swiglu":
            if provider == "torch":
                return lambda d: (F.silu(d["x"]) * d["up"],)
            return lambda d: (L.liger_swiglu(d["x"], d["up"]),)
        if op == "rope":
            if provider == "torch":
                def rotate_half(x):
                    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
                    return torch.cat((-x2, x1), dim=-1)

                def f(d):
                    # transformers' apply_rotary_pos_emb (unsqueeze_dim=1)
                    cos, sin = d["cos"].unsqueeze(1), d["sin"].unsqueeze(1)
                    q, k = d["q"], d["k"]
                    return (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)
                return f
            return lambda d: tuple(L.liger_rope(d["q"], d["k"], d["cos"], d["sin"]))
        if op == "cross_entropy":
            if provider == "torch":
                return lambda d: (F.cross_entropy(d["x"], d["targets"]),)
            return lambda d: (L.liger_cross_entropy(d["x"], d["targets"]),)
        if op == "fused_linear_cross_entropy":
            if provider == "torch":
                return lambda d: (F.cross_entropy((d["x"] @ d["w"].t()).float(), d["targets"]),)
            return lambda d: (L.liger_fused_linear_cross_entropy(d["x"], d["w"], d["targets"]),)
        raise ValueError(op)

    def leaves(self, op, d):
        """The set's float inputs as leaves that require grad (sharing storage)."""
        g = {}
        for key, t in d.items():
            if t.is_floating_point() and key not in ("cos", "sin"):
                if op == "rope":
                    # Keep the [b, s, h, d] storage seen through a [b, h, s, d] view.
                    g[key] = t.transpose(1, 2).detach().requires_grad_(True).transpose(1, 2)
                else:
                    g[key] = t.detach().requires_grad_(True)
            else:
                g[key] = t
        return g

    def measure_op(self, op, shape, providers):
        """Rows of one op and shape: both providers, forward and full."""
        torch = self.torch
        e = self.e
        sets = min(max(-(-ROTATION_BYTES // max(input_bytes(op, shape, e), 1)), 2), MAX_SETS)
        data = [self.inputs(op, shape) for _ in range(sets)]
        grad_sets = [self.leaves(op, d) for d in data]
        base = (f"dtype={self.args.dtype} iters={self.args.iters} repeats={self.args.repeats} "
                f"warmup={self.args.warmup} sets={sets}"
                + (f" hold_gib={self.args.hold_gib:g}" if self.args.hold_gib > 0 else ""))
        rows = []
        x = label(shape)
        for provider in providers:
            times, mems = {}, {}
            for mode in ("forward", "full"):
                try:
                    fwd = self.forward_fn(op, provider)
                    if mode == "forward":
                        def step(i, fwd=fwd):
                            with torch.no_grad():
                                return fwd(data[i])
                    else:
                        # The gradients of ones, made once per set (Liger's RMSNorm backward
                        # overwrites its dy in place: harmless for the timing).
                        dys = []
                        for gs in grad_sets:
                            outs = fwd(gs)
                            dys.append([torch.ones_like(o) if o.dim() else None for o in outs])
                            del outs

                        def step(i, fwd=fwd, dys=dys):
                            gs = grad_sets[i]
                            outs = fwd(gs)
                            inputs = [t for k, t in gs.items()
                                      if t.is_floating_point() and t.requires_grad]
                            grads = torch.autograd.grad(
                                [o for o in outs], inputs,
                                grad_outputs=[dy for dy in dys[i]] if outs[0].dim() else None)
                            return outs, grads
                    times[mode] = self.time(step, sets)
                    mems[mode] = self.memory(step)
                except Exception as exc:  # noqa: BLE001 - a failed measurement is a row
                    status = "oom" if "out of memory" in str(exc).lower() else "error"
                    detail = " ".join(str(exc).split())[:200]
                    traceback.print_exc()
                    rows.append(bench_csv.row(op, provider, mode, "ms", x, [float("nan")] * 3,
                                              f"status={status} {base} detail={detail}"))
                    torch.cuda.empty_cache()
            # backward: every difference full_i - forward_j
            if "forward" in times and "full" in times:
                diffs = [a - b for a in times["full"] for b in times["forward"]]
                times["backward"] = diffs
            for mode in ("forward", "backward", "full"):
                if mode not in times:
                    continue
                t = bench_csv.p50_20_80(times[mode])
                cfg = f"status=ok {base}"
                if mode == "forward":
                    cfg += " grad=none"
                elif mode == "backward":
                    cfg += " derived=full-forward grad=ones"
                else:
                    cfg += " grad=ones"
                rows.append(bench_csv.row(op, provider, mode, "ms", x, [v * 1e3 for v in t], cfg))
                b = op_bytes(op, mode, shape, e)
                if b:
                    rows.append(bench_csv.row(op, provider, mode, "GB/s", x,
                                              bench_csv.rate(b[0] / 1e9, t),
                                              f"{cfg} bytes={b[0]} ({b[1]}; stats f32)"))
                fl = op_flops(op, mode, shape)
                if fl:
                    rows.append(bench_csv.row(op, provider, mode, "TFLOP/s", x,
                                              bench_csv.rate(fl / 1e12, t),
                                              f"{cfg} flops={fl:.4e} (matrix products only)"))
                if mode in mems:
                    res, alloc = mems[mode]
                    rows.append(bench_csv.row(
                        op, provider, mode, "MB", x, [res / MIB] * 3,
                        f"{cfg} MB=MiB growth of torch.cuda.memory_reserved over one iteration "
                        f"after empty_cache"))
                    rows.append(bench_csv.row(
                        op, provider, mode, "MB_allocated", x, [alloc / MIB] * 3,
                        f"{cfg} MB=MiB growth of torch.cuda.max_memory_allocated over one "
                        f"iteration"))
        data.clear()  # the closures above hold the lists: empty them to free the inputs
        grad_sets.clear()
        self.sync()
        torch.cuda.empty_cache()
        return rows

    def copy_rows(self, gib):
        torch = self.torch
        n = int(gib * (1 << 30)) // self.e
        src = self.uniform((n,), -1.0, 1.0)
        dst = torch.empty_like(src)
        t = bench_csv.p50_20_80(self.time(lambda i: dst.copy_(src), 1, warmup=3,
                                          iters=min(self.args.iters, 20)))
        x = f"{n * self.e / MIB:.0f}MiB"
        cfg = (f"status=ok dtype={self.args.dtype} op=dst.copy_(src) bytes=read+write "
               f"iters={min(self.args.iters, 20)} repeats={self.args.repeats}")
        moved = 2 * n * self.e
        src = dst = None  # frees the 2 x --copy-gib before the next measurement
        torch.cuda.empty_cache()
        return [bench_csv.row("copy", "torch", "forward", "ms", x, [v * 1e3 for v in t], cfg),
                bench_csv.row("copy", "torch", "forward", "GB/s", x,
                              bench_csv.rate(moved / 1e9, t), f"{cfg} bytes={moved}")]

    def matmul_rows(self, m, k, n, layout, cfg_extra):
        torch = self.torch
        if layout == "linear":
            a = torch.randn(m, k, device=self.device, dtype=self.dtype)
            w = torch.randn(n, k, device=self.device, dtype=self.dtype)
            fn = lambda i: torch.nn.functional.linear(a, w)  # noqa: E731
            what = "x[m,k] @ W[n,k]^T (nn.Linear)"
        elif layout == "wgrad":
            g = torch.randn(k, m, device=self.device, dtype=self.dtype)
            xx = torch.randn(k, n, device=self.device, dtype=self.dtype)
            fn = lambda i: torch.matmul(g.t(), xx)  # noqa: E731
            what = "dY[k,m]^T @ X[k,n] (weight gradient)"
        else:
            a = torch.randn(m, k, device=self.device, dtype=self.dtype)
            b = torch.randn(k, n, device=self.device, dtype=self.dtype)
            fn = lambda i: torch.matmul(a, b)  # noqa: E731
            what = "A[m,k] @ B[k,n]"
        t = bench_csv.p50_20_80(self.time(fn, 1, warmup=5, iters=min(self.args.iters, 20)))
        x = f"{m}x{k}x{n}"
        cfg = (f"status=ok dtype={self.args.dtype} {cfg_extra} layout={layout}: {what} "
               f"backend=cuBLAS(torch.matmul) random inputs")
        flops = 2.0 * m * k * n
        torch.cuda.empty_cache()
        return [bench_csv.row("matmul", "torch", "forward", "ms", x, [v * 1e3 for v in t], cfg),
                bench_csv.row("matmul", "torch", "forward", "TFLOP/s", x,
                              bench_csv.rate(flops / 1e12, t), f"{cfg} flops={flops:.4e}")]


def render(rows):
    keep = [r for r in rows if r["metric"] in ("ms", "GB/s", "TFLOP/s", "MB")]
    head = ["kernel", "x", "provider", "mode", "metric", "p50", "p20", "p80"]
    lines = [[r["kernel"], r["x"], r["provider"], r["mode"], r["metric"],
              bench_csv.number(r["p50"]) or "-", bench_csv.number(r["p20"]) or "-",
              bench_csv.number(r["p80"]) or "-"] for r in keep]
    widths = [max([len(h)] + [len(ln[i]) for ln in lines]) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(ln, widths)) for ln in lines]
    return "\n".join(out)


def main():
    args = parse_args()
    bench = Bench(args)
    torch = bench.torch
    run = {"gpu": args.gpu or torch.cuda.get_device_name(bench.device),
           "commit": args.commit or bench_csv.default_commit(), "date": bench_csv.utc_date()}
    print(f"anchor kernels: {run['gpu']}, {args.dtype}, {bench_csv.versions()}", flush=True)
    all_rows = []

    def emit(rows):
        all_rows.extend(rows)
        if args.csv:
            bench_csv.append(args.csv, rows, run)

    failures = 0

    def guarded(what, fn):
        nonlocal failures
        try:
            emit(fn())
        except Exception as exc:  # noqa: BLE001
            failures += 1
            traceback.print_exc()
            print(f"{what}: FAILED ({' '.join(str(exc).split())[:200]})", flush=True)
            torch.cuda.empty_cache()

    if args.copy_gib > 0:
        guarded("copy", lambda: bench.copy_rows(args.copy_gib))
    if args.matmul_size > 0:
        s = args.matmul_size
        guarded("matmul ceiling", lambda: bench.matmul_rows(s, s, s, "nn", "ceiling=square"))
    for op in args.ops:
        for shape in args.shapes.get(op, [DEFAULT_SHAPES[op]]):
            print(f"{op} {label(shape)} ...", flush=True)
            guarded(op, lambda op=op, shape=shape: bench.measure_op(op, shape, args.providers))
    if not args.no_gemms:
        for model, product, m, k, n, layout in GEMMS:
            guarded(f"gemm {model} {product}",
                    lambda: bench.matmul_rows(m, k, n, layout,
                                              f"model={model} product={product} tokens=4096"))
    print(render(all_rows))
    failed_rows = sum(1 for r in all_rows if "status=ok" not in r["config"])
    if args.csv:
        print(f"csv: {len(all_rows)} rows appended to {args.csv}")
    return 1 if failures or failed_rows else 0


if __name__ == "__main__":
    sys.exit(main())
