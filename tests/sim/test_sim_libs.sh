#!/usr/bin/env bash
# test_sim_libs.sh: the sim's library subsets (tests/sim/cudasim/: cuBLASLt, CUB,
# NCCL over MPI) beyond what tests/sim/test_sim.sh runs (which runs every
# build/sim/tests/gpu_test_*, gpu_test_cublaslt and gpu_test_cub included,
# under three seeds): the NCCL program build/sim/tests/mpi_gpu_nccl under
# mpirun with 2 and 4 ranks (--oversubscribe: the ranks share the cores), each
# with CUDASIM_SEED 1, 2 and 3, its "ok NAME" / "FAIL NAME" lines passed on
# prefixed with the seed and rank count (a run that exits non-zero without
# naming a check fails); four misuses the sim must stop with one line
# (host memory given to CUB and to cuBLASLt, matrices less aligned than the
# cuBLASLt algorithm was chosen for, an algorithm used for a layout with
# another leading dimension); and two of NCCL, on 2 ranks, each rank
# stopping with its line (two communicators' all-reduces on two streams with
# no order between them; a stream that waits for a group with a node-local
# and a network transfer, nodes of one rank, then computes).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh

export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# run NAME COMMAND...: the command's checks, renamed NAME/..., and one failure if it dies without a FAIL line.
run() {
  local name=$1; shift
  timeout 600 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  sed -n -E "s#^(ok|FAIL) #\\1 $name/#p" "$tmp/out"
  failures=$((failures + $(grep -c '^FAIL ' "$tmp/out")))
  if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/out"; then
    bad "$name" "exit status $rc: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"
  fi
}

for prog in gpu_test_cublaslt gpu_test_cub mpi_gpu_nccl; do
  if [ ! -x "build/sim/tests/$prog" ]; then
    bad "sim_libs_$prog" "build/sim/tests/$prog is missing (run make build-sim)"
  fi
done
[ "$failures" -eq 0 ] || exit 1

for seed in 1 2 3; do
  export CUDASIM_SEED=$seed
  for np in 2 4; do
    run "seed$seed/np$np" mpirun --oversubscribe --bind-to none -np "$np" build/sim/tests/mpi_gpu_nccl
  done
done

# Misuses the sim must stop with one line naming the call and the argument.
# expect_stop NAME PATTERN COMMAND...
expect_stop() {
  local name=$1 pattern=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "$pattern" "$tmp/err"; then ok "$name"
  else bad "$name" "exit status $rc, stderr: $(head -c 300 "$tmp/err" | tr '\n' ' ')"; fi
}
not_device="is not inside one device allocation"
expect_stop sim_libs_cub_host_temp "^cudasim: cub::DeviceScan::InclusiveSum: d_temp_storage .* $not_device" \
  build/sim/tests/gpu_test_cub host-temp
expect_stop sim_libs_cublaslt_host_matrix "^cudasim: cublasLtMatmul: B .* $not_device" \
  build/sim/tests/gpu_test_cublaslt host-matrix
expect_stop sim_libs_cublaslt_misaligned \
  "^cudasim: cublasLtMatmul: A .* is not 256-byte aligned, as the algorithm from the heuristic assumes" \
  build/sim/tests/gpu_test_cublaslt misaligned
expect_stop sim_libs_cublaslt_other_layout \
  "^cudasim: cublasLtMatmul: A's leading dimension (130 elements, 260 bytes) is not a multiple of the 256 bytes" \
  build/sim/tests/gpu_test_cublaslt other-layout
# expect_stop_ranks NAME PATTERN ENV...: mpi_gpu_nccl MISUSE on 2 ranks fails, every rank with the line.
expect_stop_ranks() {
  local name=$1 pattern=$2 misuse=$3; shift 3
  env "$@" timeout 600 mpirun --oversubscribe --bind-to none -np 2 build/sim/tests/mpi_gpu_nccl "$misuse" \
    >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$(grep -c "$pattern" "$tmp/err")" -eq 2 ]; then ok "$name"
  else bad "$name" "exit status $rc, stderr: $(head -c 300 "$tmp/err" | tr '\n' ' ')"; fi
}
expect_stop_ranks sim_libs_nccl_two_comms \
  "^cudasim: NCCL: ncclAllReduce on the communicator of world ranks 0,1 .* may run at the same time as ncclAllReduce" \
  two-comms CUDASIM_SEED=1
expect_stop_ranks sim_libs_nccl_coupled \
  "^cudasim: cudaStreamWaitEvent at .*(misuse): .*the node-local data's consumer waits for the network, then a cudaMemsetAsync" \
  coupled CUDASIM_NODE_RANKS=1
[ "$failures" -eq 0 ]
