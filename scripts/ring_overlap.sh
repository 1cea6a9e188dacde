#!/usr/bin/env bash
# ring_overlap.sh: the ring's overlap on paper for a run file: per layer and
# ring step, flat and hierarchical, attention compute (dense and sparse), K/V
# and dK/dV bytes (ring_send full and selected), transfer time on NVLink and
# the network, and whether compute hides it (`mtrain plan RUN.yaml --ring`;
# docs/PLANNER.md names one run of it).
#   bash scripts/ring_overlap.sh RUN.yaml [--density D] [--gpu NAME] [section.key=value ...]
#   MTRAIN=path/to/mtrain (default build/mtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/ring_overlap.sh RUN.yaml [--density D] [--gpu NAME] [section.key=value ...]" >&2
  exit 2
fi
exec "${MTRAIN:-build/mtrain}" plan "$1" --ring "${@:2}"
