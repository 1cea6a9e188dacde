#!/usr/bin/env bash
# kernel_resources.sh: the static resources of every CUDA kernel, as nvcc
# builds it for the A100 (sm_80) and the H100 (sm_90), and the theoretical
# occupancy of the launch the host code makes. Needs nvcc, not a GPU.
#   scripts/kernel_resources.sh [--arch sm_80|sm_90|all] [--markdown | --check] [FILE.cu ...]
# Default: every .cu of the project (the Makefile's CU_SRC), both archs.
# Each file is compiled once for the chosen archs (device code only, the
# Makefile's -O3 -std=c++17) with `-Xptxas -v` (registers, spill stores and
# loads, static shared memory per kernel) and its PTX kept (`.maxntid` and
# `.minnctapersm`: __launch_bounds__).
# Output (default): a TSV, one header line, tab separated:
#   arch kernel registers spill_bytes static_smem max_threads min_blocks occupancy
# kernel is the mangled name; spill_bytes = spill stores + spill loads bytes;
# max_threads from __launch_bounds__ (1024 without); min_blocks from
# __launch_bounds__ (0 without); occupancy = resident warps / 64 per SM for the
# host code's launch ("-": the host code never launches this kernel on that
# GPU).
# --markdown: the same as a table with demangled, shortened names, the launch
# (threads, dynamic shared memory) and the resident CTAs per SM.
# --check: "ok NAME" / "FAIL NAME: why" per kernel and arch (tests/run.sh
# format): no spills (CUB's own kernels: at most 16 bytes); static + dynamic
# shared memory within the GPU's per-block opt-in limit where launched, and
# within the 48 KiB default where the host code does not raise it
# (cudaFuncSetAttribute); registers x threads within the 65536 registers of
# an SM; threads within __launch_bounds__.
# A kernel missing from the launch table below gets occupancy "?", one line on
# stderr (--check: a FAIL) and exit status 1; --check over every source also
# fails a row of the table that no kernel matches.
#
# The launch table (launch_table) holds, per kernel, the block size and the
# dynamic shared memory its host code uses, written as the host code computes
# them from the same constants (tile shapes per head dim, block sizes); each
# row names the host function. Keep it in step with the .cu files:
# tests/repo/test_kernel_resources.sh fails when a compiled kernel has no row.
set -euo pipefail
cd "$(dirname "$0")/.."

NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
arch=all
mode=tsv
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=${2:-}; shift; [ $# -eq 0 ] || shift ;;
    --markdown) mode=markdown; shift ;;
    --check) mode=check; shift ;;
    -*) echo "kernel_resources.sh: unknown option '$1' (expected --arch, --markdown, --check)" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
case "$arch" in
  sm_80) archs=(80) ;;
  sm_90) archs=(90) ;;
  all) archs=(80 90) ;;
  *) echo "kernel_resources.sh: --arch '$arch' (expected sm_80, sm_90 or all)" >&2; exit 2 ;;
esac
all_files=0
if [ ${#files[@]} -eq 0 ]; then
  all_files=1
  shopt -s nullglob
  files=(attention/*/*.cu model/*.cu dist/*.cu)
  shopt -u nullglob
  [ ${#files[@]} -gt 0 ] || { echo "kernel_resources.sh: no .cu file in attention/, model/, dist/" >&2; exit 2; }
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "kernel_resources.sh: $f: no such file (expected a .cu source)" >&2; exit 2; }
done
[ -x "$NVCC" ] || { echo "kernel_resources.sh: nvcc not found (PATH or /usr/local/cuda/bin/nvcc)" >&2; exit 2; }

# ---- launch table ----
# Bytes of the dynamic shared memory each host function requests (bf16 = 2
# bytes, int64 = 8, fp32 = 4; rows padded to D + 8 elements).
flash_forward_smem() {   # flash_cuda.cu forward(): (BM + 2 BN) D bf16 (swizzled, no padding)
                         # + (BN + BM, + BM with documents: DOCS 1) int64 + BM fp32, BM = FWD_BM = 128
  local D=$1 BN=$2 DOCS=$3; echo $(((128 + 2 * BN) * D * 2 + (BN + 128 * (1 + DOCS)) * 8 + 128 * 4)); }
flash_backward_smem() {  # flash_cuda.cu backward_smem(): (2 BN + 3 BM) D + 2 BN BM bf16 (swizzled, no padding)
                         # + BN int64 + 2 BM (2 fp32 + int64, + int64 with documents: DOCS 1), BN = BWD_BN = 128
  local D=$1 BM=$2 DOCS=$3
  echo $(((2 * 128 + 3 * BM) * D * 2 + 2 * 128 * BM * 2 + 128 * 8 + 2 * BM * (16 + 8 * DOCS))); }
sparse_forward_smem() {  # sparse_cuda.cu forward_launch(): (BM + 2 KEY_TILE) D bf16 (swizzled) + (4 KEY_TILE
                         # + BM, + BM with documents: DOCS 1) int64 + BM fp32, KEY_TILE = 64
  local D=$1 BM=$2 DOCS=$3; echo $(((BM + 2 * 64) * D * 2 + (4 * 64 + BM * (1 + DOCS)) * 8 + BM * 4)); }
sparse_blocks_smem() {   # sparse_cuda.cu backward_blocks_smem<D, B, DOCS>(): (2 B + 3 BM) D + 2 B BM bf16 (swizzled)
                         # + (B + 3 BM) int64 + 2 BM (2 fp32 + int64, + int64 with documents: DOCS 1) + 2 BM / 32 int,
                         # BM = 128 at D 64, 64 at D 128
  local D=$1 B=$2 DOCS=$3 BM=$(($1 == 64 ? 128 : 64))
  echo $(((2 * B + 3 * BM) * D * 2 + 2 * B * BM * 2 + (B + 3 * BM) * 8 + 2 * BM * (16 + 8 * DOCS) + BM / 16 * 4)); }
sparse_columns_smem() {  # sparse_cuda.cu backward_columns_smem<D, BM, KVBUF>()
  local D=$1 BM=$2 KVBUF=$3
  echo $(((2 * BM + 2 * KVBUF * 64) * (D + 8) * 2 + 2 * BM * 72 * 2 + 2 * KVBUF * 64 * 8)); }
sm90_forward_smem() {   # flash_sm90.cu attn_dense_forward_sm90(): Sm90Smem<D, C>::BYTES + 1024 of alignment: C Q boxes and
                         # 2 stages of K and V boxes of 8192 bytes (D / 64 boxes each), 2 x 64 int64 key positions,
                         # 2 int flags (to 8 bytes), 5 mbarriers
  local D=$1 C=$2; echo $(((C + 4) * (D / 64) * 8192 + 1024 + 8 + 40 + 1024)); }
sm90_sparse_forward_smem() {  # flash_sm90_sparse.cu sparse_forward_sm90(): Sm90SparseSmem<D, C>::BYTES + 1024 of
                         # alignment: the dense forward's layout and 128 int64 gathered key tokens
  local D=$1 C=$2; echo $(($(sm90_forward_smem $D $C) + 128 * 8)); }
sm90_backward_smem() {  # flash_sm90_backward.cu backward_sm90(): Sm90BackwardSmem<D>::BYTES + 1024 of alignment: 2 consumers'
                         # K and V boxes and 2 stages of Q and dO boxes (8192 bytes, D / 64 boxes each), dS^T 2 x 64 x 72
                         # bf16, 2 stages x 64 rows of lse, delta (fp32), positions, document starts (int64), 2 first
                         # rows, 2 heads, 2 x 2 flags, 7 mbarriers
  local D=$1; echo $((8 * (D / 64) * 8192 + 2 * 64 * 72 * 2 + 2 * 64 * (4 + 4 + 8 + 8) + 16 + 8 + 16 + 56 + 1024)); }
est_smem() {             # sparse_select_cuda.cu est_smem(D): EST_KEYS = EST_MAX_Q = 128, EST_Q_CHUNK = 64
  local D=$1; echo $(((128 + 128) * 8 + (64 + 128) * (D + 1) * 4 + 128 * (64 + 4) * 4)); }

# One row per kernel: name (a glob over the demangled name without "void "
# and parameters), threads per block ("bounds": its __launch_bounds__),
# dynamic shared memory bytes, whether the host raises the limit with
# cudaFuncSetAttribute (optin / default), and the GPUs it is launched on
# (all, sm_80, sm_90, none).
launch_table() {
  local D
  # flash_cuda.cu: forward FWD_BM = 128 queries (4 warps of 32) x FWD_BN = 64 keys, __launch_bounds__(128, 2);
  # backward BWD_BN = 128 keys (8 warps, __launch_bounds__(256, 1)) x Tiles<64> 128, Tiles<128> 64 queries.
  row 'tile_bounds_kernel' 128 0 default all            # tile_bounds()
  row 'fill_kernel' 256 0 default all                   # attn_forward_init_cuda()
  row 'delta_kernel' 256 0 default all                  # attn_backward_delta_cuda()
  # Each with and without documents (the last template argument).
  row 'doc_first_kernel' 128 0 default all              # attn_doc_first_cuda()
  local docs
  for docs in false true; do
    local d=$([ $docs = true ] && echo 1 || echo 0)
    row "flash_forward_kernel<64, 64, $docs>" 128 "$(flash_forward_smem 64 64 $d)" optin all
    row "flash_forward_kernel<128, 64, $docs>" 128 "$(flash_forward_smem 128 64 $d)" optin all
    row "flash_backward_kernel<64, 128, $docs>" 256 "$(flash_backward_smem 64 128 $d)" optin all
    row "flash_backward_kernel<128, 64, $docs>" 256 "$(flash_backward_smem 128 64 $d)" optin all
  done
  # flash_sm90.cu and flash_sm90_sparse.cu: 128 (C + 1) threads (a producer and C consumer warpgroups; sparse:
  # C = B / 64), flash_sm90_backward.cu: 384 (C = 2), launched only on sm_90. The Makefile builds these files for
  # sm_90a; this script compiles sm_90, where their kernels are the guard's empty stub (their registers here are
  # not the real ones: ptxas on sm_90a reports 168-240 and 40-56 spill bytes for the forward, 168-208 and none
  # for the sparse forward, 168 and none for the backward).
  for docs in false true; do
    for D in 64 128; do
      row "flash_sm90_forward_kernel<$D, 1, $docs>" 256 "$(sm90_forward_smem $D 1)" optin sm_90
      row "flash_sm90_forward_kernel<$D, 2, $docs>" 384 "$(sm90_forward_smem $D 2)" optin sm_90
      row "flash_sm90_backward_kernel<$D, $docs>" 384 "$(sm90_backward_smem $D)" optin sm_90
      row "flash_sm90_sparse_forward_kernel<$D, 1, $docs>" 256 "$(sm90_sparse_forward_smem $D 1)" optin sm_90
      row "flash_sm90_sparse_forward_kernel<$D, 2, $docs>" 384 "$(sm90_sparse_forward_smem $D 2)" optin sm_90
    done
  done
  # sparse_cuda.cu: the forward BM threads (warps of 32 queries), __launch_bounds__(BM, 256 / BM); the
  # backward's blocks B / 16 warps (key-major, B = 64 or 128), its columns 2 BM (B = BM), double-buffering
  # K/V where the device's opt-in limit allows it (D 128, B 128: H100 yes, A100 no).
  row 'local_block_kernel' 128 0 default all            # chunk_view()
  row 'column_count_kernel' 256 0 default all           # chunk_view()
  row 'column_fill_kernel' 256 0 default all            # chunk_view()
  row 'key_major_kernel<false>' 256 0 default all       # key_major_blocks()
  row 'key_major_kernel<true>' 256 0 default all        # key_major_blocks()
  # Each with and without documents (the last template argument).
  for docs in false true; do
    local d=$([ $docs = true ] && echo 1 || echo 0)
    for D in 64 128; do
      row "sparse_forward_kernel<$D, 64, $docs>" 64 "$(sparse_forward_smem $D 64 $d)" optin all
      row "sparse_forward_kernel<$D, 128, $docs>" 128 "$(sparse_forward_smem $D 128 $d)" optin all
      row "sparse_backward_blocks_kernel<$D, 64, $docs>" 128 "$(sparse_blocks_smem $D 64 $d)" optin all
      row "sparse_backward_blocks_kernel<$D, 128, $docs>" 256 "$(sparse_blocks_smem $D 128 $d)" optin all
      row "sparse_backward_columns_kernel<$D, 64, 2, $docs>" 128 "$(sparse_columns_smem $D 64 2)" optin all
    done
    row "sparse_backward_columns_kernel<64, 128, 2, $docs>" 256 "$(sparse_columns_smem 64 128 2)" optin all
    row "sparse_backward_columns_kernel<128, 128, 2, $docs>" 256 "$(sparse_columns_smem 128 128 2)" optin sm_90
    row "sparse_backward_columns_kernel<128, 128, 1, $docs>" 256 "$(sparse_columns_smem 128 128 1)" optin sm_80
  done
  # sparse_select_cuda.cu: EST_THREADS = 64 threads, SEL_THREADS = 256. index_row_kernel's bitmap
  # is one bit per key block of the sequence: (N / B / 32 + 1) words, here N = 1M tokens, B = 64.
  for D in 64 128; do
    row "est_lse_kernel<$D>" 64 "$(est_smem $D)" optin all
    row "est_scores_kernel<$D>" 64 "$(est_smem $D)" optin all
  done
  # model/ops_cuda.cu: THREADS = 256 everywhere; the RMSNorm backward's dweight sums take H fp32 of
  # dynamic shared memory, at most RMSNORM_BWD_MAX_H = 8192.
  for k in embedding_forward embedding_backward rmsnorm_forward add_column_sums rope swiglu_forward \
           swiglu_backward sum_squares add_sum cross_entropy adamw; do
    row "${k}_kernel" 256 0 default all
  done
  row 'rmsnorm_backward_kernel' 256 $((8192 * 4)) default all   # rmsnorm_backward_cuda()
  row 'est_lse_merge_kernel' 256 0 default all
  row 'select_keys_kernel' 256 0 default all
  row 'select_take_kernel' 32 0 default all
  row 'select_mark_kernel' 256 0 default all
  row 'select_gather_kernel' 256 0 default all
  row 'segment_offsets_kernel' 256 0 default all      # the selection's segment offsets
  row 'query_blocks_kernel' 256 0 default all         # sparse_query_blocks_cuda(): query blocks from the positions
  row 'index_row_kernel<false>' 256 $(((1048576 / 64 / 32 + 1) * 4)) optin all
  row 'index_row_kernel<true>' 256 $(((1048576 / 64 / 32 + 1) * 4)) optin all
  # dist/cuda_elementwise.cuh (in ops_cuda.cu, flash_cuda.cu, attention_cuda_op.cu): ELEMENTWISE_THREADS = 256.
  row 'convert_kernel<*' 256 0 default all              # launch_convert()
  row 'add_into_kernel<*' 256 0 default all             # launch_add_into()
  # ring_rows_cuda.cu: ELEMENTWISE_THREADS = 256 (dist/cuda_elementwise.cuh).
  row 'move_rows_kernel' 256 0 default all
  row 'add_rows_kernel' 256 0 default all
  row 'combine_lse_kernel' 256 0 default all          # ring_combine_lse_cuda()
  # ring_columns_cuda.cu: ELEMENTWISE_THREADS = 256 (dist/cuda_elementwise.cuh).
  row 'estimation_init_kernel' 256 0 default all      # ring_estimation_init_cuda()
  row 'index_bits_kernel' 256 0 default all           # ring_index_bits_cuda()
  row 'columns_mark_kernel' 256 0 default all         # ring_columns_plan_cuda()
  row 'columns_flag_kernel' 256 0 default all         # ring_columns_plan_cuda()
  row 'columns_fill_kernel' 256 0 default all         # ring_columns_plan_cuda()
  # matmul_cuda.cu: the bias gradient, BIAS_COLS x BIAS_WARPS = 32 x 8 and BIAS_SUM_THREADS = 256 (bias_grad_cuda()).
  row 'bias_grad_partial_kernel' 256 0 default all
  row 'bias_grad_sum_kernel' 256 0 default all
  # CUB (DeviceScan, DeviceSegmentedRadixSort): the agent kernels launch with their policy's
  # BLOCK_THREADS (= their __launch_bounds__) and static shared memory only; the scan's init
  # kernel with INIT_KERNEL_THREADS = 128 (cub/device/dispatch/dispatch_scan.cuh); EmptyKernel
  # is only instantiated (CUB reads its PTX version), never launched.
  row 'cub::*::DeviceScanKernel<*' bounds 0 default all
  row 'cub::*::DeviceScanInitKernel<*' 128 0 default all
  row 'cub::*::DeviceSegmentedRadixSortKernel<*' bounds 0 default all
  row 'cub::*EmptyKernel<void>' 0 0 default none
}
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@"; }

# ---- compile: ptxas reports and PTX of every file, both archs ----
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gencode=()
for a in "${archs[@]}"; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
compile() {   # compile FILE INDEX: $tmp/INDEX/{ptxas.log, *.ptx}
  mkdir -p "$tmp/$2"
  if ! "$NVCC" -O3 -std=c++17 "${gencode[@]}" -Xptxas -v -keep -keep-dir "$tmp/$2" -fatbin "$1" \
       -o "$tmp/$2/out.fatbin" >"$tmp/$2/ptxas.log" 2>&1; then
    echo "kernel_resources.sh: nvcc failed on $1:" >&2
    grep -v '^ptxas info' "$tmp/$2/ptxas.log" | head -n 20 >&2
    return 1
  fi
}
pids=()
for i in "${!files[@]}"; do
  compile "${files[$i]}" "$i" &
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done

# Per (arch, kernel): registers, spill bytes, static smem (ptxas) ...
cat "$tmp"/*/ptxas.log | awk '
  /Compiling entry function/ { split($0, q, "\047"); name = q[2]; arch = q[4]; spill = 0 }
  /bytes spill stores/ { spill = $5 + $9 }
  /ptxas info *: Used [0-9]+ registers/ && name != "" {
    regs = 0; smem = 0
    for (i = 1; i < NF; i++) {
      if ($(i + 1) ~ /^registers/) regs = $i
      if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem = $i
    }
    print arch "\t" name "\t" regs "\t" spill "\t" smem; name = ""
  }' | sort -u >"$tmp/ptxas.tsv"
# ... and __launch_bounds__ (PTX .maxntid, .minnctapersm).
for f in "$tmp"/*/*.ptx; do
  a=sm_${archs[0]}                         # one arch: FILE.ptx; several: FILE.compute_NN.ptx
  case "$f" in *.compute_*.ptx) a=${f##*.compute_}; a=sm_${a%.ptx} ;; esac
  awk -v arch="$a" '
    /\.entry / { name = $0; sub(/.*\.entry[ \t]+/, "", name); sub(/[( \t].*/, "", name); nt = 1024; mb = 0 }
    /^[ \t]*\.maxntid/ && name != "" { gsub(/[^0-9 ]/, " "); nt = $1 * $2 * $3 }
    /^[ \t]*\.minnctapersm/ && name != "" { mb = $2 + 0 }
    /^[ \t]*\{/ && name != "" { print arch "\t" name "\t" nt "\t" mb; name = "" }' "$f"
done | sort -u >"$tmp/bounds.tsv"
join -t $'\t' <(awk -F'\t' '{print $1 "|" $2 "\t" $3 "\t" $4 "\t" $5}' "$tmp/ptxas.tsv" | sort) \
              <(awk -F'\t' '{print $1 "|" $2 "\t" $3 "\t" $4}' "$tmp/bounds.tsv" | sort) |
  sed 's/|/\t/' | sort -t $'\t' -k2,2 -k1,1 >"$tmp/kernels.tsv"
if [ "$(wc -l <"$tmp/kernels.tsv")" -ne "$(wc -l <"$tmp/ptxas.tsv")" ]; then
  echo "kernel_resources.sh: the PTX and ptxas's report do not name the same kernels" >&2
  exit 1
fi

# Demangled names: "void " and the parameter list dropped (the key of the
# launch table); the display name also drops CUB's versioned namespaces and
# keeps the first two of a CUB kernel's template arguments.
cut -f2 "$tmp/kernels.tsv" | c++filt | awk '
  {
    s = $0; sub(/^void /, "", s); d = 0
    for (i = 1; i <= length(s); i++) {
      c = substr(s, i, 1)
      if (c == "<") d++; else if (c == ">") d--; else if (c == "(" && d == 0) { s = substr(s, 1, i - 1); break }
    }
    key = s
    gsub(/CUB_[0-9A-Z_]+::|detail::|cuda::std::__[0-9]+::/, "", s)
    if (s ~ /^cub::/) {
      out = ""; d = 0; args = 0
      for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "<") { d++; if (d == 2) { out = out "<…>"; continue } }
        else if (c == ">") { d--; if (d == 1) continue }
        else if (c == "," && d == 1 && ++args == 2) { out = out ", …>"; break }
        if (d < 2) out = out c
      }
      s = out
    }
    print key "\t" s
  }' >"$tmp/names.tsv"

# ---- join with the launch table, occupancy, output ----
launch_table >"$tmp/launch.tsv"
: >"$tmp/matched"
paste "$tmp/kernels.tsv" "$tmp/names.tsv" | while IFS=$'\t' read -r a name regs spill smem nt mb key short; do
  launch=$'?\t?\t?\t?'
  while IFS=$'\t' read -r pat threads dyn limit on; do
    # shellcheck disable=SC2053  # pat is a glob
    if [[ $key == $pat ]]; then
      [ "$threads" = bounds ] && threads=$nt
      launch="$threads"$'\t'"$dyn"$'\t'"$limit"$'\t'"$on"
      echo "$pat" >>"$tmp/matched"
      break
    fi
  done <"$tmp/launch.tsv"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$a" "$name" "$regs" "$spill" "$smem" "$nt" "$mb" "$short" "$launch"
done | sort -t $'\t' -k8,8 -k1,1 >"$tmp/all.tsv"
# --check over every source: a row that no kernel matches is stale.
if [ "$mode" = check ] && [ "$all_files" = 1 ]; then
  cut -f1 "$tmp/launch.tsv" | while IFS= read -r pat; do
    if grep -qxF -- "$pat" "$tmp/matched"; then echo "ok launch_table_used $pat"
    else echo "FAIL launch_table_used $pat: no kernel of the sources matches this row of the launch table"; fi
  done
fi

# Limits of one SM and one CTA, from the CUDA C++ Programming Guide, "Compute
# Capabilities", table "Technical Specifications per Compute Capability"
# (8.0 = A100, 9.0 = H100): 65536 32-bit registers per SM, at most 255 per
# thread; 64 resident warps and 32 resident CTAs per SM; shared memory per SM
# 164 KiB (8.0) / 228 KiB (9.0), per CTA 48 KiB by default and 163 KiB (8.0) /
# 227 KiB (9.0) when raised with cudaFuncSetAttribute. The allocation units
# are the CUDA Occupancy Calculator's for 8.x/9.0 (as cudaOccupancy* computes
# them): registers in units of 256 per warp, shared memory in units of 128
# bytes, plus 1 KiB per CTA reserved by the system (the device attribute
# cudaDevAttrReservedSharedMemoryPerBlock).
awk -F'\t' -v mode="$mode" '
  function ceil_to(x, u) { return int((x + u - 1) / u) * u }
  BEGIN {
    smem_sm["sm_80"] = 164 * 1024; optin["sm_80"] = 163 * 1024
    smem_sm["sm_90"] = 228 * 1024; optin["sm_90"] = 227 * 1024
    gpu["sm_80"] = "A100"; gpu["sm_90"] = "H100"
    if (mode == "tsv") print "arch\tkernel\tregisters\tspill_bytes\tstatic_smem\tmax_threads\tmin_blocks\toccupancy"
    if (mode == "markdown") {
      print "| arch | kernel | registers | spill bytes | static smem | dynamic smem | threads | launch bounds | CTAs/SM | occupancy |"
      print "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"
    }
  }
  {
    a = $1; name = $2; regs = $3; spill = $4; smem = $5; nt = $6; mb = $7; short = $8
    threads = $9; dyn = $10; limit = $11; on = $12
    label = short " [" a "]"
    if (threads == "?") {
      print "kernel_resources.sh: " short " (" name ") has no row in the launch table" > "/dev/stderr"
      missing = 1
      if (mode == "check") print "FAIL launch_table " label ": no row (block size, dynamic shared memory)"
      occ = "?"; ctas = "?"
    } else if (on != "all" && on != a) {
      occ = "-"; ctas = "-"
    } else {
      wpb = int((threads + 31) / 32)
      by_warps = int(64 / wpb); if (by_warps > 32) by_warps = 32
      by_regs = int(65536 / (ceil_to(regs * 32, 256) * wpb))
      by_smem = int(smem_sm[a] / ceil_to(smem + dyn + 1024, 128))
      ctas = by_warps; if (by_regs < ctas) ctas = by_regs; if (by_smem < ctas) ctas = by_smem
      occ = sprintf("%.3f", ctas * wpb / 64)
    }
    if (mode == "tsv") printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a, name, regs, spill, smem, nt, mb, occ
    if (mode == "markdown") {
      bounds = nt == 1024 && mb == 0 ? "-" : nt (mb ? ", " mb : "")
      pct = occ ~ /^[0-9.]+$/ ? sprintf("%d%%", occ * 100 + 0.5) : occ
      printf "| %s | `%s` | %d | %d | %d | %s | %s | %s | %s | %s |\n", a, short, regs, spill, smem, dyn,
             on == "none" ? "-" : threads, bounds, ctas, pct
    }
    if (mode == "check" && threads != "?") {
      if (short ~ /^cub::/) {
        # CUB kernels follow the tuning policies of CUB (the int64 scan of
        # CUB 3.0 spills 8 bytes on sm_90): a few bytes allowed, more fails.
        if (spill <= 16) print "ok library_spill " label ": " spill " bytes (CUB, at most 16)"
        else print "FAIL library_spill " label ": " spill " bytes spilled (CUB, at most 16)"
      } else if (spill == 0) print "ok no_spill " label
      else print "FAIL no_spill " label ": " spill " bytes spilled (stores + loads)"
      if (on == "all" || on == a) {
        cap = limit == "optin" ? optin[a] : 48 * 1024
        if (smem + dyn <= cap) print "ok smem " label
        else print "FAIL smem " label ": " smem " static + " dyn " dynamic bytes > " cap " (" gpu[a] ", " limit ")"
        if (regs * threads <= 65536) print "ok registers " label
        else print "FAIL registers " label ": " regs " registers x " threads " threads > 65536"
        if (threads <= nt) print "ok launch_bounds " label
        else print "FAIL launch_bounds " label ": " threads " threads > __launch_bounds__ " nt
      }
    }
  }
  END { exit missing }' "$tmp/all.tsv"
