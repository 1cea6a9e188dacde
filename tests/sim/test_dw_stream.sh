#!/usr/bin/env bash
# test_dw_stream.sh: train.dw_stream on the CUDA backend under the sim
# (build/sim/mtrain, docs/SIM.md: streams run in a seeded interleaving, so a
# missing event between the compute stream and the dW stream reads or
# overwrites a buffer at the wrong time under some seed):
#   bitwise   2 steps with the dW GEMMs on the second stream end with the
#             bits of one stream (losses and weights), under CUDASIM_SEED 1,
#             2 and 3 (each against one stream under the same seed: the
#             same blocks' order), the MLP and the LM head in chunks of 64 of
#             the 128 tokens and train.recompute full (every join of model.c
#             runs; without the one after each MLP chunk, or each LM-head
#             chunk, or without the fork's event, some seed differs);
#   launches  the same device launches and host synchronisations per step as
#             one stream (the sim counts kernels, cuBLASLt matmuls and
#             memsets; event records and waits are no launches);
#   plan      the memory plan counts the second cuBLASLt workspace (32 MiB)
#             with the key on, not with it off or auto.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup dw_stream
RUN="$SIM_RUN train.steps=2 checkpoint.resume=never train.recompute=full train.mlp_chunk=64 train.loss_chunk=64"

for seed in 1 2 3; do
  for dw in off on; do
    CUDASIM_SEED=$seed MTRAIN_SYNC_REPORT=1 sim_train "${dw}_$seed" 1 1 train.dw_stream=$dw
    echo $? >"$tmp/${dw}_$seed.rc"
  done
  read -r loss weights < <(runs_differ "on_$seed" "off_$seed" 2)
  expect "dw_stream_bitwise_seed$seed: exit $(cat "$tmp/on_$seed.rc"), loss $loss, weights $weights from one stream" \
    "[ $(cat "$tmp/on_$seed.rc") -eq 0 ] && [ $(cat "$tmp/off_$seed.rc") -eq 0 ] && below '$loss' 0 && below '$weights' 0"
done
report() { grep -E '^(device launches|host syncs) per step' "$tmp/$1.out" | tail -n 2; }
expect "dw_stream_launches: $(report on_1 | tr '\n' ' ')the same as one stream" \
  "[ -n \"\$(report on_1)\" ] && [ \"\$(report on_1)\" = \"\$(report off_1)\" ]"

workspace() { build/sim/mtrain plan configs/tiny-cpu.yaml train.dw_stream="$1" --gpu h100 | grep -c 'cuBLASLt workspace of the dW stream  *0\.031$'; }
expect "dw_stream_plan: the second workspace planned with on ($(workspace on)), not with off ($(workspace off)) or auto ($(workspace auto))" \
  "[ $(workspace on) -eq 1 ] && [ $(workspace off) -eq 0 ] && [ $(workspace auto) -eq 0 ]"
exit $((failures > 0))
