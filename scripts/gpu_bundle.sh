#!/usr/bin/env bash
# gpu_bundle.sh: packs gpu-bundle/ from the programs `make gpu-bundle` built
# in build/bundle/ (Makefile, "make gpu-bundle"): everything a GPU machine
# without the project's libraries needs to run the GPU check, with no
# compiling there. gpu-bundle/ holds
#   run                  the entry (scripts/gpu_bundle_unpack.sh): unpacks the
#                        archive into a temporary folder and runs a command there
#   mtrain-gpu.tar.gz    mtrain-gpu/ with
#     run                the launcher (scripts/gpu_bundle_launch.sh): cuBLASLt
#                        and NCCL from python3's site-packages, then bin/ or scripts/
#     bin/               mtrain (CUDA backend, single-rank MPI), gpu_test_*, gpu_bench_*
#     lib/               libcjson.so.1 (the programs' rpath is $ORIGIN/../lib)
#     configs/           the run files
#     scripts/           gpu_check.sh and the benchmarks it runs
#     data/docs.shard    a small shard: the project's docs as bytes
#     GLIBC              the newest glibc symbol version the programs need
# The archive keeps the bundle under 60 MiB (OpenBLAS, linked statically
# into four programs, compresses well). Prints the bundle's size; more than
# 60 MiB is an error.
#   make gpu-bundle                  (packs when an input changed, then --size)
#   scripts/gpu_bundle.sh [--size]   pack; --size: only print and check the size
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((60 * 1024 * 1024))
stage=build/bundle/mtrain-gpu

# The size of gpu-bundle/, printed; more than the limit is an error.
print_size() {
  local size
  size=$(du -sb gpu-bundle | cut -f1)
  echo "gpu-bundle/: $(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }') MiB ($size bytes; unpacked" \
       "$(du -sm "$stage" | cut -f1) MiB; programs need glibc $(cat "$stage/GLIBC"))"
  if [ "$size" -gt "$limit" ]; then
    echo "gpu_bundle.sh: gpu-bundle/ is $size bytes (expected at most 60 MiB = $limit bytes)" >&2
    exit 1
  fi
}
if [ "${1:-}" = --size ]; then print_size; exit 0; fi

rm -rf "$stage"
mkdir -p "$stage"/{bin,lib,configs,scripts,data}
cp build/bundle/bin/* "$stage/bin/"
cp -L build/bundle/lib/libcjson.so.1 "$stage/lib/"
cp configs/*.yaml "$stage/configs/"
cp scripts/gpu_check.sh scripts/bench_attention.sh scripts/bench_attention.py scripts/bench_train.sh \
   scripts/bench_train_hf.py "$stage/scripts/"
cp scripts/gpu_bundle_launch.sh "$stage/run"
objdump -T "$stage"/bin/* | grep -oE 'GLIBC_[0-9.]+' | sed 's/GLIBC_//' | sort -uV | tail -n 1 >"$stage/GLIBC"
# The shard with the bundle's own mtrain: the launcher finds cuBLASLt and NCCL here too.
"$stage/run" mtrain tokenize --tokenizer bytes --input README.md docs/*.md --output "$stage/data/docs.shard" >/dev/null

mkdir -p gpu-bundle
tar -czf gpu-bundle/mtrain-gpu.tar.gz.tmp -C build/bundle mtrain-gpu
mv gpu-bundle/mtrain-gpu.tar.gz.tmp gpu-bundle/mtrain-gpu.tar.gz
cp scripts/gpu_bundle_unpack.sh gpu-bundle/run.tmp
mv gpu-bundle/run.tmp gpu-bundle/run
