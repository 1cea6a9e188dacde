# test_sim.sh: the CUDA sources on the CPU execution model of CUDA (build/sim/,
# docs/SIM.md). The GPU test programs at their small sizes under three seeds,
# and once built with AddressSanitizer; the sim's self-tests, each
# deliberately wrong kernel caught (a wrong result under some seed, poison, or
# one "cudasim:" line and exit 1; an out-of-bounds read under
# AddressSanitizer); what the CUDA attention op refuses (one line, exit 1);
# and mutations of the attention sources (a __syncthreads
# removed from the forward or the backward, a fragment's bf16 halves swapped, too many threads for the
# __launch_bounds__; in the Hopper forward an mbarrier wait removed or on the
# wrong phase, a wgmma fence or wait removed; in the Hopper sparse forward
# an expect-tx or a cp.async wait removed, empty's wrong phase, the gathered
# rows' swizzle dropped; in the Hopper backward the
# wait on its dS^T barrier, on empty or a wgmma wait removed, empty's wrong
# phase, a fence removed) that the attention tests must catch; in the sparse
# backward's blocks the barrier after the P^T, dS^T stores and the store of the
# tokens of the tile after next removed, that the sparse test must catch; and of the sparse
# index build's barriers (each loop's closing __syncthreads, the one inside
# block_exclusive_sum) that the sparse test's long index row must catch.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
seeds="1 2 3"
sim=build/sim/tests
if [ ! -x $sim/gpu_test_attention ] || [ ! -x $sim/sim_selftest ] || [ ! -x $sim/sim_selftest_asan ]; then
  bad "sim build" "programs missing in $sim (make build-sim)"
  exit 1
fi

# GPU tests, small sizes, each seed; once more built with AddressSanitizer
# (out-of-bounds device accesses), seed 1.
for prog in $sim/gpu_test_*_asan; do
  "$prog" small >"$tmp/out" 2>&1
  rc=$?
  expect "$(basename "$prog") (AddressSanitizer): exit $rc, $(tail -n 1 "$tmp/out")" \
    "[ $rc -eq 0 ] && ! grep -qE '^FAIL|AddressSanitizer' '$tmp/out'"
done
for prog in $sim/gpu_test_*; do
  case "$prog" in *_asan) continue ;; esac
  for s in $seeds; do
    counts=
    [ "$(basename "$prog")" = gpu_test_counts ] && [ "$s" = 1 ] && counts="$tmp/counts.tsv"
    CUDASIM_COUNTS=$counts CUDASIM_SEED=$s $prog small >"$tmp/out" 2>&1
    rc=$?
    name="$(basename "$prog") seed $s"
    if [ $rc -eq 0 ] && ! grep -q '^FAIL' "$tmp/out"; then
      ok "$name: $(tail -n 1 "$tmp/out")"
    else
      bad "$name" "exit $rc; $(grep -m 3 -E '^FAIL|^cudasim' "$tmp/out" | tr '\n' ' ')"
    fi
  done
done
if [ -x $sim/gpu_test_counts ]; then
  # CUDASIM_COUNTS=FILE: a header, then one line per kernel since the program's last reset (its sparse backward).
  expect "CUDASIM_COUNTS writes the kernels' counts at exit ($(tail -n 1 "$tmp/counts.tsv" | cut -f 1 | cut -c 1-40)...)" \
    "head -n 1 '$tmp/counts.tsv' | grep -qx 'kernel.launches.blocks.mma.ldmatrix_bytes.cp_async_bytes.shuffles.barriers.atomics.ldmatrix_wavefronts.ldmatrix_wavefronts_min.cp_async_wavefronts.cp_async_wavefronts_min.wgmma.wgmma_flops.tma_bytes.mbarrier_waits' && grep -qE '^void sparse_backward_blocks_kernel<.*\)	1	[0-9]+	[1-9]' '$tmp/counts.tsv'"
fi

# Self-tests that print a result: the wrong kernel wrong under some seed, the right one right under all.
results() { for s in $seeds; do CUDASIM_SEED=$s $sim/sim_selftest "$1" 2>&1; done | sort -u | tr '\n' ' '; }
r=$(results reuse_nosync)
expect "missing __syncthreads before reusing a shared buffer: wrong under some seed ($r)" '[[ "$r" == *wrong* ]]'
r=$(results reuse_sync)
expect "with the __syncthreads: correct under every seed ($r)" '[ "$r" = "correct " ]'
r=$(results cp_async_early)
expect "read before cp.async.wait_group sees poison ($r)" '[ "$r" = "poison " ]'
r=$(results cp_async_waited)
expect "read after cp.async.wait_group sees the data ($r)" '[ "$r" = "correct " ]'
r=$(results mbarrier_wrong_phase)
expect "mbarrier wait on the wrong phase parity: the TMA tile read as poison ($r)" '[ "$r" = "poison " ]'
r=$(results wgmma_early_read)
expect "wgmma accumulators read before wgmma.wait_group: poison ($r)" '[ "$r" = "poison " ]'
r=$(results pipeline)
expect "TMA / wgmma pipeline of two stages, full and empty mbarriers: correct under every seed ($r)" '[ "$r" = "correct " ]'
r=$(results setmaxnreg)
expect "setmaxnreg: producer .dec, consumers .inc in any order complete under every seed ($r)" '[ "$r" = "correct " ]'
r=$(results streams_nowait)
expect "a kernel reading another stream's result without cudaStreamWaitEvent: wrong under some seed ($r)" \
  '[[ "$r" == *wrong* ]]'
r=$(results streams_event)
expect "with cudaStreamWaitEvent: correct under every seed ($r)" '[ "$r" = "correct " ]'
r=$(results streams_far_nowait)
expect "a stream overwriting, 16 launches later, what another stream reads, without waiting for the read: wrong under some seed ($r)" \
  '[[ "$r" == *wrong* ]]'
r=$(results streams_far_event)
expect "with the wait for the read: correct under every seed ($r)" '[ "$r" = "correct " ]'
r=$(results streams_legacy)
expect "the legacy default stream waits for a blocking stream: correct under every seed ($r)" '[ "$r" = "correct " ]'

# Rule violations: exit 1 with one line naming kernel, block, thread and rule.
violation() {   # CASE PATTERN [PROGRAM, default the self-test]
  "${3:-$sim/sim_selftest}" "$1" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  expect "$1: exit 1 with one line: $(head -c 160 "$tmp/err")" \
    "[ $rc -eq 1 ] && [ $lines -eq 1 ] && grep -qE '$2' '$tmp/err'"
}
where='.* block \(0,0,0\) thread \([0-9]+,0,0\) warp [0-9]+ lane [0-9]+: '
violation shfl_missing_lane "^cudasim: kernel shfl_missing_lane_kernel${where}.*lane 5 of the mask has exited"
violation misaligned_cp_async "^cudasim: kernel misaligned_cp_async_kernel${where}.*16-byte aligned"
violation barrier_divergence "^cudasim: kernel barrier_divergence_kernel${where}__syncthreads while thread .* has exited"
# Hopper: bulk copies on an mbarrier, wgmma, setmaxnreg used wrongly.
tma='^cudasim: kernel void tma_wgmma_kernel<64>.* block \(0,0,0\)'
violation mbarrier_no_expect_tx "${tma}: bulk copies completed on the mbarrier .* never landed"
violation mbarrier_missing_bytes "${tma} thread .*mbarrier.try_wait.parity 0 .* never completes.*tx-count 16384: bytes an expect-tx announced never arrived"
violation pipeline_wrong_parity "^cudasim: kernel pipeline_kernel.* block \(0,0,0\).*(mbarrier.try_wait.parity 1 .* never completes|bulk copies completed on the mbarrier .* never landed)"
violation wgmma_early_write "${tma} thread .*accumulator register 1 .* was written between its wgmma.mma_async and the wgmma.wait_group"
violation wgmma_no_fence "${tma} thread .*wgmma.mma_async without a wgmma.fence"
violation wgmma_operand_overwritten "${tma} thread .*the shared memory a wgmma.mma_async read .* changed before the last wgmma.wait_group"
violation setmaxnreg_odd "^cudasim: kernel void setmaxnreg_kernel<100>${where}setmaxnreg.inc.sync.aligned.u32 100: the count must be a multiple of 8"
violation setmaxnreg_over "^cudasim: kernel void setmaxnreg_kernel<256>${where}setmaxnreg.inc to 256 registers waits forever"
# What the CUDA attention op refuses, likewise: sparse blocks of 32.
violation refuse-block 'attention.block_size 32: the CUDA sparse attention supports 64 and 128' \
  $sim/gpu_test_attention_op

$sim/sim_selftest_asan oob_read >"$tmp/out" 2>&1
rc=$?
expect "out-of-bounds device read: AddressSanitizer heap-buffer-overflow in the kernel (exit $rc)" \
  "[ $rc -ne 0 ] && grep -q 'heap-buffer-overflow' '$tmp/out' && grep -q 'in oob_read_kernel' '$tmp/out'"

# Self-tests that check themselves (launch errors; cudaEventQuery over a polled
# operation and the last error; pinned and pageable host memory, host
# synchronisations by call site, stream priorities; mma and ldmatrix against
# the PTX tables; the device memory peak; bank conflicts counted; TMA and
# wgmma against a CPU GEMM under every seed).
for c in launch_limits polled host_memory fragments memory_peak banks; do
  $sim/sim_selftest $c >"$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  expect "sim_selftest $c exits 0" "[ $rc -eq 0 ]"
done

for s in $seeds; do
  CUDASIM_SEED=$s $sim/sim_selftest hopper_gemm >"$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  expect "sim_selftest hopper_gemm exits 0 (CUDASIM_SEED=$s)" "[ $rc -eq 0 ]"
done

# The visible devices: all of the node's CUDASIM_DEVICES, or CUDA_VISIBLE_DEVICES
# up to its first entry that is not one of them, each with its node PCI bus id.
r=$(CUDASIM_DEVICES=4 CUDA_VISIBLE_DEVICES=2,0,9,1 $sim/sim_selftest devices 2>&1)
expect "CUDA_VISIBLE_DEVICES=2,0,9,1 of 4: devices 2 then 0 ($r)" '[ "$r" = "2 0000:02:00.0 0000:00:00.0" ]'
r=$(CUDASIM_DEVICES=2 $sim/sim_selftest devices 2>&1)
expect "no CUDA_VISIBLE_DEVICES: the node's 2 ($r)" '[ "$r" = "2 0000:00:00.0 0000:01:00.0" ]'

# Mutations of the attention sources, built in a copy: the test must fail
# (the attention test, or the sparse test's long index row).
mutant() {   # TEST ARG NAME FILE PROGRAM(python, reads and writes the file's text in s) [PATTERN the failing output shows]
  local test=$1 arg=$2
  shift 2
  local dir="$tmp/mutant"
  rm -rf "$dir" && mkdir -p "$dir/build"
  cp -rp Makefile attention dist model tests "$dir/"
  cp -rp build/sim "$dir/build/"
  if ! /usr/bin/python3 - "$dir/$2" "$3" <<'PY'
import sys
path, code = sys.argv[1], sys.argv[2]
s = open(path).read()
env = {"s": s}
exec(code, env)
if env["s"] == s:
    sys.exit(1)
open(path, "w").write(env["s"])
PY
  then bad "mutant $1" "the patch did not apply to $2"; return; fi
  if ! make -C "$dir" -s DEPS_OK= "build/sim/tests/$test" >"$tmp/build.log" 2>&1; then
    bad "mutant $1" "build failed: $(tail -n 3 "$tmp/build.log" | tr '\n' ' ')"
    return
  fi
  local caught=""
  for s in $seeds; do
    CUDASIM_SEED=$s "$dir/$sim/$test" "$arg" >"$tmp/out" 2>&1 && continue
    local rc=$?
    [ -z "${4:-}" ] || grep -q "$4" "$tmp/out" || continue
    caught="$s (exit $rc, $(grep -c '^FAIL' "$tmp/out") FAIL lines)"
    break   # caught: the later seeds would only repeat it
  done
  expect "mutant $1: $test $arg fails under seed $caught" '[ -n "$caught" ]'
}
mutant gpu_test_attention small "forward without the __syncthreads after K's cp.async.wait_group" attention/kernels/flash_cuda.cu \
  's = s.replace("        __syncthreads();   // K and its positions are in; every warp is done with V\n", "", 1)'
mutant gpu_test_attention small "forward without the __syncthreads after V's cp.async.wait_group" attention/kernels/flash_cuda.cu \
  's = s.replace("        __syncthreads();   // V is in; every warp is done with K and its positions\n", "", 1)'
# The backward's pipeline: P^T and dS^T read before every warp stored them, dO reloaded while a warp reads it.
mutant gpu_test_attention small "backward without the __syncthreads after the P^T, dS^T stores" attention/kernels/flash_cuda.cu \
  's = s.replace("        __syncthreads();   // P^T, dS^T and the rows of the next tile are in\n", "", 1)'
mutant gpu_test_attention small "backward without the __syncthreads before dO reloads" attention/kernels/flash_cuda.cu \
  's = s.replace("        __syncthreads();   // every warp is done with dO\n", "", 1)'
mutant gpu_test_attention small "pack_bf16 with its two halves swapped" attention/kernels/flash_tiles.cuh \
  's = s.replace("__floats2bfloat162_rn(lo, hi)", "__floats2bfloat162_rn(hi, lo)", 1)'
# The Hopper forward's pipeline: each missing wait, wrong phase or missing wgmma fence or wait must fail it.
fwd=attention/kernels/flash_sm90_forward.cuh   # the consumer the dense and sparse forwards share
mutant gpu_test_sm90 small "sm90 consumer without its wait on the stage's full mbarrier" $fwd \
  's = s.replace("        mbarrier_wait(&full[stage], phase);\n", "", 1)'
mutant gpu_test_sm90 small "sm90 consumer waiting on parity 0 every time" $fwd \
  's = s.replace("mbarrier_wait(&full[stage], phase);", "mbarrier_wait(&full[stage], 0);", 1)'
mutant gpu_test_sm90 small "sm90 producer refilling a stage without its wait on empty" attention/kernels/flash_sm90.cu \
  's = s.replace("        mbarrier_wait(&empty[stage], phase ^ 1);\n        kps", "        kps", 1)'
mutant gpu_test_sm90 small "sm90 S = Q K^T without its wgmma.fence" $fwd \
  's = s.replace("        wgmma_fence();\n#pragma unroll\n        for (int kk = 0; kk < D / 16", "#pragma unroll\n        for (int kk = 0; kk < D / 16", 1)'
mutant gpu_test_sm90 small "sm90 S = Q K^T read before its wgmma.wait_group" $fwd \
  's = s.replace("        wgmma_commit_group();\n        wgmma_wait_group<0>();\n\n", "        wgmma_commit_group();\n\n", 1)'
# The Hopper sparse forward's producer: a block tile's TMA without its expect-tx, a wrong phase on empty, a
# gathered tile announced on full without its cp.async wait or while its group may be in flight, gathered rows
# stored without the 128-byte swizzle.
sp=attention/kernels/flash_sm90_sparse.cu
mutant gpu_test_sm90 sparse "sm90 sparse block tile without its expect-tx" $sp \
  's = s.replace("mbarrier_arrive_expect_tx(&full[stage], 2 * L::BOXES * BOX_BYTES);", "mbarrier_arrive(&full[stage]);", 1)'
mutant gpu_test_sm90 sparse "sm90 sparse producer waiting on empty with the wrong parity" $sp \
  's = s.replace("mbarrier_wait(&empty[stage], phase ^ 1);\n        kps", "mbarrier_wait(&empty[stage], phase);\n        kps", 1)'
mutant gpu_test_sm90 sparse "sm90 sparse gathered tile announced without its cp.async wait" $sp \
  's = s.replace("        if (newer) cp_async_wait<1>();\n        else cp_async_wait<0>();\n", "", 1)'
mutant gpu_test_sm90 sparse "sm90 sparse gathered tile announced while its copies may be in flight" $sp \
  's = s.replace("if (newer) cp_async_wait<1>();", "if (newer) cp_async_wait<2>();", 1)'
mutant gpu_test_sm90 sparse "sm90 sparse gathered rows without the swizzle" $sp \
  's = s.replace("2 * swizzle<64>(w, 8 * (c % 8))", "2 * (64 * w + 8 * (c % 8))", 1)'
# The Hopper backward's: a missing wait (the warpgroup's dS^T barrier, the producer's on empty, dQ's
# wgmma.wait_group), a wrong phase, a missing wgmma fence; its cases only (argument backward). (A consumer
# that skips its wait on full, or waits on the wrong parity, spins through stale stages without end: no mutant.)
bwd=attention/kernels/flash_sm90_backward.cu
mutant gpu_test_sm90 backward "sm90 backward reading dS^T without the wait on the warpgroup's barrier" $bwd \
  's = s.replace("            mbarrier_wait(&bar.ds_ready[c], ds_phase);\n", "", 1)'
mutant gpu_test_sm90 backward "sm90 backward producer refilling a stage without its wait on empty" $bwd \
  's = s.replace("            mbarrier_wait(&bar.empty[stage], phase ^ 1);\n", "", 1)'
mutant gpu_test_sm90 backward "sm90 backward producer waiting on empty with the wrong parity" $bwd \
  's = s.replace("mbarrier_wait(&bar.empty[stage], phase ^ 1);\n#pragma", "mbarrier_wait(&bar.empty[stage], phase);\n#pragma", 1)'
mutant gpu_test_sm90 backward "sm90 backward dV, dK += without their wgmma.fence" $bwd \
  's = s.replace("            wgmma_fence();\n#pragma unroll\n            for (int kk = 0; kk < BWD_BM / 16; kk++) {", "#pragma unroll\n            for (int kk = 0; kk < BWD_BM / 16; kk++) {", 1)'
mutant gpu_test_sm90 backward "sm90 backward dQ read before its wgmma.wait_group" $bwd \
  's = s.replace("                wgmma_commit_group();\n                wgmma_wait_group<0>();\n#pragma unroll\n                for (int r", "                wgmma_commit_group();\n#pragma unroll\n                for (int r", 1)'
# The sparse backward's key-major pipeline: P^T and dS^T read before every warp
# stored them; the tokens of the tile after next never stored (its rows then
# load from a stale slot: the small cases' CTAs of 3 to 6 query tiles).
mutant gpu_test_sparse small "sparse backward without the __syncthreads after the P^T, dS^T stores" \
  attention/kernels/sparse_cuda.cu \
  's = s.replace("        __syncthreads();   // P^T, dS^T and the rows of the next tile are in\n", "", 1)'
mutant gpu_test_sparse small "sparse backward without the store of the next-but-one tile's tokens" \
  attention/kernels/sparse_cuda.cu \
  's = s.replace("        if (tid < BM) qtok[(qt + 2) % 3 * BM + tid] = tok_after;", "", 1)'
# The barriers closing the index build's three loops (after each
# block_exclusive_sum) and the one inside block_exclusive_sum: the long index
# row runs each loop several times with data in every warp.
mutant gpu_test_sparse index "index build without the __syncthreads closing its block loop" \
  attention/sparse/sparse_select_cuda.cu 's = s.replace("        nb += total;\n        __syncthreads();\n", "        nb += total;\n", 1)'
mutant gpu_test_sparse index "index build without the __syncthreads closing its sink loop" \
  attention/sparse/sparse_select_cuda.cu \
  's = s.replace("        nc += total;\n        __syncthreads();\n    }\n    for (int64_t v0", "        nc += total;\n    }\n    for (int64_t v0", 1)'
mutant gpu_test_sparse index "index build without the __syncthreads closing its vertical loop" \
  attention/sparse/sparse_select_cuda.cu \
  's = s.replace("        nc += total;\n        __syncthreads();\n    }\n    if (!FILL", "        nc += total;\n    }\n    if (!FILL", 1)'
mutant gpu_test_sparse index "block_exclusive_sum without its __syncthreads" attention/kernels/flash_tiles.cuh \
  's = s.replace("    if (lane == 31) scratch[warp] = inclusive;\n    __syncthreads();\n", "    if (lane == 31) scratch[warp] = inclusive;\n", 1)'
# With nvcc the sim knows each kernel's __launch_bounds__ (build/sim/launch_bounds.tsv).
if [ "$(wc -l <build/sim/launch_bounds.tsv)" -gt 1 ]; then
  mutant gpu_test_attention small "forward launched with more threads than its __launch_bounds__" attention/kernels/flash_cuda.cu \
    's = s.replace("CUDA_LAUNCH(kernel, grid, FWD_WARPS * 32, smem", "CUDA_LAUNCH(kernel, grid, FWD_WARPS * 64, smem", 1)' \
    'too many resources requested for launch'
fi

[ $failures -eq 0 ]
