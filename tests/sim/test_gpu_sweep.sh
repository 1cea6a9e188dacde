#!/usr/bin/env bash
# test_gpu_sweep.sh: build/sim/tests/gpu_sweep_attention at its small shapes.
# Its table holds every variant of the registry (attention/kernels/
# attn_variants.cu) on every shape of its kind, each within the bf16 bound
# of its reference; the dense kernels' shared memory and blocks per SM as the
# sim's cudaFuncGetAttributes and occupancy API give them (the forward at
# head dim 128: (128 + 4 x 64) rows x 136 bf16 + 64 x 2 positions = 105472
# bytes, one block on the sim's A100; at head dim 64 two); the
# micro-benchmarks' lines. With --broken a copy of each reference run at
# twice the scale fails its check and the sweep exits 1.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

sweep=build/sim/tests/gpu_sweep_attention
if [ ! -x $sweep ]; then
  bad "gpu_sweep_build" "$sweep missing (make build-sim)"
  exit 1
fi
export OMP_NUM_THREADS=1
$sweep small --repeats 1 --out "$tmp/sweep.tsv" >"$tmp/out.txt" 2>&1
rc=$?
expect "sweep_runs: exit 0 ($rc; $(tail -n 1 "$tmp/out.txt"))" '[ $rc -eq 0 ] && grep -q "^20 variant runs: 20 passed, 0 failed" "$tmp/out.txt"'
rows() { awk -F'\t' '$1 !~ /^#/ && $1 != "variant"' "$tmp/sweep.tsv"; }
missing=
for name in $(grep -o '{"[a-z0-9_]*"' attention/kernels/attn_variants.cu | tr -d '{"'); do
  case $name in
    dense_*) want=4 ;;
    *) want=1 ;;
  esac
  [ "$(rows | awk -F'\t' -v n="$name" '$1 == n' | wc -l)" -eq $want ] || missing="$missing $name"
done
expect "sweep_every_variant: each dense variant on its 4 shapes, each sparse one on its own (missing:${missing:- none})" \
  '[ -z "$missing" ] && [ "$(rows | wc -l)" -eq 20 ]'
expect "sweep_within_bound: every error <= 1e-2, status ok, TFLOP/s and time positive" \
  '[ "$(rows | awk -F"\t" "\$9 + 0 <= 1e-2 && \$15 == \"ok\" && \$7 > 0 && \$8 > 0" | wc -l)" -eq 20 ]'
expect "sweep_resources: dense forward d=128 105472 bytes, 1 block per SM; d=64 56320 bytes, 2" \
  'rows | awk -F"\t" "\$1 ~ /^dense_fwd_d128/ { a += (\$12 == 105472 && \$14 == 1) } \$1 ~ /^dense_fwd_d64/ { b += (\$12 == 56320 && \$14 == 2) }
                      END { exit !(a == 4 && b == 4) }"'
expect "sweep_micro: device, arch, clock and the micro-benchmarks' lines" \
  'grep -q "^# arch sm_80$" "$tmp/sweep.tsv" && grep -q "cudasim" "$tmp/sweep.tsv" &&
   [ "$(grep -cE "^# (sm_clock_mhz|mma_sync_tflops|mma_sync_per_sm_clock|ldmatrix_bytes_per_sm_clock|exp2_per_sm_clock|scalar_atomics_per_s|vector_atomics_floats_per_s) [0-9]" "$tmp/sweep.tsv")" -eq 7 ]'

$sweep small --repeats 1 --broken --out "$tmp/broken.tsv" >"$tmp/broken.txt" 2>&1
rc=$?
expect "sweep_broken_caught: exit 1, 20 broken copies (one per reference and shape) over the bound and FAIL, the 20 real rows ok ($rc)" \
  '[ $rc -eq 1 ] && [ "$(awk -F"\t" "\$1 ~ /^broken_/ && \$9 + 0 > 1e-2 && \$15 == \"FAIL\"" "$tmp/broken.tsv" | wc -l)" -eq 20 ] &&
   [ "$(awk -F"\t" "\$1 !~ /^(#|variant|broken_)/ && \$15 == \"ok\"" "$tmp/broken.tsv" | wc -l)" -eq 20 ] &&
   [ "$(grep -c "^FAIL sweep broken_" "$tmp/broken.txt")" -eq 20 ]'
$sweep small --repeats 0 >"$tmp/bad.txt" 2>&1
rc=$?
expect "sweep_bad_repeats: one line, exit non-zero ($rc)" '[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/bad.txt")" -eq 1 ]'
exit $((failures > 0))
