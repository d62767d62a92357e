#!/usr/bin/env bash
# The PyTorch anchors on the device machine, from the repository root: installs the
# carried wheels (.whl/*.whl: liger-kernel; torch, triton and transformers are the
# machine's own), then runs the steps asked for, logs and CSVs under $OUT.
#
#   usage: scripts/device/anchor.sh [kernels] [e2e] [e2e-llama] [e2e-qwen]   (default: kernels e2e)
#
# kernels    scripts/device/anchor_kernels.py: ops, copy and matmul ceilings, the models'
#            GEMMs (about 2-3 min on an H100)             -> $OUT/anchor_kernels.{csv,log}
# e2e        scripts/device/anchor_e2e.py, both models     -> $OUT/anchor_e2e.{csv,log},
#            every case's stderr (step times, tracebacks)  -> $OUT/anchor_e2e_cases.log
# e2e-llama, e2e-qwen   one model each (one device call each when both do not fit in one)
# post       scripts/device/anchor_post.py: the chunked losses (POST_OPS, default DPO and the
#            distillation JSD) by PyTorch and Liger-Kernel  -> $OUT/anchor_post.{csv,log}
#
# ANCHOR_SEQ (default 1024,4096,16384; add 32768 for the longest case), ANCHOR_BUDGET
# (seconds for one e2e step, default 540), ANCHOR_TIMEOUT (per case, default 240) and
# ANCHOR_E2E_ARGS (more flags, e.g. "--adamw-impl for-loop") override the e2e flags.
set -u
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export LIGER_COMMIT=${LIGER_COMMIT:-$(cat .gpu/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export LIGER_GPU_NAME=${LIGER_GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1
python3 -c 'import torch, transformers, triton, liger_kernel; from importlib.metadata import version as v
print("anchor: torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__,
      "liger-kernel", v("liger-kernel"), "|", torch.cuda.get_device_name())' || exit 1
status=0
e2e() {
  python3 scripts/device/anchor_e2e.py --csv "$OUT/anchor_e2e.csv" \
    --seq "${ANCHOR_SEQ:-1024,4096,16384}" --budget "${ANCHOR_BUDGET:-540}" \
    --timeout "${ANCHOR_TIMEOUT:-240}" --case-log "$OUT/anchor_e2e_cases.log" \
    ${ANCHOR_E2E_ARGS:-} "$@" 2>&1 | tee -a "$OUT/anchor_e2e.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
for step in ${*:-kernels e2e}; do
  case $step in
    kernels)
      python3 scripts/device/anchor_kernels.py --csv "$OUT/anchor_kernels.csv" \
        >"$OUT/anchor_kernels.log" 2>&1 || status=1
      grep -v "^\s*File\|^Traceback" "$OUT/anchor_kernels.log" | tail -n 60
      ;;
    post)
      python3 scripts/device/anchor_post.py --ops "${POST_OPS:-fused_linear_dpo,fused_linear_jsd}" \
        --csv "$OUT/anchor_post.csv" >"$OUT/anchor_post.log" 2>&1 || status=1
      grep -v "^\s*File\|^Traceback" "$OUT/anchor_post.log" | tail -n 30
      ;;
    e2e) e2e ;;
    e2e-llama) e2e --models llama3.2-1b ;;
    e2e-qwen) e2e --models qwen2.5-1.5b ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
