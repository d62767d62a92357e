#!/usr/bin/env bash
# The H200 calls that re-measure the training-speed issue in one session, from the
# repository root on the device machine (binary and wheels as batch.sh and anchor.sh take
# them). One call each, run back to back on one warm machine:
#
#   scripts/device/issue_calls.sh kernels   # ~400 s: the elementwise ops' full checks,
#                                           # single kernels beside Liger-Kernel, SwiGLU at
#                                           # 1000 a sample, FLCE, GEMMs (ISSUE_NCU=on: then
#                                           # ncu of both SwiGLU forward kernels)
#   scripts/device/issue_calls.sh steps     # ~250 s: whole steps at 1K-32K under the
#                                           # release pool around PyTorch + Liger-Kernel,
#                                           # then both checkpointed at 16K
#   scripts/device/issue_calls.sh swiglu    # ~170 s: the kernels call's SwiGLU part alone
#                                           # (SWIGLU_CHECK=on: then the gated units' full
#                                           # checks under the fastest geometry, ~20 s)
#
# The device tool returns only a few files of $OUT, so everything is also packed into
# $OUT/<call>.tgz (unpack it here; the stdout of the call names what ran when). Exits 3
# on a card that is not an H200 (ISSUE_GPU, a name pattern, overrides). ISSUE_CHECKS=off
# leaves out the kernels call's full checks.
set -u
call=${1:?usage: scripts/device/issue_calls.sh kernels|steps|swiglu}
export OUT=${OUT:-/tmp/liger-out}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in ${ISSUE_GPU:-*H200*}) ;; *) echo "not the card asked for: $name"; exit 3 ;; esac
T0=$(date +%s)
sec() { echo "== $* at $(( $(date +%s) - T0 )) s"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
. scripts/device/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
R=$OUT/$call
mkdir -p "$R"
pack() { tar -czf "$OUT/$call.tgz" -C "$R" . 2>/dev/null; }

# SwiGLU 8192x14336 bf16 at 1000 a sample, where the cost paid once a sample (the first
# launch, the closing synchronization: about 250 us on an H100 on both sides) is a
# quarter of a microsecond an iteration: Liger-Kernel's kernel, the default geometry, each
# of SWIGLU_GEOMETRIES (`liger bench --elementwise-geometry` values; by default 256 and
# 128 units a cube, the ones an H100 timed ahead of the default; the geometries with more
# loads in flight were 7-22% slower there: benches/kernels.md), Liger-Kernel's again.
swiglu_sweep() {
  lk() { # iterations
    python3 scripts/device/anchor_kernels.py --ops swiglu --providers liger-kernel --no-gemms \
      --matmul-size 0 --copy-gib 0 --iters "$1" --csv "$R/swiglu_sweep.csv" 2>&1 |
      grep -E "swiglu.*(forward|full) +ms" | awk -v n="$1" '{print "liger-kernel at " n ":", $0}'
  }
  ours() { # geometry, iterations
    local g=$1 n=$2 arg=""
    [ "$g" = default ] || arg="--elementwise-geometry $g"
    timeout 90 $BIN bench --device cuda --dtype bf16 --op swiglu --iters "$n" --hold-gib 64 $arg \
      --csv "$R/swiglu_sweep.csv" >"$R/swiglu_${g//[=,]/_}_$n.log" 2>&1
    local times
    times=$(grep -E "^  (forward|full)" "$R/swiglu_${g//[=,]/_}_$n.log" | awk '{printf "%s %s  ", $1, $2}')
    echo "$g at $n: $times"
    echo "$g $times" >>"$R/swiglu_forward.txt"
  }
  lk 1000
  for g in default ${SWIGLU_GEOMETRIES:-units=256 units=128}; do
    ours "$g" 1000
  done
  lk 1000
  # SWIGLU_CHECK=on: the full checks of the gated units (f32, bf16) under the geometry
  # whose forward was fastest, when that is not the default (checked by the kernels call).
  if [ "${SWIGLU_CHECK:-off}" = on ]; then
    local best
    best=$(awk '$2 == "forward" {print $3, $1}' "$R/swiglu_forward.txt" | sort -g | head -1 | cut -d' ' -f2)
    if [ -n "$best" ] && [ "$best" != default ]; then
      sec "full checks of the gated units under $best"
      OUT=$R DTYPES="f32 bf16" OPS="swiglu geglu" CHECK_JOBS=4 CHECK_TIMEOUT=150 CHECK_GEOMETRY=$best \
        bash scripts/device/batch.sh check-full
    fi
  fi
}

case $call in
  kernels)
    if [ "${ISSUE_CHECKS:-on}" = on ]; then
      sec "full checks of the elementwise ops (f32, bf16)"
      OUT=$R DTYPES="f32 bf16" OPS="swiglu geglu gelu sigmoid" CHECK_JOBS=8 CHECK_TIMEOUT=150 \
        bash scripts/device/batch.sh check-full
    fi
    sec "single kernels beside Liger-Kernel, 50 a sample"
    OUT=$R bash scripts/device/batch.sh kernels-vs-lk >/dev/null 2>&1; echo "exit $?"
    grep -E "^== |^  (forward|full)|(forward|full) +ms" "$R/kernels_vs_lk.log"
    pack
    sec "swiglu at 1000 a sample, Liger-Kernel around it"
    swiglu_sweep
    pack
    sec "fused linear cross entropy: weight-dtype gradient under the release pool, f32 under the default"
    for pool_grad in "release weight-dtype" "default f32"; do
      set -- $pool_grad
      timeout 120 $BIN bench --device cuda --dtype bf16 --op fused_linear_cross_entropy --shape 8192x4096x128256 \
        --warmup 2 --iters 3 --repeats 5 --memory-pool "$1" --head-grad "$2" --csv "$R/flce.csv" >"$R/flce_$1_$2.log" 2>&1
      echo "$1 pool, $2 gradient:"; grep -E "^  (forward|backward|full)" "$R/flce_$1_$2.log"
    done
    timeout 120 python3 scripts/device/anchor_kernels.py --ops fused_linear_cross_entropy --no-gemms --matmul-size 0 \
      --copy-gib 0 --warmup 2 --iters 3 --repeats 5 --csv "$R/flce.csv" 2>&1 | grep -E "fused_linear.* ms "
    sec "GEMMs under 1 ms at 50 a sample, torch's cuBLAS, the vocabulary products at 10"
    timeout 150 $BIN bench --device cuda --dtype bf16 --op matmul --warmup 10 --iters 50 --repeats 10 \
      --shape 4096x2048x2048,4096x2048x512,4096x2048x8192,4096x8192x2048,4096x1536x1536,4096x1536x256,4096x1536x8960,4096x8960x1536 \
      --csv "$R/matmul.csv" >"$R/matmul_small.log" 2>&1; echo "exit $?"
    timeout 90 python3 scripts/device/anchor_kernels.py --ops none --copy-gib 0 --matmul-size 8192 \
      --csv "$R/matmul.csv" >"$R/matmul_torch.log" 2>&1; echo "exit $?"
    timeout 150 $BIN bench --device cuda --dtype bf16 --op matmul --warmup 3 --iters 10 --repeats 5 \
      --shape 4096x2048x128256,128256x4096x2048,4096x1536x151936,151936x4096x1536 \
      --csv "$R/matmul.csv" >"$R/matmul_vocab.log" 2>&1; echo "exit $?"
    pack
    if [ "${ISSUE_NCU:-off}" = on ] && [ "$(elapsed)" -lt 480 ]; then
      sec "ncu: the SwiGLU forward kernels, liger-burn's then Liger-Kernel's"
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_issued.avg.pct_of_peak_sustained_active,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
      timeout 60 "$NCU" --clock-control none --kernel-name regex:elementwise --launch-skip 2 --launch-count 4 --csv \
        --metrics $M --log-file "$R/ncu_swiglu_liger.csv" \
        $BIN bench --device cuda --dtype bf16 --op swiglu --warmup 1 --iters 3 --repeats 1 >/dev/null 2>&1
      timeout 60 "$NCU" --clock-control none --kernel-name regex:swiglu_forward --launch-skip 2 --launch-count 4 --csv \
        --metrics $M --log-file "$R/ncu_swiglu_lk.csv" python3 scripts/device/anchor_kernels.py --ops swiglu \
        --providers liger-kernel --no-gemms --matmul-size 0 --copy-gib 0 --warmup 1 --iters 3 --repeats 1 >/dev/null 2>&1
      pack
    fi
    ;;
  steps)
    # liger-burn, PyTorch + Liger-Kernel, both checkpointed at 16K, then liger-burn again
    # (its spread between runs): what a cut-short call returns is the comparison first.
    steps_round() {
      for m in llama qwen; do
        sec "liger-burn $m, round $1"
        OUT=$R/round$1 E2E_MEMORY_POOL=release E2E_SEQ=1024,4096,16384,32768 E2E_MODES=on E2E_TIMEOUT=80 \
          E2E_BUDGET=200 E2E_WALL=220 bash scripts/device/batch.sh e2e-$m 2>&1 | grep -E "^(llama|qwen)[^:]* +[0-9]+ +1 +on"
      done
      pack
    }
    steps_round 1
    sec "PyTorch + Liger-Kernel"
    OUT=$R/anchor ANCHOR_SEQ=1024,4096,16384,32768 ANCHOR_TIMEOUT=80 ANCHOR_BUDGET=260 \
      ANCHOR_E2E_ARGS="--providers torch+liger-kernel" bash scripts/device/anchor.sh e2e 2>&1 | grep -E "torch\+liger-kernel +ok"
    pack
    sec "gradient checkpointing at 16K"
    for m in llama qwen; do
      OUT=$R/checkpointing E2E_MEMORY_POOL=release E2E_SEQ=16384 E2E_MODES=on E2E_TIMEOUT=80 E2E_CHECKPOINTING=on \
        E2E_BUDGET=100 E2E_WALL=120 bash scripts/device/batch.sh e2e-$m 2>&1 | grep -E "^(llama|qwen)[^:]* +[0-9]+ +1 +on"
    done
    OUT=$R/checkpointing ANCHOR_SEQ=16384 ANCHOR_TIMEOUT=60 ANCHOR_BUDGET=100 \
      ANCHOR_E2E_ARGS="--providers torch+liger-kernel --gradient-checkpointing" bash scripts/device/anchor.sh e2e 2>&1 |
      grep -E "torch\+liger-kernel +ok"
    pack
    steps_round 2
    ;;
  swiglu)
    sec "swiglu at 1000 a sample, Liger-Kernel around it"
    swiglu_sweep
    pack
    ;;
  *) echo "unknown call $call (kernels, steps, swiglu)"; exit 2 ;;
esac
sec "done"
