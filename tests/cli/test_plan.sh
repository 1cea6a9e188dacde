#!/usr/bin/env bash
# test_plan.sh: `mtrain plan` and the memory check of `mtrain train`. On the
# CPU backend the planned peak host memory is within 15% of the peak RSS that
# `mtrain train` measures (getrusage, in its run summary) for seven runs of
# different shape on one rank and one thread (one with Qwen's 151936-token
# vocabulary, 256 tokens per step under a loss chunk of 1024), within 10% for
# two on two threads (Qwen's vocabulary at hidden 96; hidden 512), and for two
# on two ranks (cp 2; dp 2 with ZeRO-1); the cluster run files pass the plan on their GPUs; a run
# that cannot fit is refused with one line; bad plan options get one line; --kernels adds up to the plan;
# sparse attention's budget line (planned density, the estimation's share of the attention's work);
# metrics.jsonl carries MFU and RSS.
#   MTRAIN=path/to/mtrain bash tests/cli/test_plan.sh   (default build/mtrain)
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
# The memory runs measure the product's own peak RSS: always the plain build
# (under make test SANITIZE=1, $MTRAIN carries ASan's shadow memory and
# quarantine, which no plan of mtrain's allocations can predict).
PLAIN_MTRAIN=build/mtrain
. tests/lib/lib.sh

base="configs/tiny-cpu.yaml train.steps=2 train.warmup_steps=0 checkpoint.resume=never parallel.threads=1"
mid="model.hidden_size=512 model.intermediate_size=1376 model.num_layers=4 model.num_heads=8 model.num_kv_heads=2"
runs=(
  "saved $mid train.seq_len=512 model.max_position_embeddings=512"
  "checkpointed $mid train.seq_len=512 model.max_position_embeddings=512 train.recompute=full"
  "vocab model.vocab_size=32000 model.hidden_size=256 model.intermediate_size=688 model.num_heads=4 model.tie_word_embeddings=false train.loss_chunk=256"
  "long model.hidden_size=256 model.intermediate_size=688 model.num_layers=4 model.num_heads=4 train.seq_len=2048 model.max_position_embeddings=2048"
  "sparse model.hidden_size=256 model.intermediate_size=688 model.num_layers=4 model.num_heads=4 train.seq_len=2048 model.max_position_embeddings=2048 attention.type=sparse attention.block_size=64"
  "zero $mid train.seq_len=256 parallel.zero=1 train.micro_batches=2"
  "qwen_vocab model.vocab_size=151936"
  # two threads (OpenBLAS threaded; the LM head's weight gradient was once a logits chunk over the plan), within 10%
  "threads2_qwen_vocab model.vocab_size=151936 model.hidden_size=96 model.intermediate_size=256 parallel.threads=2"
  "threads2_mid $mid train.seq_len=512 model.max_position_embeddings=512 parallel.threads=2"
)
# two ranks (peak RSS of rank 0): the ring of cp 2, and ZeRO-1 over dp 2
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism=none
runs+=(
  "np2_cp2 $mid train.seq_len=512 model.max_position_embeddings=512 parallel.cp=2"
  "np2_dp2_zero $mid train.seq_len=512 model.max_position_embeddings=512 parallel.dp=2 parallel.zero=1"
)
for run in "${runs[@]}"; do
  name=${run%% *}
  launch=()
  case $name in np2_*) launch=(mpirun -np 2 --oversubscribe --bind-to none) ;; esac
  # shellcheck disable=SC2086
  "${launch[@]}" "$PLAIN_MTRAIN" train $base checkpoint.dir="$tmp/ck_$name" log.dir="$tmp/log_$name" ${run#* } \
    >"$tmp/$name.out" 2>&1
  summary=$(grep '^run summary' "$tmp/$name.out")
  measured=$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' <<<"$summary")
  planned=$(sed -n 's/.*(planned \([0-9.]*\)).*/\1/p' <<<"$summary")
  tolerance=0.15
  case $name in threads2_*) tolerance=0.10 ;; esac
  expect_within "plan_rss_$name" "$planned" "$measured" $tolerance "$tmp/$name.out" || continue
  # plan prints the same total as the train check
  # shellcheck disable=SC2086
  total=$("$PLAIN_MTRAIN" plan $base checkpoint.dir="$tmp/ck_$name" log.dir="$tmp/log_$name" ${run#* } |
          awk '$1 == "total" { print $2 }')
  expect "plan_total_$name" "awk -v t=$total -v p=$planned 'BEGIN { d = t * 1024 - p; exit !(d < 1 && d > -1) }'"
done
expect plan_metrics_fields "grep -q '\"mfu\": [0-9.]*, \"rss_mib\": [0-9.]*' '$tmp/log_saved/metrics.jsonl'"
expect plan_step_line "grep -Eq 'MFU [0-9.]+% \| RSS [0-9]+ MiB' '$tmp/saved.out'"
# MFU is never above 100%: a stated CPU peak (1 MFLOP/s) below what a step achieves is raised to it, with a note;
# every step line and metrics line of that run and of a measured-peak run at most 100%
# shellcheck disable=SC2086
"$PLAIN_MTRAIN" train $base checkpoint.dir="$tmp/ck_peak" log.dir="$tmp/log_peak" hardware.peak_tflops=0.000001 \
  >"$tmp/peak.out" 2>&1
mfu_at_most_100() {
  sed -n 's/.* | MFU \([0-9.]*\)% | .*/\1/p' "$1" | awk '{ n++; if ($1 > 100) bad = 1 } END { exit bad || !n }' &&
    grep -o '"mfu": [0-9.e+-]*' "$2" | awk '{ if ($2 > 1) bad = 1 } END { exit bad }'
}
expect plan_mfu_stated_peak_raised "grep -q '^note: step 1 ran at [0-9.]* GFLOP/s, above the peak of 0.0 GFLOP/s (hardware.peak_tflops): MFU from now on against the fastest step.s rate' '$tmp/peak.out' && mfu_at_most_100 '$tmp/peak.out' '$tmp/log_peak/metrics.jsonl'"
expect plan_mfu_measured_peak "mfu_at_most_100 '$tmp/saved.out' '$tmp/log_saved/metrics.jsonl'"

# the cluster run files plan as they are (no weights: train.init_from's folder is not here) and exit 0
for pair in qwen2.5-3b-512k-32xa100:a100-80g qwen2.5-0.5b-128k-8xa100:a100-80g qwen2.5-7b-512k-32xh100:h100; do
  cfg=configs/${pair%%:*}.yaml gpu=${pair##*:}
  "$MTRAIN" plan "$cfg" >"$tmp/plan.out" 2>&1
  rc=$?
  expect "plan_fits_${pair%%:*}" "[ $rc -eq 0 ] && grep -q '^fits: yes' '$tmp/plan.out' && grep -q '^predicted step' '$tmp/plan.out' && grep -q '^plan: CUDA backend as designed .* on $gpu:' '$tmp/plan.out' && grep -q '^architecture: model.preset' '$tmp/plan.out'"
  "$MTRAIN" config "$cfg" train.init_from=none >/dev/null 2>&1
  rc=$?
  expect "plan_config_parses_${pair%%:*}" "[ $rc -eq 0 ]"
done
# train still needs the folder's config.json
"$MTRAIN" train configs/qwen2.5-0.5b-128k-8xa100.yaml >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plan_train_needs_folder "[ $rc -ne 0 ] && grep -q 'train.init_from: models/Qwen2.5-0.5B: no config.json there' '$tmp/err'"
# tokens/s per GPU and for the job: the job's figure is dp x cp times the GPU's
tps=$(sed -n 's/.* | \([0-9]*\) tokens\/s per GPU, \([0-9]*\) tokens\/s for the job (32 GPUs) .*/\1 \2/p' "$tmp/plan.out")
expect plan_tokens_labelled "[ -n '$tps' ] && awk -v a='${tps% *}' -v b='${tps#* }' 'BEGIN { d = b / (32 * a) - 1; exit !(d < 0.001 && d > -0.001) }'"
# model.preset: the published Qwen2.5 base models' parameter counts (their model cards), from a run file with
# only the preset; keys beside the preset win
for pair in 0.5b:494032768 1.5b:1543714304 3b:3085938688 7b:7615616512 14b:14770033664 32b:32763876352 72b:72706203648; do
  printf 'model:\n  preset: qwen2.5-%s\n' "${pair%%:*}" >"$tmp/preset.yaml"
  "$MTRAIN" plan "$tmp/preset.yaml" --gpu h100 >"$tmp/out" 2>&1
  expect "plan_preset_${pair%%:*}" "grep -q '^model: ${pair##*:} parameters' '$tmp/out'"
done
"$MTRAIN" plan "$tmp/preset.yaml" --gpu h100 model.num_layers=2 >"$tmp/out" 2>&1
expect plan_preset_key_wins "grep -q '^model: [0-9]* parameters (2 layers, hidden 8192' '$tmp/out'"
# the plan's step in every view: --kernels and --ring name the terms they leave out and give the step
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml >"$tmp/default.out"
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml --kernels >"$tmp/kernels.out"
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml --ring >"$tmp/ring.out"
step=$(sed -n 's/^predicted step: \([0-9.]*\) s .*/\1/p' "$tmp/default.out")
expect plan_kernels_step "[ -n '$step' ] && grep -q 'the plan.s step on a100-80g adds their launches, the host synchronisations, the ring.s exposed transfers, the sparse plan.s combine and the gradient reduction: .* = $step s' '$tmp/kernels.out'"
expect plan_ring_step "[ -n '$step' ] && grep -q 'leaves out the GEMMs, the other kernels, the sparse plan.s combine and the gradient reduction; the plan.s step on a100-80g is $step s' '$tmp/ring.out'"
# --ring explains ring_send selected sending as much as full at the top_p caps (every block offset hit)
expect plan_ring_selected_explained "grep -q '^sparse selected sends 100.0% of full.s K/V bytes: .* hit 100.0% of the 4096 key-block offsets (with this many slash lines' '$tmp/ring.out'"
# 512K tokens: Qwen2.5-0.5B on one A100-80GB fits dense (the MLP in chunks of train.mlp_chunk tokens; with the
# MLP whole it does not) and sparse at the top_p caps (one index at its bound, not one per layer); Qwen2.5-3B on
# cp 8 fits dense and sparse
one_gpu="configs/qwen2.5-0.5b-128k-8xa100.yaml parallel.cp=1 train.seq_len=524288 model.max_position_embeddings=524288"
# shellcheck disable=SC2086
"$MTRAIN" plan $one_gpu attention.type=dense >"$tmp/out" 2>&1
rc=$?
expect plan_05b_512k_dense_fits "[ $rc -eq 0 ] && grep -q '^fits: yes' '$tmp/out'"
# shellcheck disable=SC2086
"$MTRAIN" plan $one_gpu attention.type=dense train.mlp_chunk=0 >"$tmp/out" 2>&1
rc=$?
expect plan_05b_512k_mlp_whole_no_fit "[ $rc -eq 3 ] && grep -q '^fits: NO' '$tmp/out'"
# shellcheck disable=SC2086
"$MTRAIN" plan $one_gpu attention.type=sparse >"$tmp/out" 2>&1
rc=$?
expect plan_05b_512k_sparse_fits "[ $rc -eq 0 ] && grep -q '^fits: yes' '$tmp/out'"
# train.recompute: each policy's memory and step; auto takes the first of none, selective, full that fits
# (at 512K tokens on one H200 none does not, selective does), never one that does not; memory falls and the
# step grows from none to full; when none fits, the plan says so and plans the smallest.
"$MTRAIN" plan configs/qwen2.5-0.5b-512k-1gpu.yaml train.recompute=auto >"$tmp/auto.out" 2>&1
rc=$?
expect plan_recompute_auto_first_fitting "[ $rc -eq 0 ] && grep -q '^  recompute none .*, does not fit$' '$tmp/auto.out' && grep -q '^  recompute selective .*, fits  <- auto picks this$' '$tmp/auto.out' && grep -q '| recompute selective (auto)$' '$tmp/auto.out'"
order=$(sed -n 's/^  recompute [a-z]* *\([0-9.]*\) GiB total, step \([0-9.]*\) s.*/\1 \2/p' "$tmp/auto.out" | tr '\n' ' ')
expect plan_recompute_order "[ \$(echo '$order' | wc -w) -eq 6 ] && echo '$order' | awk '{ exit !(\$1 > \$3 && \$3 > \$5 && \$2 < \$4 && \$4 < \$6) }'"
"$MTRAIN" plan configs/qwen2.5-7b-512k-32xh100.yaml parallel.cp=1 train.recompute=auto >"$tmp/auto.out" 2>&1
rc=$?
expect plan_recompute_auto_none_fits "[ $rc -eq 3 ] && [ \$(grep -c '^  recompute .*, does not fit' '$tmp/auto.out') -eq 3 ] && grep -q '^  recompute full .*  <- auto: none fits, the smallest planned$' '$tmp/auto.out' && grep -q '^fits: NO' '$tmp/auto.out'"

# The sparse budget line: a fixed budget of 64 + 64 lines, sink 64, local 64 at 2048 tokens plans density
# (64 + 64 + 2 x 64 + 2 x 64) / 2048 = 0.1875; the estimation (4 last_q N FLOPs per head and layer; the
# selection and index none) against the attention (2 N^2 density x (1 forward + 2.5 backward)):
# 2 x 64 / (2 x 64 + 2048 x 0.1875 x 3.5) = 8.7%; on a GPU also the share of the kernels' derived time; top_p
# names its caps as an upper bound.
fixed="attention.type=sparse attention.budget=fixed attention.vertical=64 attention.slash=64 attention.sink=64
       attention.local=64 attention.last_q=64 train.seq_len=2048 model.max_position_embeddings=2048"
"$MTRAIN" plan configs/tiny-cpu.yaml $fixed >"$tmp/out" 2>&1
expect plan_sparse_budget_fixed "grep -q '^sparse attention at 2048 tokens: planned density 0.1875 (budget fixed: 64 vertical + 64 slash lines per head; sink 64, local 64) | pattern estimation (last_q 64 queries .*), selection and index 8.7% of the attention.s FLOPs | ' '$tmp/out'"
"$MTRAIN" plan configs/tiny-cpu.yaml $fixed --gpu h100 >"$tmp/out" 2>&1
expect plan_sparse_budget_gpu_time "grep -q '^sparse attention at 2048 tokens: .* 8.7% of the attention.s FLOPs, [0-9.]*% of its derived time' '$tmp/out'"
# The sparse pattern per layer on an H200 (Qwen2.5-0.5B, density 3.8%): the estimation's counted work and the
# selection's and index's bytes at most 15% of the pattern + the sparse attention forward + backward at 64K
# and 128K tokens; on a ring each rank estimates against its own keys: cp 2 half the estimation FLOPs of cp 1.
for n in 65536 131072; do
  "$MTRAIN" plan configs/qwen2.5-0.5b-512k-1gpu.yaml train.seq_len=$n --density 0.038 --kernels >"$tmp/out" 2>&1
  share=$(sed -n 's/^sparse pattern per layer.s forward + backward on h200: .* the pattern \([0-9.]*\)% of the pattern .*/\1/p' "$tmp/out")
  expect "plan_sparse_pattern_share_$n" "[ -n '$share' ] && awk 'BEGIN { exit !($share <= 15) }'"
done
est_gflop() {
  "$MTRAIN" plan configs/qwen2.5-0.5b-128k-8xa100.yaml --kernels train.init_from=none parallel.dp=1 "$@" 2>&1 |
    awk -F'|' '$2 == " sparse estimation " { print $4 }'
}
cp1=$(est_gflop parallel.cp=1) cp2=$(est_gflop parallel.cp=2)
expect plan_sparse_estimation_per_rank "[ -n '$cp1' ] && [ -n '$cp2' ] && awk 'BEGIN { r = $cp1 / $cp2; exit !(r > 1.99 && r < 2.01) }'"
"$MTRAIN" plan configs/tiny-cpu.yaml attention.type=sparse attention.top_p=0.8 >"$tmp/out" 2>&1
expect plan_sparse_budget_topp "grep -q '^sparse attention at 256 tokens: planned density 1.0000 (budget topp 0.8: at most the caps. 4096 vertical + 4096 slash lines per head, an upper bound' '$tmp/out'"
"$MTRAIN" plan configs/tiny-cpu.yaml >"$tmp/out" 2>&1
expect plan_sparse_budget_dense_none "! grep -q '^sparse attention' '$tmp/out'"
for att in dense sparse; do
  "$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml parallel.cp=8 parallel.cp_inner=8 attention.type=$att \
    >"$tmp/out" 2>&1
  rc=$?
  expect "plan_3b_512k_cp8_${att}_fits" "[ $rc -eq 0 ] && grep -q '^fits: yes' '$tmp/out'"
done
# the sparse plan's combine over cp: a reduce-scatter and an all-gather of [2, Hq, N] fp32 per layer on the
# cp group's link (hardware.network_gbs=10 on the 3B run: 2 * 2*16*524288*4 * 31/32 / 10e9 * 36 layers
# = 0.468 s); none dense, none on one rank
combine() { "$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml train.init_from=none hardware.network_gbs=10 "$@" 2>&1 |
            sed -n 's/^predicted step: .*sparse plan combine \([0-9.]*\),.*/\1/p'; }
c_sparse=$(combine) c_dense=$(combine attention.type=dense) c_one=$(combine parallel.cp=1 parallel.dp=32)
expect "plan_sparse_combine: $c_sparse s sparse (0.468 expected), $c_dense dense, $c_one on cp 1" \
  "[ '$c_sparse' = 0.468 ] && [ '$c_dense' = 0.000 ] && [ '$c_one' = 0.000 ]"
# the 3B run without checkpointing or ZeRO on 40 GB A100s does not fit: exit 3, the advice names what to change
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml --gpu a100-40g \
  train.recompute=none parallel.zero=0 >"$tmp/nofit.out" 2>&1
rc=$?
expect plan_nofit_advice "[ $rc -eq 3 ] && grep -q '^fits: NO' '$tmp/nofit.out' && grep -q '^to fit: train.recompute=full' '$tmp/nofit.out'"
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml --gpu a100-40g --ring \
  train.recompute=none parallel.zero=0 >"$tmp/nofit.out" 2>&1
rc=$?
expect plan_nofit_ring_exit "[ $rc -eq 3 ] && grep -q '^fits: NO' '$tmp/nofit.out'"

"$MTRAIN" plan configs/tiny-cpu.yaml --gpu v100 >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plan_bad_gpu "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q 'hardware.gpu.*expected one of none, a100-40g' '$tmp/err'"
"$MTRAIN" plan configs/tiny-cpu.yaml hardware.hbm_gib=10 >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plan_partial_gpu "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q 'needs every figure' '$tmp/err'"
# a profile's figure replaced by the section: 10 GiB of HBM, 92% usable
"$MTRAIN" plan configs/tiny-cpu.yaml hardware.gpu=h100 hardware.hbm_gib=10 >"$tmp/out" 2>&1
expect plan_hardware_figure "grep -q '^fits: yes (.* of 9.20 GiB usable' '$tmp/out'"
# CPU MFU against a configured peak: 1 GFLOP/s makes the predicted step FLOPs / 1e9 seconds
"$MTRAIN" plan configs/tiny-cpu.yaml hardware.peak_tflops=0.001 >"$tmp/out" 2>&1
flops=$(sed -n 's/^FLOPs per step per rank: \([0-9.e+]*\) dense.*/\1/p' "$tmp/out")
step=$(sed -n 's/^predicted step: \([0-9.]*\) s .*of hardware.peak_tflops$/\1/p' "$tmp/out")
expect plan_cpu_configured_peak "[ -n '$step' ] && awk -v f=$flops -v s=$step 'BEGIN { d = f / 1e9 - s; exit !(d < 0.002 && d > -0.002) }'"
"$MTRAIN" plan configs/tiny-cpu.yaml --density 2 >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plan_bad_density "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ]"
# --kernels: the rows' FLOPs (kernel_rows, GEMM by GEMM) add up to the plan's model FLOPs (plan_flops, 6 per
# weight per token + 3.5 x the attention forward) for dense attention without recomputation, and the step's
# bounds are the sums of the rows' on both GPUs; with checkpointing the layers' forward rows double.
kernels() {
  "$MTRAIN" plan configs/qwen2.5-0.5b-128k-8xa100.yaml --kernels train.init_from=none parallel.cp=1 parallel.zero=0 \
    train.seq_len=32768 attention.type=dense "$@" 2>&1
}
sums='/^FLOPs per step/ { split($0, w, " "); model = w[6] }
  /^[|] [*][*]step/ { step = $4; a = $7; h = $8; gsub(/[*]/, "", a); gsub(/[*]/, "", h); done = 1 }
  !done && /^[|] [a-zA-Z]/ && $4 ~ /[0-9]/ { flops += $4 }
  !done && /^[|] [a-zA-Z]/ && $7 ~ /[0-9]/ { ta += $7; th += $8 }
  END { printf "%g %g %g %g %g %g %g\n", model / 1e9, flops, step, ta, a, th, h }'
kernels train.recompute=none | awk -F'|' "$sums" >"$tmp/sums"
read -r model flops step ta a th h <"$tmp/sums"
expect plan_kernels_flops "awk 'BEGIN { r = $flops / $model; s = $step / $flops; exit !(r > 0.999 && r < 1.001 && s > 0.999 && s < 1.001) }'"
expect plan_kernels_bounds "awk 'BEGIN { exit !($a > 0 && ($ta - $a) ^ 2 < 0.01 && $h > 0 && ($th - $h) ^ 2 < 0.01 && $h < $a) }'"
kernels train.recompute=full >"$tmp/ckpt.out"
expect plan_kernels_recompute "grep -q '^| GEMMs of the layers, forward | 168 |' '$tmp/ckpt.out' && kernels train.recompute=none | grep -q '^| GEMMs of the layers, forward | 96 |'"

# the time model: the attention kernels' counted work per call (Qwen2.5-3B's 16 q heads x 128 at 32K tokens,
# dense, one GPU: 16 heads x 65792 tile pairs x 1024 mma.sync = 1.078e+09 forward), each predicted by the cost
# model (attention/kernels/kernel_cost.c) from its phases: the largest of mma.sync, shared memory, exp2 and atomics, plus
# (1 - 0.05)^blocks per SM of the others, plus the barriers; and the step table's attention rows those
# predictions times the calls
"$MTRAIN" plan configs/qwen2.5-3b-512k-32xa100.yaml --gpu h100 --kernels parallel.cp=1 parallel.dp=1 \
  parallel.zero=0 train.seq_len=32768 attention.type=dense >"$tmp/derive.out" 2>&1
expect plan_time_counts "grep -q '^| attention forward | 1.078e+09 | ' '$tmp/derive.out'"
expect plan_time_cost_model "awk -F'|' '/^[|] attention (forward|backward) [|]/ && NF > 14 { m = \$9; s = 0; for (i = 9; i <= 12; i++) { s += \$i; if (\$i + 0 > m + 0) m = \$i } d = \$14 - (m + 0.95 ^ \$17 * (s - m) + \$13); if (d * d > 1e-4 || \$13 <= 0) bad = 1; n++ } END { exit !(n == 2 && !bad) }' '$tmp/derive.out'"
# the last column: shared-memory bytes (ldmatrix + cp.async) per mma.sync at head dim 128, 192 forward and 243
# backward (the figures gpu_test_counts holds equal to the sim's counts)
expect plan_time_shared_per_mma "awk -F'|' '/^[|] attention (forward|backward) [|]/ && NF > 14 { r = (\$4 + \$5) * 1e9 / \$3 / \$18; if ((r - 1) ^ 2 > 1e-5) bad = 1; s = s \$18 } END { gsub(/ /, \"\", s); exit !(s == \"192243\" && !bad) }' '$tmp/derive.out'"
expect plan_time_rows_from_counts "awk -F'|' '/^[|] attention (forward|backward) [|]/ && NF < 14 { ms[\$2] = \$8; calls[\$2] = \$3 } /^[|] attention (forward|backward) [|]/ && NF > 14 { b[\$2] = \$14 } END { n = 0; for (k in b) { r = ms[k] / (calls[k] * b[k]); if (r > 0.999 && r < 1.001) n++ } exit !(n == 2) }' '$tmp/derive.out'"

# a run far larger than this machine is refused before it allocates, with the breakdown
"$MTRAIN" train configs/tiny-cpu.yaml model.hidden_size=16384 model.intermediate_size=65536 model.num_layers=16 \
  model.num_heads=128 model.num_kv_heads=8 checkpoint.dir="$tmp/ck_big" log.dir="$tmp/log_big" >"$tmp/out" 2>"$tmp/err"
rc=$?
expect train_refuses_unfit "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q 'does not fit: .*parameters (fp32) .*MemAvailable.*train.memory_check=false' '$tmp/err'"
# mtrain plot: loss, throughput and density PNGs of a sparse run with validation
"$MTRAIN" train configs/tiny-cpu.yaml train.steps=8 train.warmup_steps=0 attention.type=sparse log.attention_every=2 \
  log.val_every=4 checkpoint.resume=never checkpoint.dir="$tmp/ck_plot" log.dir="$tmp/log_plot" >/dev/null 2>&1
"$MTRAIN" plot "$tmp/log_plot" >"$tmp/plot.out" 2>"$tmp/plot.err"
rc=$?
expect plot_runs "[ $rc -eq 0 ] && grep -q '^plot: 8 steps' '$tmp/plot.out'"
for png in loss throughput density; do
  f=$tmp/log_plot/$png.png
  expect "plot_png_$png" "[ -f '$f' ] && [ \"\$(head -c 8 '$f' | od -An -tx1 | tr -d ' \n')\" = 89504e470d0a1a0a ] && [ \$(stat -c %s '$f') -gt 10000 ]"
done
expect plot_pngs_differ "! cmp -s '$tmp/log_plot/loss.png' '$tmp/log_plot/throughput.png'"
expect plot_no_tmp_left "[ -z \"\$(ls '$tmp/log_plot' | grep tmp)\" ]"
"$MTRAIN" plot "$tmp/nowhere" >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plot_missing_dir "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q 'metrics.jsonl' '$tmp/err'"
mkdir -p "$tmp/bad"
printf '{"step": 1, "loss": 2}\nnot json\n' >"$tmp/bad/metrics.jsonl"
"$MTRAIN" plot "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
rc=$?
expect plot_bad_line "[ $rc -ne 0 ] && [ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q 'metrics.jsonl:2: not a metrics line' '$tmp/err'"
# scripts/sbatch_example.sh outside Slurm, srun replaced by a shim that runs
# the command: plans, trains, and on SIGUSR1 (Slurm's warning signal, sent to
# the batch shell) the run stops after a step with a checkpoint and exits 0.
mkdir -p "$tmp/bin"
printf '#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n' >"$tmp/bin/srun"
chmod +x "$tmp/bin/srun"
PATH=$tmp/bin:$PATH bash scripts/sbatch_example.sh configs/tiny-cpu.yaml train.steps=100000 checkpoint.dir="$tmp/ck_sb" \
  log.dir="$tmp/log_sb" checkpoint.resume=never >"$tmp/sb.out" 2>&1 &
sb=$!
for _ in $(seq 3000); do grep -q '^step' "$tmp/sb.out" && break; kill -0 "$sb" 2>/dev/null || break; sleep 0.2; done  # a hang guard: 10 min
kill -USR1 "$sb"
wait "$sb"
rc=$?
expect sbatch_usr1_checkpoint "[ $rc -eq 0 ] && grep -q '^fits: yes' '$tmp/sb.out' && grep -q '^stopped by SIGUSR1 after step' '$tmp/sb.out' && [ -e '$tmp/ck_sb/latest' ]"
PATH=$tmp/bin:$PATH bash scripts/sbatch_example.sh configs/tiny-cpu.yaml model.hidden_size=16384 \
  model.intermediate_size=65536 model.num_layers=16 model.num_heads=128 model.num_kv_heads=8 \
  checkpoint.dir="$tmp/ck_sb2" log.dir="$tmp/log_sb2" >"$tmp/sb2.out" 2>&1
rc=$?
expect sbatch_refuses_unfit "[ $rc -eq 1 ] && grep -q 'does not fit (plan above); not starting' '$tmp/sb2.out' && [ ! -d '$tmp/ck_sb2' ]"
[ "$failures" -eq 0 ]
