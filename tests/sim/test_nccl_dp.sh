#!/usr/bin/env bash
# test_nccl_dp.sh: data parallelism on the CUDA backend under the sim
# (build/sim/mtrain, docs/SIM.md; the sim's NCCL runs over MPI), 2 ranks under
# mpirun on a node of CUDASIM_DEVICES=2 GPUs, 3 steps of a small model:
#   nccl       dp 2 with parallel.comm: nccl (the gradient all-reduce on the
#              device arena through NCCL; the ranks line says so) equals one
#              rank with micro_batches 2: every step's loss (relative 1e-5)
#              and the weights of the last checkpoint (max |w - w_ref| < 1e-6),
#              under CUDASIM_SEED 1, 2 and 3 (the sim's interleavings);
#   mpi        parallel.comm: mpi (staged through host memory) gives the same
#              weights as nccl, bit for bit (a sum of 2 fp32 values rounds once
#              whatever the order);
#   control    one rank with micro_batches 1 differs from micro_batches 2 by
#              more than the weight tolerance (a reduction that dropped a
#              rank's gradient would fail the first check);
#   one GPU    nccl with 2 ranks on a node with 1 GPU ends with one line;
#   per task   Slurm's binding, one visible GPU per rank (CUDA_VISIBLE_DEVICES
#              its local rank on a node of 2): trains as nccl, bit for bit;
#              both ranks bound to GPU 0: the one-GPU line.
# Only the fp32 summation order of the gradients differs between the runs
# (the bf16 activations and kernels are the same per sequence), hence
# tolerances far below bf16's. AdamW with lr 1e-2 and eps 1e-3 (the update
# g / (|g| + eps) is smooth in g): a wrong gradient moves weights by ~1e-3.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup nccl_dp
RUN="$SIM_RUN checkpoint.resume=never"

train() { sim_train "$@"; }
differ() { runs_differ "$@"; }

train ref 1 1 train.micro_batches=2
train single 1 1 train.micro_batches=1
train nccl 2 2 parallel.dp=2
rc=$?
train mpi 2 2 parallel.dp=2 parallel.comm=mpi

expect "nccl_dp_runs: dp 2 over NCCL trains 3 steps (exit $rc; $(grep -m1 '^mtrain' "$tmp/nccl.out"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/nccl.out') -eq 3 ]"
expect "nccl_dp_uses_nccl: the ranks line names NCCL for nccl and not for mpi" \
  "grep -q '^ranks: 2 = dp 2 x cp 1 .*gradients over NCCL' '$tmp/nccl.out' &&
   grep -q '^ranks: 2 = dp 2' '$tmp/mpi.out' && ! grep -q '^ranks:.*NCCL' '$tmp/mpi.out'"
read -r loss weights < <(differ nccl ref)
expect "nccl_dp_equals_one_rank: dp 2 over NCCL = one rank with micro_batches 2 (loss $loss <= 1e-5 relative, weights $weights <= 1e-6)" \
  "below '$loss' 1e-5 && below '$weights' 1e-6"
for seed in 2 3; do
  CUDASIM_SEED=$seed train nccl_seed$seed 2 2 parallel.dp=2
  read -r loss weights < <(differ nccl_seed$seed ref)
  expect "nccl_dp_equals_one_rank_seed$seed: the same under CUDASIM_SEED=$seed (loss $loss, weights $weights)" \
    "below '$loss' 1e-5 && below '$weights' 1e-6"
done
read -r loss weights < <(differ mpi nccl)
expect "nccl_dp_mpi_equals_nccl: parallel.comm: mpi = nccl (loss $loss, weights $weights: both 0)" \
  "below '$loss' 0 && below '$weights' 0"
read -r loss weights < <(differ single ref)
expect "nccl_dp_control: micro_batches 1 and 2 differ by more than the tolerance (weights $weights > 1e-6)" \
  "[ '$weights' != - ] && ! below '$weights' 1e-6"

train onegpu 2 1 parallel.dp=2
rc=$?
lines=$(grep -c '^mtrain' "$tmp/onegpu.out")
expect "nccl_dp_one_gpu: nccl with 2 ranks on 1 GPU ends with one line (exit $rc, $lines line(s): $(grep -m1 '^mtrain' "$tmp/onegpu.out"))" \
  "[ $rc -ne 0 ] && [ $lines -eq 1 ] &&
   grep -q '^mtrain: parallel.comm: nccl: 2 ranks on a node with 1 GPU (NCCL needs a GPU per rank' '$tmp/onegpu.out' &&
   ! grep -q '^step ' '$tmp/onegpu.out'"
# Slurm's per-task binding: each rank sees only its own GPU of the node's 2
# (CUDA_VISIBLE_DEVICES = its local rank, device 0 for both): trains as nccl;
# both bound to the node's GPU 0 is one GPU for 2 ranks again.
bound() {   # NAME CUDA_VISIBLE_DEVICES (a shell expression per rank)
  CUDASIM_DEVICES=2 timeout 600 mpirun --oversubscribe --bind-to none -np 2 \
    bash -c "CUDA_VISIBLE_DEVICES=$2 exec build/sim/mtrain \"\$@\"" mtrain train configs/tiny-cpu.yaml $RUN parallel.dp=2 \
    log.dir="$tmp/$1" checkpoint.dir="$tmp/$1" </dev/null >"$tmp/$1.out" 2>&1
}
bound per_task '$OMPI_COMM_WORLD_LOCAL_RANK'
rc=$?
read -r loss weights < <(differ per_task nccl)
expect "nccl_dp_per_task_binding: one visible GPU per rank trains as nccl (exit $rc, loss $loss, weights $weights: both 0; $(grep -m1 '^mtrain' "$tmp/per_task.out"))" \
  "[ $rc -eq 0 ] && below '$loss' 0 && below '$weights' 0"
bound shared 0
rc=$?
expect "nccl_dp_per_task_shared: both ranks bound to GPU 0 ends with one line (exit $rc: $(grep -m1 '^mtrain' "$tmp/shared.out"))" \
  "[ $rc -ne 0 ] && grep -q '^mtrain: parallel.comm: nccl: 2 ranks on a node with 1 GPU ' '$tmp/shared.out' && ! grep -q '^step ' '$tmp/shared.out'"
exit $((failures > 0))
