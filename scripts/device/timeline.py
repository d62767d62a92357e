#!/usr/bin/env python3
"""The GPU timeline of one `liger bench --e2e` training step, where Nsight Systems is not
installed: the Rust bench runs inside this process (verify/timeline's shared library,
`liger_bench`), under torch.profiler, whose CUPTI tracing records every kernel, copy and
memset of the process whatever library launched it.

    usage: scripts/device/timeline.py LIB OUT_PREFIX -- BENCH_ARGS...

BENCH_ARGS are `liger bench` flags for one case run in this process (`--e2e --e2e-case
MODEL:SEQ:BATCH:on ...`, with --e2e-steps 1 and --e2e-profile-range on). The timed step
is the one inside the bench's profiler range (its cuProfilerStart and cuProfilerStop
calls, where the tracer records them), else the one after the W-th optimizer phase
(see `step_window`).

Writes OUT_PREFIX.txt: the timed step's span, the GPU's busy time (the union of the
activities' intervals, the ordering kernels' left out: they only wait) and idle time, the idle time between consecutive activities
grouped by the pair of kernel names around it, and the largest single gaps with their
neighbours, and the host threads' CUDA API time in the step (which thread launched, and
which waited: a synchronizing call on the thread that launches leaves the GPU idle);
OUT_PREFIX.json.gz: the activities (name, start and end in microseconds) of the timed step;
OUT_PREFIX.all.json.gz: every GPU activity and host CUDA API call recorded (start, end,
name; and the thread of a host call).
"""
import collections
import ctypes
import gzip
import json
import sys


# The kernels that order cuBLASLt's and cuDNN's work against CubeCL's stream (publish a
# flag, spin until one is set): they run while nothing else does, so they are not work.
ORDERING = ("publish_kernel", "await_kernel", "liger_write", "liger_wait_geq")


def short(name):
    return name.split("(")[0].split("<")[0].replace("void ", "")[:70]


def analyze(events, window):
    """The activities (start, end in microseconds, name; sorted by start) that start inside
    `window` (the timed step: the bench's profiler range) and the report's lines."""
    everything = [e for e in events if window[0] <= e[0] <= window[1]]
    if not everything:
        sys.exit("no GPU activity inside the profiler range")
    step = [e for e in everything if not e[2].startswith(ORDERING)]
    ordering = len(everything) - len(step)
    span = step[-1][1] - step[0][0]
    busy, gaps, cursor = 0.0, [], step[0][0]
    by_pair = collections.defaultdict(lambda: [0.0, 0])
    previous = "(step start)"
    for start, end, name in step:
        if start > cursor:
            gap = start - cursor
            gaps.append((gap, previous, name, cursor - step[0][0]))
            entry = by_pair[(previous, name)]
            entry[0] += gap
            entry[1] += 1
        if end > cursor:
            busy += end - max(start, cursor)
            cursor = end
            previous = name
    idle = span - busy
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for start, end, name in step:
        by_name[name][0] += end - start
        by_name[name][1] += 1
    lines = [f"timed step: {len(step)} activities over {span / 1e3:.2f} ms; GPU busy "
             f"{busy / 1e3:.2f} ms, idle {idle / 1e3:.2f} ms ({100 * idle / span:.1f}%); "
             f"{ordering} ordering kernels ({', '.join(ORDERING)}) not counted as work",
             "", "idle time by the activities around it (ms, count, before -> after):"]
    for (a, b), (t, n) in sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:40]:
        lines.append(f"{t / 1e3:9.3f} {n:5}  {a} -> {b}")
    lines += ["", "largest gaps (ms, at ms into the step, before -> after):"]
    for gap, a, b, at in sorted(gaps, reverse=True)[:40]:
        lines.append(f"{gap / 1e3:9.3f} at {at / 1e3:8.2f}  {a} -> {b}")
    lines += ["", "activity time by name (ms, count):"]
    for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]:
        lines.append(f"{t / 1e3:9.3f} {n:5}  {name}")
    return step, lines


def step_window(events, calls, warmup):
    """The timed step's span: the bench's profiler range where the tracer recorded its
    cuProfilerStart/Stop calls; else from the end of the `warmup`-th optimizer phase to
    the end of the next one. An optimizer phase is a run of AdamW kernels with no matrix
    product (cuBLAS, cuDNN) among them: the optimizer interleaves its kernels with small
    copies, and every step's forward and backward run products."""
    starts = [c[1] for c in calls if c[2] == "cuProfilerStart"]
    stops = [c[0] for c in calls if c[2] == "cuProfilerStop"]
    if starts and stops:
        return starts[0], stops[-1]
    phase_ends, in_phase = [], False
    for start, end, name in events:
        if name.startswith("adamw"):
            if in_phase:
                phase_ends[-1] = end
            else:
                phase_ends.append(end)
                in_phase = True
        elif name.startswith(("nvjet", "cudnn", "cutlass", "sm90_", "ampere_")):
            in_phase = False
    if len(phase_ends) < warmup + 1:
        sys.exit(f"found {len(phase_ends)} optimizer phases, expected at least {warmup + 1}")
    begin = phase_ends[warmup - 1] if warmup > 0 else events[0][0]
    return begin + 1e-3, phase_ends[warmup]


def host_lines(calls, begin, end):
    """Per host thread, the CUDA API calls (runtime and driver) that overlap the step
    [begin, end]: total time and count by name, and the longest single calls."""
    by_thread = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
    longest = []
    for start, stop, name, thread in calls:
        if stop < begin or start > end:
            continue
        entry = by_thread[thread][name]
        entry[0] += stop - start
        entry[1] += 1
        longest.append((stop - start, name, thread, start - begin))
    lines = ["", "host CUDA API time in the step, by thread (ms, count):"]
    for thread, names in sorted(by_thread.items(), key=lambda kv: -sum(v[0] for v in kv[1].values())):
        total = sum(v[0] for v in names.values())
        lines.append(f"thread {thread}: {total / 1e3:.2f} ms in {sum(v[1] for v in names.values())} calls")
        for name, (t, n) in sorted(names.items(), key=lambda kv: -kv[1][0])[:12]:
            lines.append(f"  {t / 1e3:9.3f} {n:6}  {name}")
    lines += ["", "longest host CUDA API calls (ms, name, thread, at ms into the step):"]
    for t, name, thread, at in sorted(longest, reverse=True)[:25]:
        lines.append(f"{t / 1e3:9.3f}  {name}  thread {thread}  at {at / 1e3:.2f}")
    return lines


def main():
    if len(sys.argv) < 4 or sys.argv[3] != "--":
        sys.exit(__doc__)
    lib_path, prefix, bench = sys.argv[1], sys.argv[2], sys.argv[4:]
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    lib = ctypes.CDLL(lib_path)
    lib.liger_bench.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    argv = [b"liger-bench"] + [a.encode() for a in bench]
    array = (ctypes.c_char_p * len(argv))(*argv)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        code = lib.liger_bench(len(argv), array)
    print(f"liger_bench returned {code}", flush=True)
    events = sorted(
        ((e.time_range.start, e.time_range.end, short(e.name))
         for e in prof.events() if e.device_type == DeviceType.CUDA),
        key=lambda e: e[0])
    calls = sorted(((e.time_range.start, e.time_range.end, e.name, e.thread)
                    for e in prof.events()
                    if e.device_type == DeviceType.CPU and e.name.startswith(("cu", "cuda"))),
                   key=lambda c: c[0])
    # Everything recorded, for analysis elsewhere: GPU activities and host calls.
    with gzip.open(prefix + ".all.json.gz", "wt") as f:
        json.dump({"gpu": events, "host": calls}, f)
    warmup = int(bench[bench.index("--e2e-warmup") + 1]) if "--e2e-warmup" in bench else 2
    step, lines = analyze(events, step_window(events, calls, warmup))
    lines += host_lines(calls, step[0][0], step[-1][1])
    with open(prefix + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with gzip.open(prefix + ".json.gz", "wt") as f:
        json.dump([[round(s - step[0][0], 3), round(e - step[0][0], 3), n] for s, e, n in step], f)
    print("\n".join(lines[:60]))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
