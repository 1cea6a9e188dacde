#!/usr/bin/env bash
# sbatch_example.sh: a Slurm batch script for a long-context run on several
# nodes: plans the run first (refuses to start one that does not fit), then
# launches one rank per GPU with srun --mpi=pmix. Slurm sends SIGUSR1 five
# minutes before the time limit (--signal): every rank finishes its step,
# rank 0 writes a checkpoint and the ranks exit 0; the script then requeues
# the job, and the requeued job resumes from that checkpoint
# (checkpoint.resume: auto). A pre-empted job (--requeue) resumes the same way
# from its newest complete checkpoint.
#   sbatch scripts/sbatch_example.sh [RUN.yaml] [section.key=value ...]
# (default RUN.yaml: configs/qwen2.5-3b-512k-32xa100.yaml; edit the #SBATCH
# lines for your cluster: nodes x GPUs per node = parallel.dp x parallel.cp.)
#SBATCH --job-name=mtrain-512k
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mtrain-%x-%j.out
set -uo pipefail
run=${1:-configs/qwen2.5-3b-512k-32xa100.yaml}
shift $(( $# > 0 ? 1 : 0 ))
# The trainer with the CUDA backend when it was built (nvcc), else the CPU one.
mtrain=build/cuda/mtrain
[ -x "$mtrain" ] || mtrain=build/mtrain

# One OpenMP thread set per rank, passive waits (docs/USAGE.md, Several processes).
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-8} OMP_WAIT_POLICY=passive
# NCCL, for the CUDA backend's communicators (docs/USAGE.md, Running on a cluster):
# InfiniBand between nodes with GPUDirect RDMA, the interface of the
# bootstrap connection, warnings only. Site-specific names (mlx5, ib0) are
# examples; the CPU backend's MPI does not read them.
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Plan on the batch host: memory per GPU, step time; stop if it does not fit.
"$mtrain" plan "$run" "$@" | tee "$scratch/plan.txt"
if ! grep -q '^fits: yes' "$scratch/plan.txt"; then
  echo "sbatch_example.sh: $run does not fit (plan above); not starting" >&2
  exit 1
fi

# The batch shell gets SIGUSR1 (B:) and passes it on to every rank.
log=$scratch/train.log
srun --mpi=pmix --kill-on-bad-exit=1 "$mtrain" train "$run" "$@" > >(tee "$log") 2>&1 &
srun_pid=$!
trap 'kill -USR1 "$srun_pid"' USR1
status=0
while :; do
  wait "$srun_pid"
  status=$?
  kill -0 "$srun_pid" 2>/dev/null || break   # wait returned for the signal: srun still runs
done
if [ "$status" -eq 0 ] && grep -q '^stopped by SIGUSR1' "$log" && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "sbatch_example.sh: stopped at the time limit with a checkpoint; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
