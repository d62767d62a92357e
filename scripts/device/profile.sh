#!/usr/bin/env bash
# One device call: where the time of the memory-bound and matmul-bound training ops goes.
# Runs single iterations of `liger bench` under Nsight Compute (kernel durations and DRAM
# bytes, clocks left alone), so each step's kernels can be summed and set against the
# bench's own wall time of the same step (the difference is host-side or launch gaps).
#
#   usage: scripts/device/profile.sh [ce] [flce] [jsd] [swiglu] [swiglu-detail] [flash-detail]
#                                    [e2e-step]
#
# e2e-step: every kernel's duration over `liger bench --e2e` of E2E_MODEL (default
# llama3.2-1b) at E2E_SEQ tokens (default 4096; E2E_LORA_RANK adds LoRA adapters of that
# rank), liger on, --memory-pool release: only the timed step (one warm-up step before it)
# is recorded, through the bench's profiler range (--e2e-profile-range, ncu
# --profile-from-start off; ncu follows the case's child process), cuBLASLt ordered by host
# synchronization (ncu's serialized launches never release the default's device-side
# waits). The kernels summed (scripts/ncu_summary.py --total, written beside the CSV) are set
# against the same case's step time measured without ncu: the difference is the time the
# GPU waits on the host inside a step.
#
# swiglu-detail: ncu's speed-of-light, occupancy, launch, warp-state and memory sections
# for every kernel of one SwiGLU bench iteration (the copy and x+y ceilings included), to
# set the fused kernel's stalls and achieved bandwidth beside Burn's add kernel's.
#
# flash-detail: the same sections plus instruction and source counters for the flash
# attention kernels (forward, dK/dV, dQ) of one bf16 forward+backward iteration at
# FLASH_SHAPE (default 1x4096x32x8x64).
#
# jsd: kernel durations of one fused linear JSD iteration (liger and the stock composition)
# at JSD_SHAPE (default 1024x4096x128256: two chunks).
#
# PROFILE_BIN picks the binary (default: env.sh's $BIN).
#
# Writes $OUT/ncu_<step>.csv (one row per kernel and metric) and $OUT/ncu_<step>.log;
# e2e-step writes $OUT/ncu_e2e-step_<model>_<seq>.{csv.gz,log,txt} (every process of the case
# in the one file, as ncu's `--log-file` does not expand `%p`; .txt is its --total summary).
# Summarize here with scripts/ncu_summary.py.
set -u
. "$(dirname "$0")/env.sh"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
BIN=${PROFILE_BIN:-$BIN}
echo "ncu: $NCU, binary: $BIN"
status=0
one_iteration="--warmup 1 --iters 1 --repeats 1"
for step in ${*:-ce flce swiglu}; do
  # What ncu collects: a few metrics, or (swiglu-detail) whole sections.
  collect="--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"
  case $step in
    ce) args="--op cross_entropy --shape 8192x128256" ;;
    flce) args="--op fused_linear_cross_entropy --shape 8192x4096x128256"; collect="--metrics gpu__time_duration.sum" ;;
    jsd) args="--op fused_linear_jsd --shape ${JSD_SHAPE:-1024x4096x128256}"; collect="--metrics gpu__time_duration.sum" ;;
    swiglu) args="--op swiglu --shape 8192x14336" ;;
    swiglu-detail)
      args="--op swiglu --shape 8192x14336 --copy-mib 1024"
      collect="--page details --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats" ;;
    flash-detail)
      args="--attention --attention-shape ${FLASH_SHAPE:-1x4096x32x8x64} --attention-provider flash"
      collect="--kernel-name regex:flash --launch-skip 1 --launch-count 6 --page details --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats \
        --section MemoryWorkloadAnalysis_Tables --section SourceCounters" ;;
    e2e-step)
      name="ncu_${step}_${E2E_MODEL:-llama3.2-1b}_${E2E_SEQ:-4096}"
      timeout "${PROFILE_TIMEOUT:-400}" "$NCU" --clock-control none --cache-control none \
        --target-processes all --profile-from-start off --csv --metrics gpu__time_duration.sum \
        --log-file "$OUT/$name.csv" $TRAIN_BIN bench --e2e --device cuda --dtype bf16 \
        --e2e-models "${E2E_MODEL:-llama3.2-1b}" --e2e-seq "${E2E_SEQ:-4096}" --e2e-modes on \
        ${E2E_LORA_RANK:+--e2e-lora-rank $E2E_LORA_RANK} \
        --e2e-warmup 1 --e2e-steps 1 --e2e-profile-range on --e2e-timeout 390 --memory-pool release \
        --e2e-matmul-ordering host-synchronization \
        >"$OUT/$name.log" 2>&1 || status=1
      python3 "$(dirname "$0")/../ncu_summary.py" --total "$OUT/$name.csv" 200 >"$OUT/$name.txt"
      gzip -f "$OUT/$name.csv"
      echo "$name:"; head -n 30 "$OUT/$name.txt"; tail -n 3 "$OUT/$name.log"
      continue ;;
    *) echo "unknown step $step"; status=1; continue ;;
  esac
  timeout 280 "$NCU" --clock-control none --csv $collect --log-file "$OUT/ncu_$step.csv" \
    $BIN bench --device cuda --dtype bf16 $args $one_iteration >"$OUT/ncu_$step.log" 2>&1 || status=1
  echo "$step: $(wc -l <"$OUT/ncu_$step.csv") rows"; tail -n 3 "$OUT/ncu_$step.log"
done
exit $status
