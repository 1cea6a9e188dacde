#!/usr/bin/env bash
# test_cuda_multi.sh: the CUDA backend on several ranks with data and context
# parallelism together, ZeRO-1 over dp x cp, and the no-hang rule inside the
# ring, under the sim (build/sim/mtrain, docs/SIM.md; its NCCL runs over MPI),
# a small model trained 3 steps, one GPU per rank, each case under its own
# CUDASIM_SEED (the sim's stream interleavings):
#   dp x cp    np 4, dp 2 x cp 2 (CUDASIM_SEED 1) equals one rank with
#              micro_batches 2: every step's loss within 2e-4 relative and
#              every weight of the last checkpoint within 4e-3;
#   cp 8       np 8 (--oversubscribe), 256 tokens in blocks of 32 (one block
#              per rank; CUDASIM_SEED 2) equals one rank, same tolerances;
#   zero       ZeRO-1 over dp x cp: np 2 cp 2 with parallel.zero 1
#              (CUDASIM_SEED 3) equals cp 2 without it bit for bit (each
#              gradient is a sum of 2 fp32 values, which rounds once in the
#              all-reduce and in the reduce-scatter alike); np 4 dp 2 x cp 2
#              with ZeRO-1 (CUDASIM_SEED 4) equals dp 2 x cp 2 without it
#              within fp32 summation order (loss 1e-6 relative, weights 1e-6:
#              a sum of 4 values may be added in another order by the
#              reduce-scatter than by the all-reduce; the sim's MPI adds them
#              in the same order, so the measured difference is 0); its
#              step-2 checkpoint resumed on np 2 cp 2 with ZeRO-1 and
#              micro_batches 2 gives the straight run's step 3 within 1e-6;
#   stall      a rank that stalls at its first wait of the ring exchange
#              (MTRAIN_TEST_FAULT=stall:R@ring, its transfers never handed to
#              NCCL): a peer's watchdog ends the job within
#              parallel.timeout_s (3 s) with "mtrain: rank P: ring attention
#              ...: K/V transfer ... on cp did not complete within 3 s", on
#              cp 2 over NCCL and staged through MPI, and in the middle of a
#              cp 4 ring;
#   kill       a rank killed by SIGKILL at its first ring wait: mpirun ends
#              the whole job, naming the rank, well within the time limit.
# The ring tolerances are test_cuda_ring.sh's (bf16 activations, the ring's
# log-sum-exp merge and dK/dV sums in another order than one kernel): a ring
# or a reduction that lost or doubled a chunk or a rank's gradient moves the
# loss by 1e-2 and the weights by 1e-2.
cd "$(dirname "$0")/.."
source tests/lib.sh
sim_setup cuda_multi
RUN="$SIM_RUN checkpoint.resume=never attention.block_size=32"

train() { sim_train "$1" "$2" "$2" "${@:3}"; }
differ() { runs_differ "$@"; }
# same RC NAME RUN REF LOSS WEIGHTS RANKS WHAT: the run RUN, which exited with
# RC, logged a ranks line starting RANKS and equals the run REF: loss within
# LOSS relative, weights within WEIGHTS.
same() {
  local rc=$1 name=$2 run=$3 ref=$4 loss_tol=$5 weights_tol=$6 ranks=$7 what=$8 loss weights
  read -r loss weights < <(differ "$run" "$ref")
  expect "cuda_multi_$name: $what (exit $rc; loss $loss <= $loss_tol relative, weights $weights <= $weights_tol)" \
    "[ $rc -eq 0 ] && grep -q '^ranks: $ranks' '$tmp/$run.out' && below '$loss' $loss_tol && below '$weights' $weights_tol"
}

train ref 1 train.micro_batches=2
CUDASIM_SEED=1 train dpcp 4 parallel.dp=2 parallel.cp=2
same $? dp2_cp2 dpcp ref 2e-4 4e-3 "4 = dp 2 x cp 2 .*gradients over NCCL" "np 4 dp 2 x cp 2 = one rank with micro_batches 2"

train ref256 1 train.seq_len=256
CUDASIM_SEED=2 train cp8 8 parallel.cp=8 train.seq_len=256
same $? cp8 cp8 ref256 2e-4 4e-3 "8 = dp 1 x cp 8" "np 8 cp 8 = one rank"

train cp2 2 parallel.cp=2
CUDASIM_SEED=3 train cp2_zero 2 parallel.cp=2 parallel.zero=1
same $? zero_cp2 cp2_zero cp2 0 0 "2 = dp 1 x cp 2 .*ZeRO-1, gradients over NCCL" \
  "np 2 cp 2 with ZeRO-1 = without, bit for bit"
CUDASIM_SEED=4 train dpcp_zero 4 parallel.dp=2 parallel.cp=2 parallel.zero=1 checkpoint.every=1
same $? zero_dp2_cp2 dpcp_zero dpcp 1e-6 1e-6 "4 = dp 2 x cp 2 .*ZeRO-1, gradients over NCCL" \
  "np 4 dp 2 x cp 2 with ZeRO-1 = without"
# Its step-2 checkpoint (moments sharded 4 ways) resumed on np 2 cp 2 with
# ZeRO-1 and micro_batches 2 (sharded 2 ways; the same sequences, the same
# ring, the gradients summed in another order): step 3 within fp32 rounding.
mkdir -p "$tmp/resumed"
cp -r "$tmp/dpcp_zero/step_00000002" "$tmp/resumed/"
CUDASIM_SEED=5 train resumed 2 parallel.cp=2 parallel.zero=1 train.micro_batches=2 checkpoint.resume=auto
same $? zero_resume_cp2 resumed dpcp_zero 1e-6 1e-6 "2 = dp 1 x cp 2 .*ZeRO-1" \
  "the ZeRO-1 dp 2 x cp 2 checkpoint of step 2 resumed on cp 2 with ZeRO-1 = the straight run"
expect "cuda_multi_zero_resume_cp2_resumed: the resumed run started from step 2" \
  "grep -q '^resumed from .*step_00000002' '$tmp/resumed.out'"

# The no-hang rule inside the ring. NAME NP FAULT PEERS SETTINGS: the rank
# FAULT stalls; one of PEERS (a grep pattern) names the transfer.
while read -r name np fault peers settings; do
  start=$(date +%s)
  # shellcheck disable=SC2086  # $settings is a list of settings
  MTRAIN_TEST_FAULT=stall:$fault@ring train "stall_$name" "$np" parallel.timeout_s=3 $settings </dev/null
  rc=$?
  t=$(( $(date +%s) - start ))
  first=$(grep -m1 '^mtrain: rank' "$tmp/stall_$name.out")
  expect "cuda_multi_stall_$name: rank $fault stalled in the ring ends the job (exit $rc in $t s: $first)" \
    "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $t -lt 60 ] &&
     grep -q '^rank $fault: MTRAIN_TEST_FAULT: stall at the fault point ring' '$tmp/stall_$name.out' &&
     [[ '$first' =~ ^mtrain:\ rank\ $peers:\ ring\ attention\ (forward|backward):\ .*\ on\ cp\ did\ not\ complete\ within\ 3\ s$ ]]"
done <<'EOF'
cp2_nccl 2 1 0 parallel.cp=2
cp2_mpi 2 1 0 parallel.cp=2 parallel.comm=mpi
cp4_middle 4 2 [13] parallel.cp=4
EOF

start=$(date +%s)
MTRAIN_TEST_FAULT=kill:1@ring train kill 2 parallel.cp=2 parallel.timeout_s=600
rc=$?
t=$(( $(date +%s) - start ))
expect "cuda_multi_kill: a rank killed in the ring ends the job (exit $rc in $t s)" \
  "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $t -lt 60 ] && grep -q 'exited on signal 9' '$tmp/kill.out' &&
   grep -q '^rank 1: MTRAIN_TEST_FAULT: kill at the fault point ring' '$tmp/kill.out'"
exit $((failures > 0))
