#!/usr/bin/env bash
# One device call: the CUDA conformance suite (f32, bf16; plane and shared reduction
# paths), then the CUDA benchmarks, then (optionally) the same kernels through Vulkan.
# Runs on the device machine from the repository root; expects the stripped release
# binary (built with `--features cuda`) at .gpu/liger and the commit hash in .gpu/commit.
# Writes logs and CSVs under $OUT.
#
#   usage: scripts/gpu_batch.sh [check] [bench] [ce] [flce] [vulkan]
set -u
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
BIN=.gpu/liger
export LIGER_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
export LIGER_GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
steps=${*:-check bench}
status=0
for step in $steps; do
  case $step in
    check)
      # The quick sweep of every op, both reduction paths (the full sweep's f64
      # references of the large cross-entropy shapes take longer than one device call).
      for dtype in f32 bf16; do
        timeout 280 $BIN check --device cuda --dtype "$dtype" --reduction both --quick >"$OUT/check_cuda_$dtype.log" 2>&1 || status=1
        tail -n 3 "$OUT/check_cuda_$dtype.log"
      done
      ;;
    check-full)
      # The full sweep, one op family per process so a slow one does not hide the rest.
      for op in rms_norm layer_norm softmax swiglu geglu gelu sigmoid rope cross_entropy fused_linear; do
        timeout 200 $BIN check --device cuda --dtype "${DTYPE:-bf16}" --op $op >"$OUT/check_full_${op}.log" 2>&1 || status=1
        echo "$op: $(tail -n 2 "$OUT/check_full_${op}.log" | head -1)"
      done
      ;;
    bench)
      $BIN bench --device cuda --dtype bf16 --op rms_norm,layer_norm,softmax,log_softmax,fused_add_rms_norm,rope,swiglu,geglu \
        --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_cuda_bf16.log" 2>&1 || status=1
      tail -n 40 "$OUT/bench_cuda_bf16.log"
      ;;
    ce)
      # Both shapes in one process: the second is where stock Burn ran out of memory.
      $BIN bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256,4096x151936 \
        --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_ce.log" 2>&1 || status=1
      tail -n 14 "$OUT/bench_ce.log"
      ;;
    flce)
      # The memory curve over N (few iterations: each step is tens to hundreds of ms).
      $BIN bench --device cuda --dtype bf16 --op fused_linear_cross_entropy --warmup 2 --iters 3 --repeats 5 \
        --shape 2048x4096x128256,4096x4096x128256,8192x4096x128256,16384x4096x128256,32768x4096x128256 \
        --csv "$OUT/bench_flce.csv" >"$OUT/bench_flce.log" 2>&1 || status=1
      tail -n 24 "$OUT/bench_flce.log"
      ;;
    vulkan)
      for f in .gl/*.deb; do dpkg -x "$f" /; done
      ldconfig
      export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
      export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
      { ls -l /usr/local/nvidia/share/vulkan/icd.d/ /usr/share/vulkan/icd.d/ 2>&1; ldconfig -p | grep -iE "vulkan|GLX_nvidia"; } >"$OUT/vulkan_env.txt" 2>&1
      $BIN check --device vulkan --dtype f32 --quick >"$OUT/check_vulkan_f32.log" 2>&1 || status=1
      tail -n 3 "$OUT/check_vulkan_f32.log"
      $BIN bench --device vulkan --dtype f16 --op all --csv "$OUT/bench_vulkan_f16.csv" >"$OUT/bench_vulkan_f16.log" 2>&1 || status=1
      tail -n 30 "$OUT/bench_vulkan_f16.log"
      ;;
  esac
done
exit $status
