#!/usr/bin/env bash
# bench_sparse_cpu.sh: one layer's attention forward + backward on the CPU,
# dense kernel against the sparse kernel at 16K and 32K tokens, ~90% and ~95%
# sparsity (scripts/bench_sparse_cpu.c). Prints a markdown table for
# docs/PERFORMANCE.md.
#   scripts/bench_sparse_cpu.sh [tokens ...]
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/bench/bench_sparse_cpu
echo "device: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
echo
build/bench/bench_sparse_cpu "$@"
