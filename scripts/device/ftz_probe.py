#!/usr/bin/env python3
"""What flush-to-zero would buy the flash forward kernel, measured.

    LIGER_DUMP_CUDA=DIR cargo test -p liger-cubecl-kernels --lib codegen   # on any machine
    python3 scripts/device/ftz_probe.py DIR/forward_mma_bf16_d64_t1_false.cu [--seq 16384]

CubeCL compiles its CUDA C++ with NVRTC without `--ftz=true`, so every hardware
exponential carries ptxas's denormal fix-up (three instructions; FlashAttention-2's build
has flush-to-zero through `--use_fast_math`). This compiles the forward kernel's generated
source (head_dim 64, four planes of 16 query rows, 64-key steps: the default tiling) the
way cubecl-cuda does, once as is and once with `--ftz=true`, loads both through the driver
as cubecl-cuda does (PTX, JIT-compiled), launches them on torch's stream with the
arguments and the parameter block CubeCL would pass (causal, bf16, batch 1, 32 query
heads over 8 key heads), checks both outputs against SDPA's, and times both beside SDPA's
FlashAttention-2 forward (CUDA events; a sample is the mean of 20 launches, the median of
7 samples after 5 warm-up launches).
"""
import argparse
import ctypes
import glob
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cuda_timing import median_ms  # noqa: E402
from nvrtc_program import compile_program, program_output  # noqa: E402

KERNEL = b"flash_forward_mma_kernel_f_bf16_n_8"
# The kernel's tiles (bytes): a 128-byte barrier slot, then Q (64 rows) and two buffers
# each of K and V (64 rows), rows of head_dim/8 + 1 16-byte vectors.
OWN_ROWS, STEP_ROWS, UNITS = 64, 64, 128


def shared_bytes(head_dim):
    row = (head_dim // 8 + 1) * 16
    return 128 + (OWN_ROWS + 4 * STEP_ROWS) * row


def find(patterns):
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def cuda_path():
    """As cubecl-cuda finds it: CUDA_PATH, else /usr/local/cuda."""
    return os.environ.get("CUDA_PATH", "/usr/local/cuda")


def nvrtc_lib():
    """NVRTC as the loader finds it (as cudarc loads it for cubecl-cuda), else the CUDA
    installation's or torch's."""
    for name in ("libnvrtc.so.13", "libnvrtc.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    site = os.path.dirname(torch.__file__) + "/../nvidia"
    path = find([f"{cuda_path()}/lib64/libnvrtc.so.13*", f"{site}/cu13/lib/libnvrtc.so.13*"])
    if path is None:
        raise SystemExit("no libnvrtc found")
    builtins = find([os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*")])
    if builtins:
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


def include_options():
    """cubecl-cuda's include paths: the CUDA installation's include and include/cccl."""
    root = f"{cuda_path()}/include"
    return [f"--include-path={d}".encode() for d in (root, f"{root}/cccl") if os.path.isdir(d)]


def compile_ptx(nvrtc, source, extra):
    major, minor = torch.cuda.get_device_capability()
    arch = f"--gpu-architecture=sm_{major}{minor}{'a' if major >= 9 else ''}".encode()
    options = [arch] + include_options() + [b"-lineinfo"] + extra
    prog, _ = compile_program(nvrtc, source, options, "the flash forward")
    return program_output(nvrtc, prog, "PTX")


class Kernel:
    def __init__(self, cuda, ptx, smem):
        self.cuda, self.smem = cuda, smem
        module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuModuleLoadData(ctypes.byref(module), ptx) == 0, "cuModuleLoadData"
        assert cuda.cuModuleGetFunction(ctypes.byref(self.fn), module, KERNEL) == 0, "cuModuleGetFunction"
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        assert cuda.cuFuncSetAttribute(self.fn, 8, ctypes.c_int(smem)) == 0, "cuFuncSetAttribute"

    def launch(self, grid, pointers):
        values = [ctypes.c_void_p(p) for p in pointers]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self.cuda.cuLaunchKernel(self.fn, *[ctypes.c_uint(x) for x in grid], ctypes.c_uint(UNITS),
                                      ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(self.smem), stream,
                                      params, None)
        assert rc == 0, f"cuLaunchKernel: {rc}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="forward_mma_bf16_d64_t1_false.cu as LIGER_DUMP_CUDA writes it")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    args = ap.parse_args()
    head_dim, s, hq, hk = 64, args.seq, args.q_heads, args.kv_heads
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cuda = ctypes.CDLL("libcuda.so.1")
    nvrtc = nvrtc_lib()
    source = open(args.source, "rb").read()
    q = torch.randn(1, hq, s, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, hk, s, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, hk, s, head_dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(hq * s, device="cuda", dtype=torch.float32)
    unused = torch.zeros(4, device="cuda", dtype=torch.int32)
    # CubeCL's parameter block: scalars_float[2] (scale), scalars_uint32[4] (seq, q_heads,
    # kv_heads, window), static_meta[16] (unused by this kernel).
    block = struct.pack("<2f4I16I", head_dim ** -0.5, 0.0, s, hq, hk, 0, *([0] * 16))
    info = torch.frombuffer(bytearray(block), dtype=torch.uint8).to("cuda")
    pointers = [q.data_ptr(), k.data_ptr(), v.data_ptr(), unused.data_ptr(), unused.data_ptr(),
                unused.data_ptr(), out.data_ptr(), lse.data_ptr(), info.data_ptr()]
    grid = (s // OWN_ROWS, hq, 1)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    flops = 4 * s * s * head_dim * hq / 2
    rows = []
    for name, extra in (("as CubeCL compiles it", []), ("--ftz=true", [b"--ftz=true"])):
        kernel = Kernel(cuda, compile_ptx(nvrtc, source, extra), shared_bytes(head_dim))
        out.fill_(float("nan"))
        kernel.launch(grid, pointers)
        torch.cuda.synchronize()
        err = (out.float() - reference.float()).abs().max().item()
        ms = median_ms(lambda: kernel.launch(grid, pointers))
        rows.append((name, ms, err))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    print(f"flash forward, 1x{s}x{hq}x{hk}x{head_dim} causal bf16 ({torch.cuda.get_device_name()}):")
    for name, ms, err in rows:
        print(f"  liger-burn's kernel {name:24s} {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  "
              f"max |out - SDPA| {err:.3e}")
    print(f"  SDPA FlashAttention-2               {sdpa_ms:8.4f} ms  {flops / sdpa_ms / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
