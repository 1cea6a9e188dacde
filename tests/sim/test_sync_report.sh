#!/usr/bin/env bash
# test_sync_report.sh: the host synchronisations of a training step on the
# CUDA backend under the sim (build/sim/mtrain with MTRAIN_SYNC_REPORT=1,
# docs/SIM.md): the sim counts every call that makes the host wait for the
# device (synchronise, device-to-host copies, async copies with pageable host
# memory, cudaMalloc/cudaFree, polls of an event) by call site, and train
# prints the last step's "host syncs per step: N" and the sites.
#   budgets    pairs of runs whose N must be equal: a dense step's N does not
#              grow with the number of layers (2 and 4), on one rank and on a
#              cp ring, nor with the ring's size (cp 2 and 4): no host
#              synchronisation inside a ring step (the ring's buffers,
#              positions and token lists are kept from the first step, the
#              NCCL watchdog polls once per step); a sparse step's on one
#              rank neither (selection, index and its bound on the device:
#              nothing read back, the index rebuilt from the layer's pattern),
#              nor on a cp ring, with the layers or the ring's size (cp 2
#              and 4): the ring's plan stays on the device (need rows not
#              needed with ring_send full, the gathered columns planned at
#              bounds, their collectives watched once per step); with
#              documents (data.doc_mask on a shard of short documents, several
#              per sequence) neither, dense or sparse: the document starts go
#              to the device once per sequence, not per layer;
#   pinned     a one-rank dense step, with documents too, makes no async copy
#              with pageable host memory (the backend's uploads and downloads
#              are staged through its page-locked buffer, the attention op's
#              document starts through its own);
#   plan       every run's N equals the host syncs that `mtrain plan --gpu`
#              predicts for the same settings (its step time counts them),
#              ring_send selected's 3 per layer included, and a loss in 4
#              chunks (the chunks' cross entropy summed on the device, read once);
#   priority   cp 2 over NCCL: every NCCL operation of the step runs on a
#              stream of the device's greatest priority;
#   measured   N and the sites of every run, printed as "info" lines.
# A case is one line of $cases (name, ranks, settings); a budget one pair of
# names.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup sync_report
RUN="$SIM_RUN train.steps=2 checkpoint.resume=never"
# $SIM_SPARSE on one line, without its statistics (log.attention_every: counting them reads the index back)
# shellcheck disable=SC2086  # split into its settings
SIM_SPARSE_PLAN=$(printf '%s ' ${SIM_SPARSE/log.attention_every=1/})
# A shard of 60 short documents (bytes: 8 to 80 tokens), 2 to 4 starts in each sequence of 128.
awk 'BEGIN { srand(7); split("the a river town bright quiet stone winter map road house light", w, " ");
  for (d = 0; d < 60; d++) { f = sprintf("'"$tmp"'/doc%02d.txt", d); s = ""; n = 2 + int(rand() * 12);
    for (i = 0; i < n; i++) s = s w[int(rand() * 12) + 1] " "; print s > f; close(f) } }'
build/sim/mtrain tokenize --tokenizer bytes --input "$tmp"/doc*.txt --output "$tmp/docs.shard" >/dev/null
DOCS="model.vocab_size=258 data.train=$tmp/docs.shard data.doc_mask=true"

cases="dense_l2 1 model.num_layers=2
dense_l4 1 model.num_layers=4
chunks_l2 1 model.num_layers=2 train.loss_chunk=32
ring2_l2 2 parallel.cp=2 model.num_layers=2
ring2_l4 2 parallel.cp=2 model.num_layers=4
ring4_l2 4 parallel.cp=4 model.num_layers=2 train.seq_len=256
ring4_l4 4 parallel.cp=4 model.num_layers=4 train.seq_len=256
sparse_l2 1 model.num_layers=2 $SIM_SPARSE_PLAN
sparse_l4 1 model.num_layers=4 $SIM_SPARSE_PLAN
sparse2_l2 2 parallel.cp=2 model.num_layers=2 $SIM_SPARSE_PLAN
sparse2_l4 2 parallel.cp=2 model.num_layers=4 $SIM_SPARSE_PLAN
sparse4_l2 4 parallel.cp=4 model.num_layers=2 train.seq_len=256 $SIM_SPARSE_PLAN
docs_l2 1 model.num_layers=2 $DOCS
docs_l4 1 model.num_layers=4 $DOCS
sparse_docs_l2 1 model.num_layers=2 $SIM_SPARSE_PLAN $DOCS
sparse_docs_l4 1 model.num_layers=4 $SIM_SPARSE_PLAN $DOCS
selected2_l2 2 parallel.cp=2 model.num_layers=2 $SIM_SPARSE_PLAN attention.ring_send=selected
selected2_l4 2 parallel.cp=2 model.num_layers=4 $SIM_SPARSE_PLAN attention.ring_send=selected"
budgets="dense_l2 dense_l4
ring2_l2 ring2_l4
ring4_l2 ring4_l4
ring2_l2 ring4_l2
sparse_l2 sparse_l4
dense_l2 sparse_l2
sparse2_l2 sparse2_l4
sparse2_l2 sparse4_l2
docs_l2 docs_l4
sparse_docs_l2 sparse_docs_l4"

declare -A N
while read -r name np settings; do
  # shellcheck disable=SC2086  # $settings is a list of settings
  MTRAIN_SYNC_REPORT=1 sim_train "$name" "$np" "$np" $settings
  rc=$?
  N[$name]=$(sed -n 's/^host syncs per step: \([0-9]*\)$/\1/p' "$tmp/$name.out")
  expect "sync_report_$name: $np rank(s), $settings: the report's count (exit $rc, N ${N[$name]:-none})" \
    "[ $rc -eq 0 ] && [ -n '${N[$name]}' ]"
  # shellcheck disable=SC2086  # the same settings
  planned=$(build/sim/mtrain plan configs/tiny-cpu.yaml --gpu h100 $RUN $settings 2>&1 |
            sed -n 's/^predicted step: .* host syncs [0-9.]* (\([0-9]*\) syncs).*/\1/p')
  expect "sync_report_plan_$name: the plan's host syncs per step (${planned:-none}) = the report's (${N[$name]:-none})" \
    "[ -n '$planned' ] && [ '$planned' = '${N[$name]}' ]"
  echo "info $name: host syncs per step: ${N[$name]:-none}"
  sed -n '/^host syncs per step/,/^[^ h]/{/^  /s/^/info /p}' "$tmp/$name.out"
done <<<"$cases"

for name in dense_l2 dense_l4 docs_l2 docs_l4; do
  sites=$(grep -c '^  .*with pageable host memory' "$tmp/$name.out")
  expect "sync_report_pinned_$name: no async copy with pageable host memory in a one-rank dense step ($sites sites)" \
    "[ -n '${N[$name]}' ] && [ $sites -eq 0 ]"
done

while read -r a b; do
  expect "sync_report_budget_${a}_$b: host syncs per step of $a (${N[$a]:-none}) = of $b (${N[$b]:-none})" \
    "[ -n '${N[$a]}' ] && [ '${N[$a]}' = '${N[$b]}' ]"
done <<<"$budgets"

# "NCCL operations per step: K, on streams of priority HIGH to LOW (the device's: L least, G greatest)"
read -r high low greatest < <(sed -n 's/^NCCL operations per step: .* priority \(-*[0-9]*\) to \(-*[0-9]*\) .* \(-*[0-9]*\) greatest)$/\1 \2 \3/p' \
  "$tmp/ring2_l2.out")
expect "sync_report_nccl_priority: cp 2: the NCCL operations on streams of priority ${high:-none} to ${low:-none}, the device's greatest ${greatest:-none}" \
  "[ -n '$greatest' ] && [ '$high' = '$greatest' ] && [ '$low' = '$greatest' ]"
exit $((failures > 0))
