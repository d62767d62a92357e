#!/usr/bin/env bash
# Nsight Compute's view of the flash kernels beside FlashAttention-2's (PyTorch SDPA's flash
# backend), one forward + backward each at SHAPE (default 1x16384x32x8x64, causal, bf16):
# speed of light, occupancy, warp states, scheduler and instruction statistics, clocks
# left alone. Writes $OUT/ncu_flash_liger.csv and $OUT/ncu_flash_fa2.csv.
set -u
. "$(dirname "$0")/env.sh"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
SHAPE=${SHAPE:-1x16384x32x8x64}
IFS=x read -r B S HQ HK D <<<"$SHAPE"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
timeout 250 "$NCU" --clock-control none --csv --page details $SECTIONS \
  --kernel-name regex:flash --launch-skip 2 --launch-count 4 --log-file "$OUT/ncu_flash_liger.csv" \
  $TRAIN_BIN bench --attention --device cuda --dtype bf16 --attention-shape "$SHAPE" \
  --attention-provider flash --warmup 1 --iters 1 --repeats 1 >"$OUT/ncu_flash_liger.log" 2>&1
echo "liger: $(wc -l <"$OUT/ncu_flash_liger.csv") rows"; tail -n 2 "$OUT/ncu_flash_liger.log"
cat >/tmp/fa2_once.py <<PY
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
q = torch.randn($B, $HQ, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn($B, $HK, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn($B, $HK, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn($B, $HQ, $S, $D, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(g)
torch.cuda.synchronize()
PY
timeout 200 "$NCU" --clock-control none --csv --page details $SECTIONS \
  --kernel-name regex:flash --launch-skip 4 --launch-count 4 --log-file "$OUT/ncu_flash_fa2.csv" \
  python3 /tmp/fa2_once.py >"$OUT/ncu_flash_fa2.log" 2>&1
echo "fa2: $(wc -l <"$OUT/ncu_flash_fa2.csv") rows"; tail -n 2 "$OUT/ncu_flash_fa2.log"
for f in liger fa2; do
  python3 - "$OUT/ncu_flash_$f.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0] if rows else []
want = ["Duration", "Compute (SM) Throughput", "Memory Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Issue Slots Busy", "Executed Ipc Active", "No Eligible",
        "Warp Cycles Per Issued Instruction", "Executed Instructions"]
try:
    k, name, val, unit = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
except ValueError:
    print("no rows", sys.argv[1]); sys.exit()
seen = {}
for r in rows[1:]:
    if r[name] in want:
        seen.setdefault(r[k][:60], []).append(f"{r[name]}={r[val]}{r[unit]}")
for kern, vals in seen.items():
    print(kern); print("   " + "; ".join(vals))
PY
done
