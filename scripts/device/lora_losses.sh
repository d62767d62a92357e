#!/usr/bin/env bash
# Issue 15's comparison in one device call: LoRA rank-64 training from the same start by
# liger-burn and by PyTorch + PEFT + Liger-Kernel (50 steps at lr 1e-4, every step's loss
# and the median step's speed and peak memory), compared step by step by
# scripts/compare_losses.py, then the Llama-3-8B-shaped LoRA step at 4K tokens.
# Runs on the device machine from the repository root with the carried .gpu/ binaries and
# .whl/ wheels; logs and CSVs under $OUT.
#
#   LORA_SEQ (default 1024,4096)   LORA_MODELS (default llama3.2-1b,qwen2.5-1.5b)
#   LORA_8B=off skips the 8B step
set -u
. "$(dirname "$0")/env.sh"
seq=${LORA_SEQ:-1024,4096}
models=${LORA_MODELS:-llama3.2-1b,qwen2.5-1.5b}
start=/tmp/lora-start
log="$OUT/lora_losses.log"
status=0
{
  echo "# $LIGER_GPU_NAME, $(date -u +%F), binary $LIGER_COMMIT: 50 LoRA rank-64 steps (lr 1e-4, release pool) from the same start against PyTorch + PEFT + Liger-Kernel (speed: median of 49 steps after the first)"
  echo "## liger bench --e2e --e2e-lora-rank 64 --e2e-warmup 0 --e2e-steps 49 --e2e-lr 1e-4 --memory-pool release --e2e-save-start $start"
} >"$log"
timeout 280 $TRAIN_BIN bench --e2e --device cuda --dtype bf16 --e2e-models "$models" --e2e-seq "$seq" \
  --e2e-modes on --e2e-lora-rank 64 --e2e-warmup 0 --e2e-steps 49 --e2e-lr 1e-4 \
  --e2e-timeout 100 --e2e-budget 260 --memory-pool release --e2e-save-start "$start" \
  --csv "$OUT/lora_losses.csv" >>"$log" 2>&1 || status=1
echo "## anchor_e2e.py --start $start --lora-rank 64 --warmup 0 --steps 49 --lr 1e-4" >>"$log"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || status=1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
PYTHONUNBUFFERED=1 timeout 280 python3 scripts/device/anchor_e2e.py --csv "$OUT/lora_losses.csv" \
  --models "$models" --seq "$seq" --providers torch+liger-kernel --start "$start" \
  --lora-rank 64 --warmup 0 --steps 49 --lr 1e-4 --timeout 100 --budget 260 \
  --commit "$LIGER_COMMIT" >>"$log" 2>&1 || status=1
echo "## scripts/compare_losses.py" >>"$log"
python3 scripts/compare_losses.py "$OUT/lora_losses.csv" --a liger-burn --b torch+liger-kernel \
  --config lora=r64 >>"$log" 2>&1 || status=1
if [ "${LORA_8B:-on}" = on ]; then
  echo "## liger bench --e2e --e2e-models llama3-8b --e2e-seq 4096 --e2e-lora-rank 64 --memory-pool release" >>"$log"
  timeout 150 $TRAIN_BIN bench --e2e --device cuda --dtype bf16 --e2e-models llama3-8b \
    --e2e-seq 4096 --e2e-modes on --e2e-lora-rank 64 --e2e-timeout 120 --memory-pool release \
    --csv "$OUT/lora_8b.csv" >>"$log" 2>&1 || status=1
fi
grep -E "^\[|^## |agree|DIFFER|^model " "$log" | tail -n 30
exit $status
