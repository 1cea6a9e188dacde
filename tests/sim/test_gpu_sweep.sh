#!/usr/bin/env bash
# test_gpu_sweep.sh: build/sim/tests/gpu_sweep_attention at its small shapes.
# On the sim's A100 its table holds every variant of the registry
# (attention/kernels/attn_variants.cu) but the Hopper ones (named as not
# run) on every shape of its kind, each within the bf16 bound of its
# reference; on its H100 (CUDASIM_SM=90, head dim 64) the Hopper forwards
# too (dense on its 4 shapes, sparse on its own); the dense kernels' shared memory and blocks per SM as the sim's
# cudaFuncGetAttributes and occupancy API give them (the forward at
# head dim 128: (128 + 2 x 64) rows x 128 bf16, 64 + 128 positions and 128
# lse = 67584 bytes, two blocks on the sim's A100; at head dim 64 34816
# bytes, four: the sim reads no registers, which hold a GPU at two); the
# micro-benchmarks' lines. With --broken (head dim 64) a copy of each
# reference run at twice the scale fails its check and the sweep exits 1. scripts/sweep_table.sh
# refuses the sim's table and turns the same table, relabelled as a GPU's
# (sm_90), into attn_choice.h rows that compile: one per kind and head dim.
# A training run on the sim's CUDA backend (an A100, sm_80, no sweep row)
# says once that the cost model chose its kernels, naming them.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

sweep=${SWEEP:-build/sim/tests/gpu_sweep_attention}
if [ ! -x $sweep ]; then
  bad "gpu_sweep_build" "$sweep missing (make build-sim)"
  exit 1
fi
export OMP_NUM_THREADS=1
$sweep small --repeats 1 --out "$tmp/sweep.tsv" >"$tmp/out.txt" 2>&1
rc=$?
expect "sweep_runs: exit 0 ($rc; $(tail -n 1 "$tmp/out.txt"))" '[ $rc -eq 0 ] && grep -q "^20 variant runs: 20 passed, 0 failed" "$tmp/out.txt"'
rows() { awk -F'\t' '$1 !~ /^#/ && $1 != "variant"' "$tmp/sweep.tsv"; }
missing= hopper=
for name in $(grep -o '{"[a-z0-9_]*"' attention/kernels/attn_variants.cu | tr -d '{"'); do
  case $name in
    *_sm90_*) want=0 hopper="$hopper $name" ;;
    dense_*) want=4 ;;
    *) want=1 ;;
  esac
  [ "$(rows | awk -F'\t' -v n="$name" '$1 == n' | wc -l)" -eq $want ] || missing="$missing $name"
done
expect "sweep_every_variant: each dense mma.sync variant on its 4 shapes, each sparse one on its own (missing:${missing:- none})" \
  '[ -z "$missing" ] && [ "$(rows | wc -l)" -eq 20 ]'
expect "sweep_hopper_not_run: the table names the Hopper variants as not run on sm_80 ($(grep '^# not run' "$tmp/sweep.tsv"))" \
  '[ -n "$hopper" ] && grep -qx "# not run on sm_80:$hopper" "$tmp/sweep.tsv"'
CUDASIM_SM=90 $sweep small --repeats 1 --head-dim 64 --out "$tmp/h100.tsv" >"$tmp/h100.txt" 2>&1
rc=$?
expect "sweep_hopper_runs: on the sim's H100 the Hopper forwards at head dim 64 (dense on its 4 shapes, sparse on its own) within the bound, nothing left out ($rc; $(tail -n 1 "$tmp/h100.txt"))" \
  '[ $rc -eq 0 ] && grep -qx "# not run on sm_90:" "$tmp/h100.tsv" &&
   [ "$(awk -F"\t" "\$1 ~ /^dense_fwd_sm90_d64_/ && \$9 + 0 <= 1e-2 && \$15 == \"ok\"" "$tmp/h100.tsv" | wc -l)" -eq 4 ] &&
   [ "$(awk -F"\t" "\$1 ~ /^sparse_fwd_sm90_d64_/ && \$9 + 0 <= 1e-2 && \$15 == \"ok\"" "$tmp/h100.tsv" | wc -l)" -eq 1 ]'
expect "sweep_within_bound: every error <= 1e-2, status ok, TFLOP/s and time positive" \
  '[ "$(rows | awk -F"\t" "\$9 + 0 <= 1e-2 && \$15 == \"ok\" && \$7 > 0 && \$8 > 0" | wc -l)" -eq 20 ]'
expect "sweep_resources: dense forward d=128 67584 bytes, 2 blocks per SM; d=64 34816 bytes, 4" \
  'rows | awk -F"\t" "\$1 ~ /^dense_fwd_d128/ { a += (\$12 == 67584 && \$14 == 2) } \$1 ~ /^dense_fwd_d64/ { b += (\$12 == 34816 && \$14 == 4) }
                      END { exit !(a == 4 && b == 4) }"'
expect "sweep_micro: device, arch, clock and the micro-benchmarks' lines" \
  'grep -q "^# arch sm_80$" "$tmp/sweep.tsv" && grep -q "cudasim" "$tmp/sweep.tsv" &&
   [ "$(grep -cE "^# (sm_clock_mhz|mma_sync_tflops|mma_sync_per_sm_clock|ldmatrix_bytes_per_sm_clock|exp2_per_sm_clock|scalar_atomics_per_s|vector_atomics_floats_per_s) [0-9]" "$tmp/sweep.tsv")" -eq 7 ]'

$sweep small --repeats 1 --head-dim 64 --broken --out "$tmp/broken.tsv" >"$tmp/broken.txt" 2>&1
rc=$?
expect "sweep_broken_caught: exit 1, 10 broken copies (one per reference and shape) over the bound and FAIL, the 10 real rows ok ($rc)" \
  '[ $rc -eq 1 ] && [ "$(awk -F"\t" "\$1 ~ /^broken_/ && \$9 + 0 > 1e-2 && \$15 == \"FAIL\"" "$tmp/broken.tsv" | wc -l)" -eq 10 ] &&
   [ "$(awk -F"\t" "\$1 !~ /^(#|variant|broken_)/ && \$15 == \"ok\"" "$tmp/broken.tsv" | wc -l)" -eq 10 ] &&
   [ "$(grep -c "^FAIL sweep broken_" "$tmp/broken.txt")" -eq 10 ]'
cp attention/kernels/attn_choice.h "$tmp/choice.h"
bash scripts/sweep_table.sh "$tmp/sweep.tsv" "$tmp/choice.h" >"$tmp/refused.txt" 2>&1
rc=$?
expect "sweep_table_refuses_sim: one line, exit 2 ($rc)" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/refused.txt")" -eq 1 ] && grep -q "from the sim" "$tmp/refused.txt" && cmp -s attention/kernels/attn_choice.h "$tmp/choice.h"'
sed 's/^# gpu_sweep_attention: .*/# gpu_sweep_attention: NVIDIA TEST, sm_90, 132 SMs/; s/^# arch sm_80$/# arch sm_90/' "$tmp/sweep.tsv" >"$tmp/gpu.tsv"
bash scripts/sweep_table.sh "$tmp/gpu.tsv" "$tmp/choice.h" >"$tmp/table.txt" 2>&1
rc=$?
printf '%s\n' 'typedef enum { ATTN_DENSE_FORWARD, ATTN_DENSE_BACKWARD, ATTN_SPARSE_FORWARD, ATTN_SPARSE_BACKWARD } Kind;' \
  '#include "choice.h"' 'static const struct { int arch, d; Kind k; const char *v; double t; const char *s; } rows[] = {ATTN_CHOICE_ROWS{0}};' \
  'int main(void) { return sizeof rows / sizeof rows[0] == 9 && rows[0].arch == 90 ? 0 : 1; }' >"$tmp/rows.c"
expect "sweep_table_rows: 8 rows for sm_90 (a dense and a sparse kind each way, two head dims) that compile ($rc)" \
  '[ $rc -eq 0 ] && [ "$(grep -c "^    {90, " "$tmp/choice.h")" -eq 8 ] && grep -q "\"NVIDIA TEST 20[0-9-]*\"}, " "$tmp/choice.h" &&
   grep -q "{90, 128, ATTN_DENSE_FORWARD, \"dense_fwd_d128_q128_k64_w4_s2\"" "$tmp/choice.h" &&
   cc -I"$tmp" "$tmp/rows.c" -o "$tmp/rows" && "$tmp/rows"'
if [ -x build/sim/mtrain ]; then
  build/sim/mtrain train configs/tiny-cpu.yaml train.backend=cuda data.train=synthetic train.steps=2 train.seq_len=64 \
    model.max_position_embeddings=64 model.vocab_size=258 model.hidden_size=128 model.intermediate_size=256 \
    model.num_heads=2 model.num_kv_heads=1 model.head_dim=64 log.dir="$tmp/log" checkpoint.dir="$tmp/ck" \
    checkpoint.final=false >"$tmp/train.txt" 2>&1
  rc=$?
  expect "sweep_choice_said_once: the run names the cost model's kernels once, no sweep for sm_80 ($rc)" \
    '[ $rc -eq 0 ] && [ "$(grep -c "^attention kernels " "$tmp/train.txt")" -eq 1 ] &&
     grep -q "^attention kernels on sm_80, head_dim 64: dense_fwd_d64_q128_k64_w4_s2 (cost model: [0-9]* TFLOP/s), dense_bwd_d64_q128_k128_w8_s2 (cost model: [0-9]* TFLOP/s); no sweep for sm_80 yet$" "$tmp/train.txt"'
else
  bad "sweep_choice_said_once" "build/sim/mtrain missing (make build-sim)"
fi
$sweep small --repeats 0 >"$tmp/bad.txt" 2>&1
rc=$?
expect "sweep_bad_repeats: one line, exit non-zero ($rc)" '[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/bad.txt")" -eq 1 ]'
exit $((failures > 0))
