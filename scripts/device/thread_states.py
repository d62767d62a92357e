#!/usr/bin/env python3
"""Where a running process's threads spend their time, without a profiler: samples
/proc/PID/task/*/{stat,syscall} every --interval seconds for --seconds, and prints per
thread (by name) how often it was running user code, in which system call it was blocked
(futex: a lock or condition variable; clock_nanosleep: a sleep step; ioctl: the GPU
driver; sched_yield), or runnable. Reading `syscall` needs root or ptrace rights.

    python3 scripts/device/thread_states.py PID [--seconds 5] [--interval 0.0005]
"""
import argparse
import collections
import os
import time

SYSCALLS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield",
            35: "nanosleep", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
            270: "pselect6", 271: "ppoll", 281: "epoll_pwait"}


def sample(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/syscall") as f:
                sc = f.read().split()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        if not sc or sc[0] == "running":
            what = "running"
        elif sc[0] == "-1":
            what = "user (not in a syscall)"
        else:
            what = SYSCALLS.get(int(sc[0]), f"syscall {sc[0]}")
        out.append((f"{name}[{tid}]", f"{state} {what}"))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("pid", type=int)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--interval", type=float, default=0.0005)
    a = p.parse_args()
    counts = collections.defaultdict(collections.Counter)
    n = 0
    end = time.time() + a.seconds
    while time.time() < end:
        for thread, what in sample(a.pid):
            counts[thread][what] += 1
        n += 1
        time.sleep(a.interval)
    print(f"{n} samples over {a.seconds} s")
    for thread in sorted(counts):
        c = counts[thread]
        total = sum(c.values())
        parts = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in c.most_common(5))
        print(f"{thread:28s} {parts}")


if __name__ == "__main__":
    main()
