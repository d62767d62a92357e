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
BIN=$PWD/.gpu/liger
TRAIN_BIN=$PWD/.gpu/liger-train
TEST_BIN=$PWD/.gpu/liger_burn_tests
# .gpu/libliger_timeline.so, when present: `liger bench` as a shared library (verify/timeline)
# for scripts/device/timeline.py.
TIMELINE_LIB=$PWD/.gpu/libliger_timeline.so
for b in "$BIN" "$TRAIN_BIN" "$TEST_BIN" "$TIMELINE_LIB"; do
  if [ ! -x "$b" ] && [ -f "$b.xz" ]; then xz -dkf "$b.xz" && chmod +x "$b"; fi
  if [ ! -x "$b" ] && [ -f "$b.gz" ]; then gunzip -f "$b.gz" && chmod +x "$b"; fi
done
[ -x "$TRAIN_BIN" ] || TRAIN_BIN=$BIN
# A call that carries only the training build runs every step on it.
[ -x "$BIN" ] || BIN=$TRAIN_BIN
export LIGER_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
# CubeCL keeps compiled PTX and autotune results on disk when cubecl.toml asks for it:
# the e2e cases (one process each) and later steps then reuse the first one's kernels.
# Its key is a kernel's name and comptime configuration, not its source, so builds of two
# commits must not share a cache (the second would launch the first's PTX): the cache is
# .gpu/cubecl-cache-<commit>, and another commit's binary runs through `in_cache COMMIT
# CMD...`, from a folder with its own cubecl.toml. .gpu/cubecl-cache-<commit> may come
# back from an earlier call (carry it) to skip compilation.
cubecl_toml() { # folder, cache
  mkdir -p "$2"
  cat >"$1/cubecl.toml" <<TOML
[compilation]
cache = { file = "$2" }
[autotune]
cache = { file = "$2" }
TOML
}
cubecl_toml "$PWD" "$PWD/.gpu/cubecl-cache-$LIGER_COMMIT"
in_cache() { # commit, command...
  local dir="$PWD/.gpu/run-$1"
  mkdir -p "$dir"
  cubecl_toml "$dir" "$PWD/.gpu/cubecl-cache-$1"
  (cd "$dir" && "${@:2}")
}
export LIGER_GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
