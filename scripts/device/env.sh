# Sourced by the device-side scripts: the output folder, the binary, and the CSV columns
# that name the GPU and the commit. The binary travels gzipped (the device tool carries
# 64 MiB at most): unpack it when only the .gz is there.
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
# Two builds of one commit: .gpu/liger (`--features cuda,autotune`: kernel checks and
# benchmarks, stock Burn as a default dependency runs it) and, when present,
# .gpu/liger-train (`--features cuda`: Burn autotune off, for whole training steps,
# where autotune compiles every matmul candidate of every new shape first).
BIN=.gpu/liger
TRAIN_BIN=.gpu/liger-train
for b in "$BIN" "$TRAIN_BIN"; do
  if [ ! -x "$b" ] && [ -f "$b.gz" ]; then gunzip -f "$b.gz" && chmod +x "$b"; fi
done
[ -x "$TRAIN_BIN" ] || TRAIN_BIN=$BIN
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
