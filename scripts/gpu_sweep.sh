#!/usr/bin/env bash
# Launch-geometry sweep on the device (LIGER_* tuning knobs of liger-cubecl-kernels):
# prints, per setting, the liger rows of `liger bench`. Used to pick the defaults.
set -u
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
BIN=.gpu/liger
b() { $BIN bench --device cuda --dtype bf16 --warmup 5 --iters 30 --repeats 5 "$@" 2>&1; }
show() { grep -E "^[a-z_]+ [0-9]+x[0-9]+|^  (forward|backward|full)"; }
{
echo "== default, larger shapes (fixed per-op overhead?)"
b --op rms_norm --shape 8192x4096 --shape 32768x4096 --shape 8192x16384 | show
for v in 1 2 8 16; do
  echo "== LIGER_FWD_VPU=$v"
  LIGER_FWD_VPU=$v b --op rms_norm,softmax | show
done
for v in 2 4 8; do for p in 2 8; do
  echo "== LIGER_BWD_VPU=$v LIGER_PARTIALS_PER_SM=$p"
  LIGER_BWD_VPU=$v LIGER_PARTIALS_PER_SM=$p b --op rms_norm,layer_norm | show
done; done
} | tee "$OUT/sweep.log"
