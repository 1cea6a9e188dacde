#!/usr/bin/env bash
# test_nccl_reduce.sh: the gradient reduction on the CUDA backend under the
# sim (build/sim/mtrain, docs/SIM.md; the sim's NCCL runs over MPI), 2 ranks
# under mpirun on a node of CUDASIM_DEVICES=2 GPUs, a small model:
#   buckets    dp 2 with the all-reduce in buckets of 0.05 MiB (several per
#              layer, started on the communication stream during the backward)
#              equals one all-reduce after the backward (bucket_mb 0) bit for
#              bit, under CUDASIM_SEED 1, 2 and 3 (a missing event between the
#              streams would let a bucket be summed before its gradients are);
#   zero       dp 2 with parallel.zero: 1 (reduce-scatter of the gradient
#              arena, AdamW on each rank's shard, all-gather of the weights)
#              equals one rank with micro_batches 2 (every step's loss
#              relative 1e-5, last weights max |w - w_ref| < 1e-6), and equals
#              dp 2 without ZeRO bit for bit (a sum of 2 fp32 values rounds
#              once in either collective), under NCCL and staged through the
#              host (parallel.comm: mpi);
#   resume     the ZeRO checkpoint of step 2 resumed on one rank with
#              micro_batches 2 (the moments re-sharded) gives the weights of
#              the straight run at step 3;
#   stall      a rank that never joins the gradient reduction
#              (MTRAIN_TEST_FAULT=stall:1): the other ends the job within
#              parallel.timeout_s (3 s) with "mtrain: rank 0: OP on world did
#              not complete within 3 s" (the NCCL watchdog), under ZeRO with
#              nccl and mpi, and in buckets on the communication stream;
#   kill       a rank killed by SIGKILL before the reduction: mpirun ends
#              the whole job, naming the rank, before any rank's own time-out.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup nccl_reduce
RUN="$SIM_RUN checkpoint.every=1"

train() { local name=$1 np=$2; shift 2; sim_train "$name" "$np" 2 "$@"; }
differ() { runs_differ "$@"; }

train ref 1 train.micro_batches=2
train dp2 2 parallel.dp=2 parallel.bucket_mb=0
for seed in 1 2 3; do
  CUDASIM_SEED=$seed train buckets$seed 2 parallel.dp=2 parallel.bucket_mb=0.05
  read -r loss weights < <(differ buckets$seed dp2)
  expect "nccl_buckets_seed$seed: buckets of 0.05 MiB = one all-reduce, CUDASIM_SEED=$seed (loss $loss, weights $weights)" \
    "below '$loss' 0 && below '$weights' 0"
done
train zero 2 parallel.dp=2 parallel.zero=1
rc=$?
train zero_mpi 2 parallel.dp=2 parallel.zero=1 parallel.comm=mpi

expect "nccl_zero_runs: dp 2 with ZeRO-1 over NCCL trains 3 steps (exit $rc; $(grep -m1 '^mtrain' "$tmp/zero.out"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/zero.out') -eq 3 ] && grep -q '^ranks: 2 = dp 2 .*ZeRO-1, gradients over NCCL' '$tmp/zero.out'"
read -r loss weights < <(differ zero ref)
expect "nccl_zero_equals_one_rank: ZeRO-1 dp 2 = one rank with micro_batches 2 (loss $loss <= 1e-5 relative, weights $weights <= 1e-6)" \
  "below '$loss' 1e-5 && below '$weights' 1e-6"
read -r loss weights < <(differ zero dp2)
expect "nccl_zero_equals_dp2: ZeRO-1 = dp 2 without ZeRO bit for bit (loss $loss, weights $weights)" \
  "below '$loss' 0 && below '$weights' 0"
read -r loss weights < <(differ zero_mpi zero)
expect "nccl_zero_mpi_equals_nccl: ZeRO-1 staged through the host = over NCCL (loss $loss, weights $weights)" \
  "below '$loss' 0 && below '$weights' 0"

# Resume: the ZeRO run's step-2 checkpoint on one rank (micro_batches 2).
mkdir -p "$tmp/resumed"
cp -r "$tmp/zero/step_00000002" "$tmp/resumed/"
train resumed 1 train.micro_batches=2 checkpoint.resume=auto
read -r loss weights < <(differ resumed zero)
expect "nccl_zero_resume_one_rank: the ZeRO checkpoint resumed on one rank = the straight run (weights $weights <= 1e-6)" \
  "grep -q '^resumed from .*step_00000002' '$tmp/resumed.out' && below '$weights' 1e-6"

# The no-hang rule: a stalled rank and a killed rank.
for run in "zero_nccl parallel.zero=1" "zero_mpi parallel.zero=1 parallel.comm=mpi" "buckets parallel.bucket_mb=0.05"; do
  read -r name settings <<<"$run"
  start=$(date +%s)
  # shellcheck disable=SC2086  # $settings is a list of settings
  MTRAIN_TEST_FAULT=stall:1 train stall_$name 2 parallel.dp=2 parallel.timeout_s=3 $settings
  rc=$?
  t=$(( $(date +%s) - start ))
  expect "nccl_stall_$name: a rank that skips the reduction ends the job (exit $rc in $t s: $(grep -m1 '^mtrain: rank' "$tmp/stall_$name.out"))" \
    "[ $rc -ne 0 ] && [ $rc -ne 124 ] &&
     grep -Eq '^mtrain: rank 0: (reduce-scatter|all-reduce \(sum\)) on world did not complete within 3 s$' '$tmp/stall_$name.out' &&
     ! grep -q '^mtrain: rank 1:' '$tmp/stall_$name.out'"
done
start=$(date +%s)
MTRAIN_TEST_FAULT=kill:1 train kill 2 parallel.dp=2 parallel.zero=1 parallel.timeout_s=600
rc=$?
t=$(( $(date +%s) - start ))
expect "nccl_zero_kill: a rank killed before the reduction ends the job (exit $rc in $t s)" \
  "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'exited on signal 9' '$tmp/kill.out' &&
   ! grep -q 'did not complete within' '$tmp/kill.out'"
exit $((failures > 0))
