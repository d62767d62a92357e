#!/usr/bin/env python3
"""Static SASS of CubeCL's generated CUDA C++, on a machine without a GPU.

    LIGER_DUMP_CUDA=DIR cargo test -p liger-cubecl-kernels --lib codegen
    python3 scripts/sass_static.py --fetch TOOLS          # once: NVRTC 13.0 and cuobjdump
    python3 scripts/sass_static.py --tools TOOLS DIR/forward_mma_bf16_d64_t1_false.cu ...

Compiles each source as cubecl-cuda 0.10 does (NVRTC, `--gpu-architecture=sm_90a`,
`-lineinfo`; the H200 machine's CUDA 13.0) to a cubin, disassembles it and prints the
registers and spills ptxas reports, the instruction count and, for each loop of more than
100 instructions (a backward branch), its opcode mix: the flash kernels' per-step body.
The driver on the device JIT-compiles CubeCL's PTX with its own ptxas, so registers and
instruction counts can differ a little from these; executed counts come from Nsight
Compute on the device (`scripts/ncu_sass_opcodes.py`). `--sass DIR` also writes the
disassembly there.
"""
import argparse
import collections
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

from nvrtc_program import compile_program, program_output

# NVRTC matching the device's CUDA 13.0; the disassembler's version does not matter.
WHEELS = [
    "nvidia-cuda-nvrtc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-crt==13.0.*",
    "nvidia-cuda-cccl==13.0.*",
    "nvidia-cuda-cuobjdump",
    "nvidia-cuda-nvdisasm",
]


def fetch(tools):
    """Downloads and unpacks the wheels into `tools` (no torch, no CUDA driver needed)."""
    wheels = os.path.join(tools, "wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", "--python-version", "3.12", "-d", wheels]
        + WHEELS,
        check=True,
    )
    for wheel in glob.glob(os.path.join(wheels, "*.whl")):
        subprocess.run(["unzip", "-q", "-o", wheel, "-d", tools], check=True)


def cuda_root(tools):
    root = os.path.join(tools, "nvidia", "cu13")
    if not os.path.exists(os.path.join(root, "lib", "libnvrtc.so.13")):
        sys.exit(f"no NVRTC under {root}: run with --fetch {tools} first")
    return root


def compile_cubin(root, path, extra=()):
    """(cubin bytes, ptxas log) of one source, as cubecl-cuda compiles it (plus `extra`
    NVRTC options)."""
    # NVRTC finds its builtins library through the loader's path.
    ctypes.CDLL(os.path.join(root, "lib", "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(os.path.join(root, "lib", "libnvrtc.so.13"))
    source = open(path, "rb").read()
    options = [
        b"--gpu-architecture=sm_90a",
        f"--include-path={root}/include".encode(),
        f"--include-path={root}/include/cccl".encode(),
        b"-lineinfo",
        b"--ptxas-options=-v",
    ] + [o.encode() for o in extra]
    prog, log = compile_program(nvrtc, source, options, path)
    return program_output(nvrtc, prog, "CUBIN"), log


def disassemble(root, cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        env = dict(os.environ, PATH=os.path.join(root, "bin") + os.pathsep + os.environ["PATH"])
        out = subprocess.run([os.path.join(root, "bin", "cuobjdump"), "-sass", f.name],
                             capture_output=True, text=True, env=env, check=True)
    return out.stdout


def instructions(sass):
    """(address, opcode) of each instruction; a guard predicate is not part of the opcode."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def mix(ins, top=24):
    counts = collections.Counter(op.split(".")[0] for _, op, _ in ins)
    return ", ".join(f"{k} {v}" for k, v in counts.most_common(top))


def loops(ins, smallest=100):
    """The bodies of backward branches of more than `smallest` instructions."""
    index = {a: i for i, (a, _, _) in enumerate(ins)}
    for i, (a, op, rest) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and m and int(m.group(1), 16) < a:
            start = index.get(int(m.group(1), 16))
            if start is not None and i + 1 - start > smallest:
                yield ins[start : i + 1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="*", help="CUDA C++ files written by LIGER_DUMP_CUDA")
    p.add_argument("--tools", default=os.path.expanduser("~/.cache/liger-sass"),
                   help="where the unpacked NVIDIA wheels are (default ~/.cache/liger-sass)")
    p.add_argument("--fetch", metavar="TOOLS", help="download and unpack the wheels into TOOLS, then go on")
    p.add_argument("--sass", metavar="DIR", help="also write each disassembly to DIR/NAME.sass")
    p.add_argument("--option", action="append", default=[], metavar="OPT",
                   help="an NVRTC option beyond cubecl-cuda's (repeatable), e.g. --option=--ftz=true "
                        "to see what flush-to-zero would remove")
    args = p.parse_args()
    if args.fetch:
        fetch(args.fetch)
        args.tools = args.fetch
    root = cuda_root(args.tools)
    for path in args.sources:
        cubin, log = compile_cubin(root, path, args.option)
        sass = disassemble(root, cubin)
        if args.sass:
            with open(os.path.join(args.sass, os.path.basename(path) + ".sass"), "w") as f:
                f.write(sass)
        usage = " ".join(
            re.sub(r"^ptxas\s+(info\s+:\s+)?\.?\s*", "", l.strip())
            for l in log.splitlines()
            if "registers" in l or "spill" in l
        )
        ins = instructions(sass)
        print(f"{os.path.basename(path)}: {len(ins)} instructions; {usage}")
        for body in loops(ins):
            print(f"  loop {body[0][0]:#x}-{body[-1][0]:#x}, {len(body)} instructions: {mix(body)}")


if __name__ == "__main__":
    main()
