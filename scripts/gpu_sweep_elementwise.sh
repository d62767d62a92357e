#!/usr/bin/env bash
# Launch-geometry sweep of the elementwise kernels (SwiGLU, GeGLU, GELU, sigmoid) on the
# device: the liger rows of `liger bench` per setting of the LIGER_EW_* knobs of
# liger-cubecl-kernels (units per cube, vectors per unit, elements per vector, persistent-grid
# cap in cubes per multiprocessor; unset = the defaults). The host runs ahead by up to 24 GiB
# of outputs (`--hold-gib 24`): fewer synchronizations inside the timed loop, whose cost is
# the same for every setting (and for stock Burn). Used to pick the defaults in
# liger-cubecl-kernels/src/elementwise.rs. Expects the release binary at .gpu/liger.
set -u
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
BIN=.gpu/liger
b() { $BIN bench --device cuda --dtype bf16 --warmup 5 --iters 100 --repeats 5 --hold-gib 24 --op swiglu,geglu "$@" 2>&1; }
show() { grep -E "^[a-z_]+ [0-9]+x[0-9]+|^  (forward|backward|full)|^copy"; }
{
echo "== default (as built)"
b --shape 8192x14336 | show
# Units per cube x vectors per unit, both together (the first sweep varied one at a time).
# VECS: elements per vector at most (LIGER_EW_MAX_VECTOR; 0 = the default).
for w in ${VECS:-0}; do
  for u in ${UNITS:-64 128 256 512}; do
    for v in ${VPUS:-1 2 4}; do
      echo "== LIGER_EW_MAX_VECTOR=$w LIGER_EW_UNITS=$u LIGER_EW_VPU=$v"
      LIGER_EW_MAX_VECTOR=$w LIGER_EW_UNITS=$u LIGER_EW_VPU=$v b | show
    done
  done
done
} | tee "$OUT/sweep_elementwise.log"
