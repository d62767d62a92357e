"""CUDA-event timing of the device probes (`cublaslt_algos.py`)."""
import statistics

import torch


def median_ms(run, warmup=5, samples=7, iters=20):
    """`run`'s time in ms: the median over `samples` samples of the mean of `iters` calls
    between two CUDA events on torch's current stream, after `warmup` calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)
