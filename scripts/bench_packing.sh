#!/usr/bin/env bash
# bench_packing.sh: attention-work imbalance with packed documents, computed
# (no training): dp ranks under sequential and balanced packing (data.packing),
# and context-parallel ranks under the contiguous, zigzag and striped layouts,
# for log-normal document lengths in 32K-token sequences
# (tests/unit/test_packing.c, `measure`). Prints the markdown tables of
# docs/PERFORMANCE.md (Packed documents: attention work per rank).
#   bash scripts/bench_packing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/tests/test_packing
build/tests/test_packing measure
