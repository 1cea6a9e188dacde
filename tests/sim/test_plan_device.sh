#!/usr/bin/env bash
# test_plan_device.sh: the GPU memory plan against the device memory the CPU
# execution model of CUDA measures. `mtrain train` on the CUDA backend under
# the sim (build/sim/mtrain) ends with "device memory: peak X MiB measured by
# the sim ... | planned Y MiB": the peak of cudaMalloc's live bytes plus the
# stream-ordered pool at its high-water mark, against the plan's total less
# the CUDA context and NCCL's buffers (no allocation of the process holds
# them). The plan must be within 10% of the measure on runs of one step:
# dense and sparse, cp 1, 2 and 4, train.recompute none, selective and full,
# ZeRO-1 over dp 2, and documents (doc_mask); and sparse attention with a
# top_p budget at 512 and 1024 tokens, whose growth between the two (the
# index at its bound, sparse_index_bound: rows and key blocks both grow
# with the length) must match the plan's growth within 10%, as must what
# recompute selective saves against none. Then the MLP in
# token chunks on the CUDA backend against the MLP whole.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh
sim_setup plan_device

sparse="attention.type=sparse attention.block_size=64 attention.budget=fixed attention.vertical=4 attention.slash=1
        attention.sink=4 attention.local=1"
small="model.vocab_size=4096 model.hidden_size=256 model.intermediate_size=1024 model.num_layers=2 model.num_heads=4
       model.num_kv_heads=2 model.head_dim=64 train.loss_chunk=256"
topp="attention.type=sparse attention.block_size=64 attention.budget=topp attention.top_p=0.9
      attention.max_vertical=256 attention.max_slash=256"
runs=(
  "dense 1 train.seq_len=256 train.recompute=none"
  "selective 1 train.seq_len=256 train.recompute=selective"
  "checkpointed 1 train.seq_len=256 train.recompute=full"
  "sparse 1 train.seq_len=1024 $sparse"
  "cp2 2 train.seq_len=512 parallel.cp=2"
  "sparse_cp4_zero 4 train.seq_len=1024 parallel.cp=4 parallel.zero=1 $sparse"
  "documents_dp2_zero 2 train.seq_len=256 parallel.dp=2 parallel.zero=1 data.doc_mask=true"
  "topp_512 1 train.seq_len=512 $topp"
  "topp_1024 1 train.seq_len=1024 $topp"
)
declare -A measured_of planned_of
for run in "${runs[@]}"; do
  read -r name np settings <<<"$run"
  # shellcheck disable=SC2086
  CUDASIM_DEVICES=$np timeout 600 mpirun --oversubscribe --bind-to none -np "$np" build/sim/mtrain train \
    configs/tiny-cpu.yaml $small $settings train.backend=cuda train.steps=1 train.warmup_steps=0 \
    checkpoint.resume=never checkpoint.dir="$tmp/ck_$name" log.dir="$tmp/log_$name" >"$tmp/$name.out" 2>&1
  line=$(grep '^device memory: peak' "$tmp/$name.out")
  measured=$(sed -n 's/.*peak \([0-9.]*\) MiB measured.*/\1/p' <<<"$line")
  planned=$(sed -n 's/.* | planned \([0-9.]*\) MiB.*/\1/p' <<<"$line")
  expect_within "plan_device_$name" "$planned" "$measured" 0.10 "$tmp/$name.out"
  measured_of[$name]=$measured planned_of[$name]=$planned
done
grown_measured=$(awk -v a="${measured_of[topp_512]:-0}" -v b="${measured_of[topp_1024]:-0}" 'BEGIN { print b - a }')
grown_planned=$(awk -v a="${planned_of[topp_512]:-0}" -v b="${planned_of[topp_1024]:-0}" 'BEGIN { print b - a }')
expect_within plan_device_topp_growth "$grown_planned" "$grown_measured" 0.10 "$tmp/topp_1024.out"
# what recompute selective saves against none, planned and measured
saved_measured=$(awk -v a="${measured_of[dense]:-0}" -v b="${measured_of[selective]:-0}" 'BEGIN { print a - b }')
saved_planned=$(awk -v a="${planned_of[dense]:-0}" -v b="${planned_of[selective]:-0}" 'BEGIN { print a - b }')
expect_within plan_device_selective_saving "$saved_planned" "$saved_measured" 0.10 "$tmp/selective.out"

# The MLP in token chunks on the CUDA backend (train.mlp_chunk), 3 steps of 128 tokens with activation
# checkpointing: one chunk covering the sequence (the chunked code path) gives the bits of the MLP whole,
# chunks of 32 tokens the same up to rounding.
RUN=$SIM_RUN
for chunk in 0 128 32; do sim_train "mlp_$chunk" 1 1 train.recompute=full train.mlp_chunk=$chunk; done
read -r loss weights <<<"$(runs_differ mlp_0 mlp_128)"
expect plan_device_mlp_one_chunk_bitwise "[ '$loss' = 0.000e+00 ] && [ '$weights' = 0.000e+00 ]"
read -r loss weights <<<"$(runs_differ mlp_0 mlp_32)"
expect plan_device_mlp_chunks "below $loss 1e-4 && below $weights 1e-3"
[ "$failures" -eq 0 ]
