#!/usr/bin/env bash
# test_launches.sh: the device launches of a training step on the CUDA
# backend under the sim (build/sim/mtrain with MTRAIN_SYNC_REPORT=1, docs/SIM.md):
# the sim counts every kernel, cuBLASLt matmul and memset enqueued during the
# last step, and train prints "device launches per step: N (K kernels, M
# cuBLASLt matmuls, S memsets)". A step of 4 layers less one of 2, halved, is
# a layer's share:
#   per_layer  at most ${MOST[none]} launches per layer with dense
#              attention and train.recompute none, ${MOST[selective]} with
#              selective (the layer's forward but attention twice),
#              ${MOST[full]} with full (the whole forward twice);
#   memsets    at most ${MEMSETS[none]} (${MEMSETS[selective]},
#              ${MEMSETS[full]}) memsets per layer;
#   measured   the counts of every run, printed as "info" lines.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup launches
RUN="$SIM_RUN train.steps=2 checkpoint.resume=never"
declare -A MOST=([none]=40 [selective]=46 [full]=51) MEMSETS=([none]=5 [selective]=5 [full]=6)

# count NAME KIND: the report's figure of KIND (total, kernels, matmuls, memsets) in run NAME.
count() {
  sed -n 's/^device launches per step: \([0-9]*\) (\([0-9]*\) kernels, \([0-9]*\) cuBLASLt matmuls, \([0-9]*\) memsets)$/\1 \2 \3 \4/p' \
    "$tmp/$1.out" | awk -v kind="$2" '{ print kind == "total" ? $1 : kind == "kernels" ? $2 : kind == "matmuls" ? $3 : $4 }'
}

for policy in none selective full; do
  for layers in 2 4; do
    name=${policy}_l$layers
    MTRAIN_SYNC_REPORT=1 sim_train "$name" 1 1 model.num_layers=$layers train.recompute=$policy
    rc=$?
    expect "launches_report_$name: exit $rc, the report's count ($(count "$name" total))" \
      "[ $rc -eq 0 ] && [ -n '$(count "$name" total)' ]"
    echo "info $name: $(grep '^device launches per step' "$tmp/$name.out")"
  done
  per_layer() { echo $(( ($(count "${policy}_l4" "$1") - $(count "${policy}_l2" "$1")) / 2 )); }
  if [ -n "$(count "${policy}_l2" total)" ] && [ -n "$(count "${policy}_l4" total)" ]; then
    echo "info $policy: per layer $(per_layer total) launches ($(per_layer kernels) kernels, $(per_layer matmuls) cuBLASLt matmuls, $(per_layer memsets) memsets)"
    expect "launches_per_layer_$policy: $(per_layer total) device launches per layer <= ${MOST[$policy]}" \
      "[ $(per_layer total) -le ${MOST[$policy]} ]"
    expect "launches_memsets_$policy: $(per_layer memsets) memsets per layer <= ${MEMSETS[$policy]}" \
      "[ $(per_layer memsets) -le ${MEMSETS[$policy]} ]"
  else
    bad "launches_per_layer_$policy" "no report to count"
  fi
done
exit $((failures > 0))
