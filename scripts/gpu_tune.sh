#!/usr/bin/env bash
# Launch-geometry sweeps on the device, one step per argument (logs under $OUT):
#   probe    which profilers the device machine has (nsys, ncu)
#   ce       cross entropy (8192x128256, 4096x151936) per LIGER_FWD_VPU (vectors per
#            unit: 16 = default, 512/1024 units on these widths; 64 = 128/256 units)
#   rope     RoPE forward + backward (backward from the concatenation of q and k)
#   ew       the elementwise sweep (scripts/gpu_sweep_elementwise.sh)
#   ce-ncu   ncu: the cross-entropy kernel's throughput sections, then every kernel of
#            the first launches of the liger forward (name and duration), to see where
#            the forward's time outside the kernel goes
# Expects the stripped release binary (--features cuda) at .gpu/liger.
set -u
. "$(dirname "$0")/gpu_env.sh"
show() { grep -E "^[a-z_]+ [0-9]+x[0-9]+|^  (forward|backward|full)|^copy"; }
for step in ${*:-probe ce rope}; do
  case $step in
    probe)
      { command -v nsys ncu nvcc; ls -d /usr/local/cuda*/bin 2>&1; nvidia-smi; } >"$OUT/probe.txt" 2>&1
      cat "$OUT/probe.txt" | head -20
      ;;
    ce)
      for vpu in 16 32 64 128; do
        echo "== cross_entropy LIGER_FWD_VPU=$vpu"
        LIGER_FWD_VPU=$vpu timeout 150 $BIN bench --device cuda --dtype bf16 --op cross_entropy \
          --shape 8192x128256,4096x151936 --warmup 5 --iters 20 --repeats 5 \
          --csv "$OUT/sweep_ce_vpu$vpu.csv" 2>&1 | show
      done | tee "$OUT/sweep_ce.log"
      ;;
    rope)
      timeout 120 $BIN bench --device cuda --dtype bf16 --op rope --csv "$OUT/bench_rope.csv" >"$OUT/bench_rope.log" 2>&1
      show <"$OUT/bench_rope.log"
      ;;
    ce-ncu)
      export PATH=/usr/local/cuda/bin:$PATH
      timeout 120 ncu -k regex:cross --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        .gpu/liger bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256 --warmup 1 --iters 2 --repeats 1 \
        >"$OUT/ncu_ce_kernel.txt" 2>&1
      grep -E "Duration|Throughput|Issued Warp|Registers|Achieved Occupancy" "$OUT/ncu_ce_kernel.txt"
      timeout 200 ncu --launch-count 80 --section SpeedOfLight \
        .gpu/liger bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256 --warmup 1 --iters 2 --repeats 1 \
        >"$OUT/ncu_ce_timeline.txt" 2>&1
      awk '/\(.*\)x\(.*\), Context/ {name=$1} /Duration/ {print name, $(NF)}' "$OUT/ncu_ce_timeline.txt" >"$OUT/ncu_ce_timeline_summary.txt"
      head -80 "$OUT/ncu_ce_timeline_summary.txt"
      ;;
    ew)
      timeout 300 bash scripts/gpu_sweep_elementwise.sh >/dev/null 2>&1
      cat "$OUT/sweep_elementwise.log"
      ;;
  esac
done
