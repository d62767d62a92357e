# Sourced by the device-side scripts: the output folder, the binary, and the CSV columns
# that name the GPU and the commit. The binary travels gzipped (the device tool carries
# 64 MiB at most): unpack it when only the .gz is there.
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
BIN=.gpu/liger
if [ ! -x "$BIN" ] && [ -f "$BIN.gz" ]; then gunzip -f "$BIN.gz" && chmod +x "$BIN"; fi
export LIGER_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
export LIGER_GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
