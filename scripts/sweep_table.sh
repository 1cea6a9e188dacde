#!/usr/bin/env bash
# sweep_table.sh: turns a GPU's sweep (gpu_sweep_attention's table; the GPU
# check leaves it in $OUT/sweep.tsv) into the trainer's choice of attention
# kernel variant for that GPU's architecture (attention/kernels/attn_choice.h):
# per kind and head dim, the variant with the most TFLOP/s among those within
# the bf16 bound at the sweep's longest causal shape (dense) or its sparse
# shape. Rows of other architectures are kept; this one's are replaced. A
# table from the sim or from small shapes is refused (nothing measured).
#   scripts/sweep_table.sh SWEEP.tsv [HEADER]   (HEADER: attention/kernels/attn_choice.h)
# Then rebuild (make) and commit the header with the sweep's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/sweep_table.sh SWEEP.tsv [HEADER]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
in=$1 header=${2:-attention/kernels/attn_choice.h}
[ -r "$in" ] || { echo "sweep_table.sh: cannot read $in (expected gpu_sweep_attention's table, e.g. OUT/sweep.tsv)" >&2; exit 2; }
[ -r "$header" ] || { echo "sweep_table.sh: cannot read $header (expected attn_choice.h with its ATTN_CHOICE_ROWS)" >&2; exit 2; }
device=$(sed -n 's/^# gpu_sweep_attention: //p' "$in")
arch=$(sed -n 's/^# arch sm_\([0-9][0-9]*\)$/\1/p' "$in")
if [ -z "$device" ] || [ -z "$arch" ]; then
  echo "sweep_table.sh: $in has no '# gpu_sweep_attention:' and '# arch sm_NN' lines (expected gpu_sweep_attention's table)" >&2
  exit 2
fi
case $device in
  *cudasim*|*"(small)"*) echo "sweep_table.sh: $in is from the sim or small shapes ($device): nothing measured to choose by" >&2; exit 2 ;;
esac
sweep="${device%%,*} $(date -u -r "$in" +%Y-%m-%d)"

rows=$(awk -F'\t' -v arch="$arch" -v sweep="$sweep" '
  $1 ~ /^#/ || $1 == "variant" || $15 != "ok" || $4 !~ /^(causal|sparse)_/ { next }
  { k = $2 SUBSEP $3; split($4, s, "_"); n = s[2] + 0
    if (n < longest[k]) next
    if (n > longest[k]) { longest[k] = n; best[k] = "" }
    if (best[k] == "" || $8 + 0 > tflops[k]) { best[k] = $1; tflops[k] = $8 + 0 } }
  END { kind["dense_fwd"] = "ATTN_DENSE_FORWARD"; kind["dense_bwd"] = "ATTN_DENSE_BACKWARD"
        kind["sparse_fwd"] = "ATTN_SPARSE_FORWARD"; kind["sparse_bwd"] = "ATTN_SPARSE_BACKWARD"
        for (k in best) { split(k, p, SUBSEP)
          printf "    {%d, %d, %s, \"%s\", %.1f, \"%s\"}, \\\n", arch, p[2], kind[p[1]], best[k], tflops[k], sweep } }' "$in" | sort)
[ -n "$rows" ] || { echo "sweep_table.sh: $in has no variant within the bound at a causal or sparse shape" >&2; exit 1; }
kept=$(grep -E '^    \{[0-9]+, ' "$header" | grep -vE "^    \{$arch, " || true)
{
  sed '/^#define ATTN_CHOICE_ROWS/,$d' "$header"
  echo '#define ATTN_CHOICE_ROWS \'
  printf '%s\n' "$kept" "$rows" | sed '/^$/d' | sort
  echo
} >"$header.tmp"
mv "$header.tmp" "$header"
echo "sweep_table.sh: $(printf '%s\n' "$rows" | wc -l) choices for sm_$arch from $sweep into $header"
