#!/usr/bin/env bash
# One device call: the CUDA conformance suite (f32, bf16; plane and shared reduction
# paths), then the CUDA benchmarks, then (optionally) the same kernels through Vulkan.
# Runs on the device machine from the repository root; expects the stripped release
# binary (built with `--features cuda`) at .gpu/liger and the commit hash in .gpu/commit.
# Writes logs and CSVs under $OUT.
#
#   usage: scripts/device/batch.sh [check] [check-full] [cuda-tests] [bench] [matmul]
#                                  [elementwise] [ce] [ce-hold] [flce] [vulkan] [converge]
#                                  [train] [e2e-llama] [e2e-qwen] [optimizer] [cache-out]
#                                  [attention-test] [attention] [sdpa] [post] [timeline]
#                                  [norm-sweep] [kernels-vs-lk] [vulkan-attention-test]
#                                  [vulkan-attention]
#
# vulkan-attention-test / vulkan-attention: the flash kernels' tensor-core test, and
# `liger bench --attention` (f16; ATTN_SHAPES, ATTN_PROVIDERS default flash), through Vulkan
# (the loader from .gl/*.deb).
# kernels-vs-lk: RMSNorm, LayerNorm, SwiGLU and cross entropy by liger-burn between two passes
# of Liger-Kernel's (scripts/device/anchor_kernels.py), one CSV.
# norm-sweep: the norms' backward kernels at the models' widths, over the backward geometry,
# beside Liger-Kernel's (see the step).
# timeline: where a training step's GPU idles (scripts/device/timeline.py, see there).
#
# check-full: the full conformance sweep of every op (f32 and bf16). cuda-tests: the
# liger_burn test suite on CUDA from .gpu/liger_burn_tests (TESTS filters it).
# matmul: the models' GEMMs through cuBLASLt (both ordering protocols) against Burn's.
#
# attention-test: the attention module of the liger_burn suite on CUDA (flash kernels' FMA
# and tensor-core variants in f32/f16/bf16, the Burn glue) from .gpu/liger_burn_tests.
# attention / sdpa: `liger bench --attention` and torch SDPA's anchor rows (same CSV schema;
# both append, so rounds may alternate: `attention sdpa attention sdpa`);
# ATTN_SHAPES (comma list BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM) and ATTN_PROVIDERS
# (flash,blockwise) narrow them to fit one device call; SDPA_BACKENDS (default flash) picks
# torch's kernels (flash, cudnn, efficient, default = torch's own choice: cuDNN on the H200).
#
# elementwise: after a change to the shared elementwise kernel, the quick CUDA checks of its
# ops (f32, bf16), the gated units' bench at the default --hold-gib and at 24, and ncu's
# time, registers and occupancy of one iteration's kernels.
#
# e2e-llama / e2e-qwen: `liger bench --e2e` for one model each (one device call each);
# E2E_SEQ (default 1024,2048,4096,8192,16384), E2E_TIMEOUT (per case, default 240 s),
# E2E_BATCH (default 1), E2E_LAYERS (default: the preset's), E2E_BUDGET (550 s) and
# E2E_WALL (585 s) override the flags; E2E_LIGER_ATTENTION=off gives the liger-on mode
# eager attention (the fused kernels alone); E2E_MEMORY_POOL=exact runs every case with
# `--memory-pool exact` (verify/src/pool.rs). e2e and train use $TRAIN_BIN (env.sh).
# E2E_MASTER_WEIGHTS=on gives the liger-on mode's fused AdamW f32 master weights;
# E2E_HEAD_GRAD=f32 sums the LM head's weight gradient in f32 (default weight-dtype).
# E2E_MODES (default off,on) picks the modes (on alone against the PyTorch anchor);
# E2E_CHECKPOINTING=on runs both with gradient checkpointing by decoder layer.
# E2E_HAND_OFF (runtime, kernels or operations) sets `--hand-off` (default: liger-burn's).
# E2E_ORDERING sets `--e2e-matmul-ordering` (default auto: the device's own).
#
# E2E_MODEL overrides the model (e.g. llama3-8b) and E2E_LORA_RANK gives LoRA steps
# (`--e2e-lora-rank`; the anchor's counterpart: ANCHOR_E2E_ARGS="--lora-rank N").
#
# post: `liger bench --op fused_linear_dpo,fused_linear_jsd` (bf16, stock compositions in the
# same process; POST_OPS narrows the ops); their PyTorch and Liger-Kernel rows come from
# scripts/device/anchor_post.py (`scripts/device/anchor.sh post`).
#
# optimizer: one AdamW step over Llama 3.2 1B's parameters (1.24 B, 146 tensors), bf16 then
# f32: liger-burn's fused AdamW (moments in the dtype; with f32 master weights) against
# Burn's AdamW, ms and GB/s of the minimal bytes against the measured copy.
set -u
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
steps=${*:-check bench}

# The Vulkan loader (the carried Debian packages in .gl/) pointed at the NVIDIA driver's ICD.
# .gl/ holds libvulkan1 and libglvnd's libraries (libglvnd0 libegl1 libgl1 libglx0 libgles2
# libopengl0: `apt-get download` them here): with libvulkan1 alone wgpu found no Vulkan
# adapter on the device machines.
vulkan_loader() {
  ls .gl/libglvnd0_*.deb >/dev/null 2>&1 || echo "warning: .gl/ has no libglvnd0: without libglvnd wgpu found no Vulkan adapter on the device machines" >&2
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  { ls -l /usr/local/nvidia/share/vulkan/icd.d/ /usr/share/vulkan/icd.d/ 2>&1; ldconfig -p | grep -iE "vulkan|GLX_nvidia"; } >"$OUT/vulkan_env.txt" 2>&1
}
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
      # The full sweep of every op in f32 and bf16 (DTYPES overrides), one op family per
      # process so a slow one does not hide the rest; CHECK_TIMEOUT per family (200 s);
      # OPS narrows the families (`fused_linear` is fused linear cross entropy and every
      # fused post-training loss; `lora_linear` both LoRA variants).
      # CHECK_JOBS > 1 runs that many (dtype, op) processes at once (the f64 references
      # are CPU work; the device machine has 16 cores), each logged apart, then joined.
      # CHECK_REDUCTION (auto, plane, shared, both) picks the kernels' reduction path;
      # CHECK_GEOMETRY an elementwise geometry (`--elementwise-geometry`); CHECK_BIN the
      # binary (default $BIN).
      # Parts go to a folder of their own: two check-full steps may run at once.
      parts=$(mktemp -d "$OUT/parts.XXXXXX")
      for dtype in ${DTYPES:-f32 bf16}; do
        for op in ${OPS:-rms_norm layer_norm softmax swiglu geglu gelu sigmoid rope cross_entropy fused_linear kl_div jsd tvd matmul_add lora_linear}; do
          echo "$dtype $op"
        done
      done | CHECK_OUT="$parts" CHECK_BIN="${CHECK_BIN:-$BIN}" CHECK_TIMEOUT="${CHECK_TIMEOUT:-200}" \
        CHECK_REDUCTION="${CHECK_REDUCTION:-auto}" CHECK_GEOMETRY="${CHECK_GEOMETRY:-}" \
        xargs -P "${CHECK_JOBS:-1}" -L 1 sh -c '
        log="$CHECK_OUT/check_full_$0_$1.log"
        echo "== $1" >"$log"
        timeout "$CHECK_TIMEOUT" "$CHECK_BIN" check --device cuda --dtype "$0" --op "$1" \
          --reduction "$CHECK_REDUCTION" ${CHECK_GEOMETRY:+--elementwise-geometry "$CHECK_GEOMETRY"} >>"$log" 2>&1
        echo "== $1 exit $?" >>"$log"
        echo "$0 $1: $(tail -n 3 "$log" | head -2 | tr "\n" " ")"
      ' || status=1
      for dtype in ${DTYPES:-f32 bf16}; do
        for op in ${OPS:-rms_norm layer_norm softmax swiglu geglu gelu sigmoid rope cross_entropy fused_linear kl_div jsd tvd matmul_add lora_linear}; do
          cat "$parts/check_full_${dtype}_$op.log" >>"$OUT/check_full_${dtype}.log" 2>/dev/null
        done
      done
      rm -rf "$parts"
      ;;
    cuda-tests)
      # The liger_burn suite on CUDA (matmul through cuBLASLt, AdamW, attention, every op on
      # both reduction paths): TESTS filters (default: all of it).
      # TESTS_SHARDS (default 8) splits the listed tests round-robin over that many
      # processes run at once (each with TESTS_THREADS threads, default 2), so the whole
      # suite fits one device call. Processes, not threads, set how many kernels compile at
      # once: CubeCL compiles a process's kernels on its one device thread, and the flash
      # attention tests are compile-bound.
      shards=${TESTS_SHARDS:-8}
      LIGER_TEST_DEVICE=cuda $TEST_BIN ${TESTS:-} --list 2>/dev/null | sed -n 's/: test$//p' >"$OUT/tests.list"
      for k in $(seq 0 $((shards - 1))); do
        awk -v n="$shards" -v k="$k" 'NR % n == k' "$OUT/tests.list" >"$OUT/tests.$k"
        LIGER_TEST_DEVICE=cuda timeout "${TESTS_TIMEOUT:-400}" $TEST_BIN --exact $(cat "$OUT/tests.$k") \
          --test-threads "${TESTS_THREADS:-2}" >"$OUT/cuda_tests.$k.log" 2>&1 &
      done
      wait || status=1
      for k in $(seq 0 $((shards - 1))); do cat "$OUT/cuda_tests.$k.log"; rm -f "$OUT/tests.$k" "$OUT/cuda_tests.$k.log"; done >"$OUT/cuda_tests.log"
      echo "listed $(wc -l <"$OUT/tests.list"); ok $(grep -c '^test .* ok$' "$OUT/cuda_tests.log")"
      grep -E "^test .*FAILED|^test result|panicked" "$OUT/cuda_tests.log" | head -40
      ;;
    bench)
      $BIN bench --device cuda --dtype bf16 --op rms_norm,layer_norm,softmax,log_softmax,fused_add_rms_norm,rope,swiglu,geglu \
        --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_cuda_bf16.log" 2>&1 || status=1
      tail -n 40 "$OUT/bench_cuda_bf16.log"
      ;;
    elementwise)
      for op in swiglu geglu gelu sigmoid; do
        for dtype in f32 bf16; do
          echo "== $op $dtype" >>"$OUT/check_elementwise.log"
          timeout 120 $BIN check --device cuda --dtype "$dtype" --reduction both --quick --op "$op" \
            >>"$OUT/check_elementwise.log" 2>&1 || status=1
          echo "$op $dtype: $(tail -n 1 "$OUT/check_elementwise.log")"
        done
      done
      # The bench as published (default hold), then with the host 24 GiB ahead (fewer
      # synchronizations in the timed loop), then ncu's view of one iteration's kernels.
      for hold in 4 24; do
        echo "== --hold-gib $hold" >>"$OUT/bench_elementwise.log"
        $BIN bench --device cuda --dtype bf16 --op swiglu,geglu --hold-gib $hold \
          $([ $hold = 24 ] && echo --iters 200 --repeats 5) \
          --csv "$OUT/bench_elementwise.csv" >>"$OUT/bench_elementwise.log" 2>&1 || status=1
        tail -n 12 "$OUT/bench_elementwise.log"
      done
      NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
      timeout 150 "$NCU" --clock-control none --kernel-name regex:elementwise --csv \
        --log-file "$OUT/ncu_elementwise.csv" \
        --metrics gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_issued.avg.pct_of_peak_sustained_active \
        $BIN bench --device cuda --dtype bf16 --op swiglu,geglu --warmup 1 --iters 1 --repeats 1 \
        >>"$OUT/bench_elementwise.log" 2>&1 || status=1
      ;;
    matmul)
      for dtype in bf16 f32; do
        $BIN bench --device cuda --dtype $dtype --op matmul --warmup 3 --iters 10 --repeats 5 \
          --csv "$OUT/bench_matmul.csv" >"$OUT/bench_matmul_$dtype.log" 2>&1 || status=1
        tail -n 40 "$OUT/bench_matmul_$dtype.log"
      done
      ;;
    ce)
      # Both shapes in one process: the second is where stock Burn ran out of memory.
      $BIN bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256,4096x151936 \
        --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_ce.log" 2>&1 || status=1
      tail -n 14 "$OUT/bench_ce.log"
      # The same without the target check (one device-to-host read per call): its cost.
      $BIN bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256 --check-targets off \
        --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_ce_unchecked.log" 2>&1 || status=1
      tail -n 8 "$OUT/bench_ce_unchecked.log"
      ;;
    ce-hold)
      # The 8192x128256 step with the host allowed to run ahead (24 GiB of pending
      # iterations: about five steps at this shape instead of one), checked and unchecked.
      for check in on off; do
        $BIN bench --device cuda --dtype bf16 --op cross_entropy --shape 8192x128256 --check-targets $check \
          --hold-gib 24 --csv "$OUT/bench_cuda_bf16.csv" >"$OUT/bench_ce_hold24_$check.log" 2>&1 || status=1
        tail -n 5 "$OUT/bench_ce_hold24_$check.log"
      done
      ;;
    flce)
      # The memory curve over N (few iterations: each step is tens to hundreds of ms).
      $BIN bench --device cuda --dtype bf16 --op fused_linear_cross_entropy --warmup 2 --iters 3 --repeats 5 \
        --shape 2048x4096x128256,4096x4096x128256,8192x4096x128256,16384x4096x128256,32768x4096x128256 \
        --csv "$OUT/bench_flce.csv" >"$OUT/bench_flce.log" 2>&1 || status=1
      tail -n 24 "$OUT/bench_flce.log"
      ;;
    converge)
      # Liger on vs off trained from the same start (mini Llama, Qwen2, Qwen3, Mistral;
      # 32 AdamW steps each), f32 then bf16 (CONVERGE_DTYPES, CONVERGE_MODELS override);
      # exit 1 when a model's runs disagree.
      # CONVERGE_SEEDS (default 42) runs each seed; CONVERGE_ARGS adds flags (e.g.
      # --control: a second stock run summing in another order, the noise floor). Without
      # CONVERGE_ARGS, bf16 runs get --gradient-check --control-jitter (the gradients
      # decide; parameters are bounded by stock's own drift from a start one rounding away).
      for dtype in ${CONVERGE_DTYPES:-f32 bf16}; do
        extra=${CONVERGE_ARGS-}
        if [ -z "${CONVERGE_ARGS+set}" ] && [ "$dtype" != f32 ]; then extra="--gradient-check --control-jitter"; fi
        for seed in ${CONVERGE_SEEDS:-42}; do
          log="$OUT/converge_cuda_$dtype$([ "$seed" = 42 ] || echo _seed$seed).log"
          timeout "${CONVERGE_TIMEOUT:-270}" $TRAIN_BIN converge --device cuda --dtype "$dtype" --seed "$seed" \
            --models "${CONVERGE_MODELS:-llama,qwen2,qwen3,mistral}" $extra >"$log" 2>&1 || status=1
          echo "== $dtype seed $seed"
          grep -E "^mini-|^AGREE|^DIFFER|^control|verdict|BEYOND|FAILED|converge:" "$log"
        done
      done
      ;;
    e2e-llama|e2e-qwen)
      # Whole training steps, liger on vs off, over sequence lengths; each case in its
      # own process. --e2e-budget stops starting cases in time for the table and summary
      # to print inside one device call; rows are appended to the CSV as cases finish.
      if [ "$step" = e2e-llama ]; then model=llama3.2-1b; else model=qwen2.5-1.5b; fi
      model=${E2E_MODEL:-$model}
      layers=${E2E_LAYERS:+--e2e-layers $E2E_LAYERS}
      lora=${E2E_LORA_RANK:+--e2e-lora-rank $E2E_LORA_RANK}
      attention=${E2E_LIGER_ATTENTION:-on}
      pool=${E2E_MEMORY_POOL:-default}
      log="$OUT/bench_e2e_$model${E2E_LORA_RANK:+_lora$E2E_LORA_RANK}$([ "$attention" = on ] || echo _eager)$([ "$pool" = default ] || echo "_$pool")$([ "${E2E_CHECKPOINTING:-off}" = off ] || echo _ckpt)$([ "${E2E_HEAD_GRAD:-weight-dtype}" = weight-dtype ] || echo "_head_$E2E_HEAD_GRAD")${E2E_HAND_OFF:+_$E2E_HAND_OFF}${E2E_ORDERING:+_$E2E_ORDERING}.log"
      timeout "${E2E_WALL:-585}" $TRAIN_BIN bench --e2e --device cuda --dtype bf16 --e2e-models "$model" \
        --e2e-seq "${E2E_SEQ:-1024,2048,4096,8192,16384,32768}" --e2e-batch "${E2E_BATCH:-1}" \
        --e2e-timeout "${E2E_TIMEOUT:-240}" --e2e-budget "${E2E_BUDGET:-550}" $layers $lora \
        --e2e-liger-attention "$attention" --memory-pool "$pool" \
        --e2e-master-weights "${E2E_MASTER_WEIGHTS:-off}" --e2e-modes "${E2E_MODES:-off,on}" \
        --e2e-head-grad "${E2E_HEAD_GRAD:-weight-dtype}" \
        --e2e-gradient-checkpointing "${E2E_CHECKPOINTING:-off}" \
        ${E2E_HAND_OFF:+--hand-off $E2E_HAND_OFF} ${E2E_ORDERING:+--e2e-matmul-ordering $E2E_ORDERING} --csv "$OUT/bench_e2e.csv" >"$log" 2>&1 || status=1
      tail -n 30 "$log"
      ;;
    post)
      # The fused post-training losses (DPO, distillation JSD) against their stock
      # compositions; scripts/device/anchor_post.py gives Liger-Kernel's and PyTorch's rows.
      # The stock compositions take 0.7-1.3 s an iteration: a few iterations, not the
      # default 10 + 10 x 50, fit the step's time.
      timeout 280 $BIN bench --device cuda --dtype bf16 --op "${POST_OPS:-fused_linear_dpo,fused_linear_jsd}" \
        --warmup 2 --iters 3 --repeats 5 \
        --csv "$OUT/bench_post.csv" >"$OUT/bench_post.log" 2>&1 || status=1
      tail -n 16 "$OUT/bench_post.log"
      ;;
    optimizer)
      for dtype in bf16 f32; do
        timeout 280 $BIN bench --optimizer-step --device cuda --dtype $dtype \
          --e2e-models llama3.2-1b --warmup 3 --iters 10 --repeats 10 \
          --csv "$OUT/bench_optimizer.csv" >"$OUT/bench_optimizer_$dtype.log" 2>&1 || status=1
        tail -n 12 "$OUT/bench_optimizer_$dtype.log"
      done
      ;;
    train)
      # The README's training job on CUDA (bundled data, small random model), packed rows
      # so every step has one shape; TRAIN_STEPS / TRAIN_TIMEOUT override.
      timeout "${TRAIN_TIMEOUT:-150}" $TRAIN_BIN train --device cuda --packing \
        --steps "${TRAIN_STEPS:-200}" --output "$OUT/train" >"$OUT/train_cuda.log" 2>&1 || status=1
      tail -n 8 "$OUT/train_cuda.log"
      ;;
    attention-test)
      LIGER_TEST_DEVICE=cuda timeout 560 $TEST_BIN attention >"$OUT/test_attention_cuda.log" 2>&1 || status=1
      grep -E "^test |test result|panicked" "$OUT/test_attention_cuda.log" | tail -n 20
      ;;
    attention)
      # Appends: a second `attention` step in one call (rounds around `sdpa`) adds to both.
      timeout 560 $BIN bench --attention --device cuda --dtype bf16 \
        ${ATTN_SHAPES:+--attention-shape "$ATTN_SHAPES"} ${ATTN_PROVIDERS:+--attention-provider "$ATTN_PROVIDERS"} \
        --csv "$OUT/bench_attention.csv" >/tmp/bench_attention.log 2>&1 || status=1
      cat /tmp/bench_attention.log >>"$OUT/bench_attention.log"
      tail -n 60 /tmp/bench_attention.log
      ;;
    sdpa)
      # Appends too; the header only into a new file.
      timeout 560 python3 scripts/device/sdpa_anchor.py $([ -s "$OUT/sdpa_anchor.csv" ] || echo --header) \
        ${ATTN_SHAPES:+--shape "$ATTN_SHAPES"} --backends "${SDPA_BACKENDS:-flash}" --commit "$LIGER_COMMIT" \
        >/tmp/sdpa_anchor.csv 2>>"$OUT/sdpa_anchor.log" || status=1
      cat /tmp/sdpa_anchor.csv >>"$OUT/sdpa_anchor.csv"
      grep -E ",(ms|TFLOP/s)," /tmp/sdpa_anchor.csv | cut -d, -f2-7 | head -n 60
      ;;
    norm-sweep)
      # The norms' backward geometry (LaunchConfig::backward_units_per_sm) at the models'
      # widths: `liger bench` at NORM_UNITS (default 256,512,1024 units per multiprocessor)
      # and Liger-Kernel's kernels on the same shapes (NORM_SHAPES), rows in one CSV.
      shapes=${NORM_SHAPES:-16384x1536,16384x2048,8192x4096}
      for u in $(echo "${NORM_UNITS:-256,512,1024}" | tr , ' '); do
        $BIN bench --device cuda --dtype bf16 --op rms_norm,layer_norm --shape "$shapes" \
          --backward-units-per-sm "$u" --csv "$OUT/norm_sweep.csv" >>"$OUT/norm_sweep.log" 2>&1 || status=1
      done
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      fi
      python3 scripts/device/anchor_kernels.py --ops rms_norm,layer_norm --providers liger-kernel \
        --shapes "$(echo "$shapes" | tr , '\n' | sed 's/^/rms_norm=/' | paste -sd,),$(echo "$shapes" | tr , '\n' | sed 's/^/layer_norm=/' | paste -sd,)" \
        --no-gemms --copy-gib 0 --matmul-size 0 --csv "$OUT/norm_sweep.csv" >>"$OUT/norm_sweep.log" 2>&1 || status=1
      grep -E "rms_norm|layer_norm" "$OUT/norm_sweep.log" | grep -iE "backward|full" | head -40
      ;;
    kernels-vs-lk)
      # Single kernels beside Liger-Kernel's in one call, same shapes and protocol (bf16;
      # RMSNorm and LayerNorm 8192x4096, SwiGLU 8192x14336, cross entropy 8192x128256):
      # Liger-Kernel's, then liger-burn's (`liger bench`, stock Burn beside), then
      # Liger-Kernel's again, so drift between the passes shows. Rows in one CSV.
      # As the anchor synchronizes once per sample of --iters iterations, liger bench
      # holds up to KVL_HOLD_GIB (default 64) of outputs, so that it synchronizes once
      # per sample where they fit; KVL_HAND_OFF (a list of `--hand-off` values, default
      # liger-burn's own) runs liger bench once per value, and KVL_POOLS (a list of
      # `--memory-pool` values, default `default`) once per pool. KVL_ITERS (default 50) sets
      # the iterations of a sample on both sides.
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      fi
      ops=${KVL_OPS:-rms_norm,layer_norm,swiglu,cross_entropy}
      passes="first"
      for pool in ${KVL_POOLS:-default}; do
        for h in ${KVL_HAND_OFF:-default}; do passes="$passes ours-$pool-$h"; done
      done
      for pass in $passes second; do
        echo "== $pass" >>"$OUT/kernels_vs_lk.log"
        if [ "${pass#ours-}" != "$pass" ]; then
          rest=${pass#ours-}
          pool=${rest%%-*}
          h=${rest#*-}
          $BIN bench --device cuda --dtype bf16 --op $ops --csv "$OUT/kernels_vs_lk.csv" \
            --hold-gib "${KVL_HOLD_GIB:-64}" --memory-pool "$pool" --iters "${KVL_ITERS:-50}" \
            $([ "$h" = default ] || echo --hand-off "$h") \
            >>"$OUT/kernels_vs_lk.log" 2>&1 || status=1
        else
          python3 scripts/device/anchor_kernels.py --ops $ops --providers liger-kernel --no-gemms \
            --matmul-size 0 --iters "${KVL_ITERS:-50}" $([ $pass = second ] && echo --copy-gib 0) \
            --csv "$OUT/kernels_vs_lk.csv" >>"$OUT/kernels_vs_lk.log" 2>&1 || status=1
        fi
      done
      grep -E "forward|full|copy" "$OUT/kernels_vs_lk.log" | head -60
      ;;
    timeline)
      # scripts/device/timeline.py: the kernel timeline of one timed e2e step (liger on,
      # release pool, two warm-up steps as the e2e bench: after one, the profiled step is
      # the first with AdamW's moments and waited about 80 ms on the host, likely compiling
      # that kernel variant) of each of TIMELINE_MODELS (default
      # llama3.2-1b,qwen2.5-1.5b) at TIMELINE_SEQ tokens (default 16384), from
      # .gpu/libliger_timeline.so (`cargo build --release -p liger-timeline --features cuda`).
      for m in $(echo "${TIMELINE_MODELS:-llama3.2-1b,qwen2.5-1.5b}" | tr , ' '); do
        seq=${TIMELINE_SEQ:-16384}
        timeout "${TIMELINE_TIMEOUT:-240}" python3 scripts/device/timeline.py "$TIMELINE_LIB" \
          "$OUT/timeline_${m}_${seq}" -- --e2e-case "$m:$seq:1:on" --device cuda --dtype bf16 \
          --e2e-warmup 2 --e2e-steps 1 --e2e-profile-range on --memory-pool release \
          >"$OUT/timeline_${m}_${seq}.log" 2>&1 || status=1
        head -n 50 "$OUT/timeline_${m}_${seq}.txt" 2>/dev/null || tail -n 20 "$OUT/timeline_${m}_${seq}.log"
      done
      ;;
    cache-out)
      # CubeCL's compiled-kernel and autotune caches, to carry into a later call.
      tar -czf "$OUT/cubecl-cache.tgz" -C .gpu "cubecl-cache-$LIGER_COMMIT" && ls -l "$OUT/cubecl-cache.tgz"
      ;;
    vulkan)
      vulkan_loader
      $BIN check --device vulkan --dtype f32 --quick >"$OUT/check_vulkan_f32.log" 2>&1 || status=1
      tail -n 3 "$OUT/check_vulkan_f32.log"
      $BIN bench --device vulkan --dtype f16 --op all --csv "$OUT/bench_vulkan_f16.csv" >"$OUT/bench_vulkan_f16.log" 2>&1 || status=1
      tail -n 30 "$OUT/bench_vulkan_f16.log"
      ;;
    vulkan-attention-test)
      # The flash kernels' tensor-core (cmma) test against f64 through the H200's Vulkan driver.
      vulkan_loader
      LIGER_TEST_DEVICE=vulkan timeout "${TESTS_TIMEOUT:-300}" $TEST_BIN flash_tensor_core \
        --nocapture >"$OUT/test_attention_vulkan.log" 2>&1 || status=1
      grep -E "^test |test result|panicked|cases run|^note" "$OUT/test_attention_vulkan.log" | tail -n 20
      ;;
    vulkan-attention)
      # `liger bench --attention` through Vulkan in f16 (ATTN_SHAPES, ATTN_PROVIDERS).
      vulkan_loader
      timeout "${ATTN_TIMEOUT:-300}" $BIN -v bench --attention --device vulkan --dtype f16 \
        ${ATTN_SHAPES:+--attention-shape "$ATTN_SHAPES"} --attention-provider "${ATTN_PROVIDERS:-flash}" \
        --csv "$OUT/bench_attention_vulkan.csv" >"$OUT/bench_attention_vulkan.log" 2>&1 || status=1
      tail -n 30 "$OUT/bench_attention_vulkan.log"
      ;;
  esac
done
exit $status
