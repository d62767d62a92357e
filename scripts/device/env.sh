# Sourced by the device-side scripts: the output folder, the binaries, and the CSV columns
# that name the GPU and the commit. Binaries travel compressed (the device tool carries
# 64 MiB at most): each is unpacked when only its .xz or .gz is there.
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
# Two builds of one commit: .gpu/liger (`--features cuda,autotune`: kernel checks and
# benchmarks, stock Burn as a default dependency runs it) and, when present,
# .gpu/liger-train (`--features cuda`: Burn autotune off, for whole training steps,
# where autotune compiles every matmul candidate of every new shape first).
# .gpu/liger_burn_tests, when present, is the `liger_burn` test binary built with
# `--features cuda` (`cargo test --release -p liger-tests --features cuda --no-run`).
BIN=.gpu/liger
TRAIN_BIN=.gpu/liger-train
TEST_BIN=.gpu/liger_burn_tests
# .gpu/libliger_timeline.so, when present: `liger bench` as a shared library (verify/timeline)
# for scripts/device/timeline.py.
TIMELINE_LIB=.gpu/libliger_timeline.so
for b in "$BIN" "$TRAIN_BIN" "$TEST_BIN" "$TIMELINE_LIB"; do
  if [ ! -x "$b" ] && [ -f "$b.xz" ]; then xz -dkf "$b.xz" && chmod +x "$b"; fi
  if [ ! -x "$b" ] && [ -f "$b.gz" ]; then gunzip -f "$b.gz" && chmod +x "$b"; fi
done
[ -x "$TRAIN_BIN" ] || TRAIN_BIN=$BIN
# A call that carries only the training build runs every step on it.
[ -x "$BIN" ] || BIN=$TRAIN_BIN
# CubeCL keeps compiled PTX and autotune results on disk when cubecl.toml asks for it:
# the e2e cases (one process each) and later steps then reuse the first one's kernels.
# .gpu/cubecl-cache may come back from an earlier call (carry it) to skip compilation.
mkdir -p .gpu/cubecl-cache
cat >cubecl.toml <<TOML
[compilation]
cache = { file = "$PWD/.gpu/cubecl-cache" }
[autotune]
cache = { file = "$PWD/.gpu/cubecl-cache" }
TOML
export LIGER_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
export LIGER_GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
