#!/usr/bin/env python3
"""Every algorithm cuBLASLt's heuristic offers for the models' bf16 products, timed.

    python3 scripts/device/cublaslt_algos.py [--requested 16] [--csv FILE]

liger-burn's cuBLASLt plans take the heuristic's first algorithm (with the same
preferences as here: f32 compute, a 32 MiB workspace, split-K reduced in f32). This asks
for up to --requested algorithms per product and layout and times each on torch's stream
(CUDA events; a sample is the mean of 20 launches, the median of 7 samples after 5 warm-up
launches), beside torch.matmul, to show whether a timed choice beats the heuristic's first.
Products are row-major as liger-burn runs them: forward `x[m,k]·W[k,n]`, the input's
gradient `dy[m,n]·Wᵀ`, the weight's gradient `xᵀ·dy`.
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import median_ms  # noqa: E402

COMPUTE_32F = 68
R_32F, R_16BF = 0, 14
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE, PREF_REDUCTION_MASK = 1, 3
REDUCTION_NONE, REDUCTION_COMPUTE_TYPE = 0, 2
CONFIG_ID, CONFIG_TILE_ID, CONFIG_SPLITK, CONFIG_STAGES = 0, 1, 2, 6
WORKSPACE = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspace", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load():
    for name in ("libcublasLt.so.13", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise SystemExit("libcublasLt not found")


LT = load()
VP = ctypes.c_void_p


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cuBLAS status {status}")


def layout(rows, cols, ld):
    out = VP()
    ok(LT.cublasLtMatrixLayoutCreate(ctypes.byref(out), R_16BF, ctypes.c_uint64(rows),
                                     ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
    return out


def config(algo, attr):
    value = ctypes.c_uint64(0)
    written = ctypes.c_size_t(0)
    LT.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                            ctypes.c_size_t(8), ctypes.byref(written))
    return value.value & ((1 << (8 * written.value)) - 1) if written.value else -1


def product(handle, m, k, n, trans_a, trans_b, requested, workspace):
    """Row-major `op(A)[m,k]·op(B)[k,n]` as cuBLASLt's column-major `Dᵀ = op(B)ᵀ·op(A)ᵀ`."""
    a = torch.randn(*((k, m) if trans_a else (m, k)), device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*((n, k) if trans_b else (k, n)), device="cuda", dtype=torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    desc = VP()
    ok(LT.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
    for attr, t in ((DESC_TRANSA, trans_b), (DESC_TRANSB, trans_a)):
        op = ctypes.c_int32(1 if t else 0)
        ok(LT.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(op), ctypes.c_size_t(4)), "trans")
    # cuBLASLt's first operand is row-major B, its second row-major A.
    lx = layout(k, n, k) if trans_b else layout(n, k, n)
    ly = layout(m, k, m) if trans_a else layout(k, m, k)
    ld = layout(n, m, n)
    pref = VP()
    ok(LT.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    ws = ctypes.c_uint64(WORKSPACE)
    ok(LT.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(ws), ctypes.c_size_t(8)), "ws")
    mask = ctypes.c_uint32(REDUCTION_COMPUTE_TYPE | REDUCTION_NONE)
    ok(LT.cublasLtMatmulPreferenceSetAttribute(pref, PREF_REDUCTION_MASK, ctypes.byref(mask), ctypes.c_size_t(4)), "mask")
    results = (Heuristic * requested)()
    count = ctypes.c_int(0)
    ok(LT.cublasLtMatmulAlgoGetHeuristic(handle, desc, lx, ly, ld, ld, pref, requested, results,
                                         ctypes.byref(count)), "heuristic")
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    stream = VP(torch.cuda.current_stream().cuda_stream)

    def launch(algo):
        return LT.cublasLtMatmul(handle, desc, ctypes.byref(alpha), VP(b.data_ptr()), lx,
                                 VP(a.data_ptr()), ly, ctypes.byref(beta), VP(d.data_ptr()), ld,
                                 VP(d.data_ptr()), ld, ctypes.byref(algo), VP(workspace.data_ptr()),
                                 ctypes.c_size_t(WORKSPACE), stream)

    flops = 2.0 * m * k * n
    rows = []
    reference = (a.t() if trans_a else a) @ (b.t() if trans_b else b)
    for i in range(count.value):
        algo = results[i].algo
        if launch(algo) != 0:
            continue
        torch.cuda.synchronize()
        err = ((d.float() - reference.float()).norm() / reference.float().norm()).item()
        seconds = median_ms(lambda: launch(algo)) * 1e-3
        rows.append((i, flops / seconds / 1e12, seconds * 1e6, err, config(algo, CONFIG_ID),
                     config(algo, CONFIG_TILE_ID), config(algo, CONFIG_SPLITK), config(algo, CONFIG_STAGES),
                     results[i].waves))
    at, bt = (a.t() if trans_a else a), (b.t() if trans_b else b)
    torch_s = median_ms(lambda: torch.matmul(at, bt)) * 1e-3
    for x in (lx, ly, ld):
        LT.cublasLtMatrixLayoutDestroy(x)
    LT.cublasLtMatmulPreferenceDestroy(pref)
    LT.cublasLtMatmulDescDestroy(desc)
    return rows, flops / torch_s / 1e12


PRODUCTS = [
    ("llama q/o", 4096, 2048, 2048),
    ("llama k/v", 4096, 2048, 512),
    ("qwen q/o", 4096, 1536, 1536),
    ("qwen k/v", 4096, 1536, 256),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requested", type=int, default=16, help="algorithms asked of the heuristic")
    ap.add_argument("--csv", help="append one row per product, layout and algorithm")
    args = ap.parse_args()
    handle = VP()
    ok(LT.cublasLtCreate(ctypes.byref(handle)), "create")
    workspace = torch.empty(WORKSPACE, device="cuda", dtype=torch.uint8)
    lines = []
    for name, m, k, n in PRODUCTS:
        for what, (pm, pk, pn, ta, tb) in (
            ("forward", (m, k, n, False, False)),
            ("grad_input", (m, n, k, False, True)),
            ("grad_weight", (k, m, n, True, False)),
        ):
            rows, torch_tflops = product(handle, pm, pk, pn, ta, tb, args.requested, workspace)
            if not rows:
                print(f"{name} {what}: no algorithm ran")
                continue
            best = max(rows, key=lambda r: r[1])
            first = rows[0]
            print(f"{name} {what} {pm}x{pk}x{pn}: heuristic #0 {first[1]:.0f} TFLOP/s, best #{best[0]} "
                  f"{best[1]:.0f} ({best[1] / first[1]:.3f}x; id {best[4]} tile {best[5]} split-k {best[6]} "
                  f"stages {best[7]}), torch.matmul {torch_tflops:.0f}; {len(rows)} algorithms")
            for r in rows:
                lines.append(f"{name},{what},{pm}x{pk}x{pn},{r[0]},{r[1]:.1f},{r[2]:.2f},{r[3]:.2e},{r[4]},{r[5]},{r[6]},{r[7]},{r[8]:.2f},{torch_tflops:.1f}")
    if args.csv:
        with open(args.csv, "a") as f:
            f.write("product,layout,mxkxn,heuristic_rank,tflops,us,rel_err,algo_id,tile_id,split_k,stages,waves,torch_tflops\n")
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
