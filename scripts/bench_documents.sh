#!/usr/bin/env bash
# bench_documents.sh: dense causal attention on the CPU with packed documents
# against the same problem without, at 32K tokens, forward and backward, as
# ratios next to the ideal Σ L(L+1)/2 ÷ N(N+1)/2 (scripts/bench_documents.c).
# Prints the markdown table of docs/PERFORMANCE.md (Dense attention with
# documents, CPU).
#   bash scripts/bench_documents.sh [tokens]
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/bench/bench_documents
echo "device: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo
build/bench/bench_documents "$@"
