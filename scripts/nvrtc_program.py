"""NVRTC through ctypes: one CUDA C++ source compiled with the given options, its log and
its output (for `scripts/sass_static.py`)."""
import ctypes


def compile_program(nvrtc, source, options, what):
    """Compiles `source` (bytes) with `options` (bytes) by the loaded library `nvrtc`;
    returns the program and its log, or exits naming `what` with the log."""
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None):
        raise SystemExit(f"{what}: nvrtcCreateProgram failed")
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc:
        raise SystemExit(f"{what}: compilation failed ({options})\n{log.value.decode()}")
    return prog, log.value.decode()


def program_output(nvrtc, prog, kind):
    """The compiled program's `kind` output: "PTX" or "CUBIN"."""
    size = ctypes.c_size_t()
    getattr(nvrtc, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    getattr(nvrtc, f"nvrtcGet{kind}")(prog, out)
    return out.raw
