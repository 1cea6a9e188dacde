# test_sm90_select.sh: attention.kernels under the sim (build/sim/mtrain,
# docs/SIM.md). On the sim's A100 `sm90` stops with one line naming the GPU
# before any step; on its H100 (CUDASIM_SM=90) `sm90` runs the Hopper
# forward and backward (their kernels in the sim's counts, the mma.sync
# ones absent; the registry's report names them) and trains with the losses
# of `sm80` (within 1e-3 relative per step: the kernels round differently), and
# `auto` runs the mma.sync forward (no sweep row chose the Hopper one).
# Sparse attention (blocks of 64, a short last block): `sm90` runs the Hopper
# sparse forward (the mma.sync sparse forward absent; the backward stays
# mma.sync) with the losses of `sm80` within 1e-3.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim=build/sim/mtrain
if [ ! -x "$sim" ]; then
  bad "sim build" "$sim missing (make build-sim)"
  exit 1
fi

# A model the CUDA attention takes (head_dim 64, GQA 2: two heads per kv head), small enough for the sim.
model="model.hidden_size=128 model.intermediate_size=256 model.num_heads=2 model.num_kv_heads=1 model.head_dim=64"
attn=""   # the runs' attention settings (run), dense unless set
run() {  # NAME KERNELS [environment...]
  local name=$1 kernels=$2
  shift 2
  env CUDASIM_COUNTS="$tmp/$name.counts" "$@" $sim train configs/tiny-cpu.yaml $model $attn train.backend=cuda \
    train.steps=2 train.warmup_steps=1 train.seq_len=130 log.every=1 attention.kernels=$kernels \
    checkpoint.dir="$tmp/ck-$name" log.dir="$tmp/log-$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
}
losses() { grep '^step ' "$tmp/$1.out" | grep -o 'loss [0-9.]*' | cut -d ' ' -f 2; }

run a100 sm90 CUDASIM_SM=80
rc=$?
expect "sm90 on the sim's A100: exit 1 ($rc), one line ($(head -n 1 "$tmp/a100.err")), no step" \
  "[ $rc -eq 1 ] && [ \$(wc -l <'$tmp/a100.err') -eq 1 ] && grep -q 'sm90 needs a GPU of compute capability 9.0' '$tmp/a100.err' &&
   ! grep -q '^step ' '$tmp/a100.out'"

run sm90 sm90 CUDASIM_SM=90
rc=$?
expect "sm90 on the sim's H100 trains 2 steps (exit $rc; $(tail -n 1 "$tmp/sm90.err"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/sm90.out') -eq 2 ]"
expect "sm90 runs the Hopper forward and not the mma.sync one" \
  "grep -q '^void flash_sm90_forward_kernel<64, 2, false>' '$tmp/sm90.counts' && ! grep -q '^void flash_forward_kernel' '$tmp/sm90.counts'"
expect "sm90 runs the Hopper backward and not the mma.sync one" \
  "grep -q '^void flash_sm90_backward_kernel<64, false>' '$tmp/sm90.counts' && ! grep -q '^void flash_backward_kernel' '$tmp/sm90.counts'"
expect "sm90's report names the Hopper forward and backward, chosen by attention.kernels ($(grep '^attention kernels' "$tmp/sm90.err"))" \
  "grep -q '^attention kernels on sm_90, head_dim 64: dense_fwd_sm90_d64_q64_k64_w12_s2 (attention.kernels: sm90), dense_bwd_sm90_d64_q64_k128_w12_s2 (attention.kernels: sm90); no sweep for sm_90 yet$' '$tmp/sm90.err'"

run sm80 sm80 CUDASIM_SM=90
run auto auto CUDASIM_SM=90
expect "auto on the sim's H100 runs the mma.sync forward" \
  "grep -q '^void flash_forward_kernel' '$tmp/auto.counts' && ! grep -q 'flash_sm90' '$tmp/auto.counts' &&
   grep -q '^attention kernels on sm_90, head_dim 64: dense_fwd_d64_q128_k64_w4_s2 (cost model' '$tmp/auto.err'"
paste <(losses sm90) <(losses sm80) >"$tmp/pairs"
expect "sm90's losses are sm80's within 1e-3 ($(tr '\t\n' '/ ' <"$tmp/pairs"))" \
  "[ \$(wc -l <'$tmp/pairs') -eq 2 ] && awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-3 * \$2) exit 1 }' '$tmp/pairs'"

attn=$SIM_SPARSE
run sparse90 sm90 CUDASIM_SM=90
rc=$?
expect "sparse under sm90 on the sim's H100 trains 2 steps (exit $rc; $(tail -n 1 "$tmp/sparse90.err"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/sparse90.out') -eq 2 ]"
expect "sparse under sm90 runs the Hopper sparse forward and not the mma.sync one ($(grep -o '^attention kernels.*' "$tmp/sparse90.err"))" \
  "grep -q '^void flash_sm90_sparse_forward_kernel<64, 1, false>' '$tmp/sparse90.counts' &&
   ! grep -q '^void sparse_forward_kernel' '$tmp/sparse90.counts' &&
   grep -q '^attention kernels on sm_90, head_dim 64: sparse_fwd_sm90_d64_q128_k64_w12_s2 (attention.kernels: sm90)' '$tmp/sparse90.err'"
run sparse80 sm80 CUDASIM_SM=90
paste <(losses sparse90) <(losses sparse80) >"$tmp/pairs"
expect "sparse: sm90's losses are sm80's within 1e-3 ($(tr '\t\n' '/ ' <"$tmp/pairs"))" \
  "[ \$(wc -l <'$tmp/pairs') -eq 2 ] && grep -q '^void sparse_forward_kernel' '$tmp/sparse80.counts' &&
   awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-3 * \$2) exit 1 }' '$tmp/pairs'"
[ $failures -eq 0 ]
