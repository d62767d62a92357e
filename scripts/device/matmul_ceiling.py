"""The matrix-product ceiling of the fused-linear-cross-entropy shapes, through PyTorch
(cuBLAS) on the device machine: the three products of one chunk, and of the whole batch,
bf16 random inputs, CUDA-event timing (median of 20 after 5 warm-up runs).

    python3 scripts/matmul_ceiling.py > $OUT/matmul_ceiling.csv
"""
import torch

def bench(m, k, n, runs=20):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    ms = times[len(times) // 2]
    return ms, 2 * m * k * n / ms / 1e9

print("product,m,k,n,ms,tflops,device")
name = torch.cuda.get_device_name()
h, v = 4096, 128256
for rows in (4096, 8192):
    for product, (m, k, n) in {
        "logits x_c W^T": (rows, h, v),
        "grad_x g W": (rows, v, h),
        "grad_W g^T x_c": (v, rows, h),
    }.items():
        ms, tf = bench(m, k, n)
        print(f"{product} ({rows} rows),{m},{k},{n},{ms:.3f},{tf:.1f},{name}")
ms, tf = bench(8192, 8192, 8192)
print(f"square,8192,8192,8192,{ms:.3f},{tf:.1f},{name}")
