#!/usr/bin/env bash
# demo.sh: `make demo`: train configs/demo-cpu.yaml from scratch on 2 MPI
# ranks (one context-parallel group: each rank holds half of every sequence
# and attention runs over the ring), then show that the model learned:
# validation loss before and after (against the uniform guess ln(vocab)), the
# checkpoint written, and a PNG of the loss curve.
#   DEMO_RANKS=N scripts/demo.sh [section.key=value ...]   (default 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf demo
mkdir -p demo
ranks=${DEMO_RANKS:-2}
source scripts/cpu_ranks.sh
attention=$(sed -n 's/^  type: *\([a-z]*\).*/\1/p' configs/demo-cpu.yaml)
echo "== training configs/demo-cpu.yaml on $ranks MPI ranks (cp = $ranks; CPU, $(nproc) cores)"
echo "   attention: $attention, over the ring of the $ranks ranks"
run_ranks "$ranks" train configs/demo-cpu.yaml "$@"

metrics=demo/metrics.jsonl
val() { grep '"val_loss"' "$metrics" | sed -n "$1p" | sed 's/.*"val_loss": \([0-9.e+-]*\).*/\1/'; }
before=$(val 1)
after=$(val '$')
uniform=$(awk 'BEGIN { printf "%.4f", log(256) }')
grep '"loss"' "$metrics" | sed 's/{"step": \([0-9]*\), "loss": \([0-9.e+-]*\),.*/\1 \2/' >demo/train_loss.dat
grep '"val_loss"' "$metrics" | sed 's/{"step": \([0-9]*\), "val_loss": \([0-9.e+-]*\).*/\1 \2/' >demo/val_loss.dat
gnuplot <<GP
set terminal pngcairo size 900,500
set output 'demo/loss.png'
set title 'mtrain demo: tiny Qwen2 on synthetic data, $attention attention over a ring of $ranks MPI ranks (CPU)'
set xlabel 'step'
set ylabel 'cross entropy (nats)'
set grid
plot 'demo/train_loss.dat' with lines lw 2 title 'train loss', \
     'demo/val_loss.dat' with linespoints lw 2 pt 7 title 'validation loss', \
     $uniform with lines dt 2 title 'uniform guess ln(256)'
GP
echo
echo "== result"
echo "validation loss: $before before training -> $after after (uniform guess: $uniform)"
echo "checkpoint:      demo/checkpoints/$(cat demo/checkpoints/latest) (a Hugging Face folder)"
echo "loss curve:      demo/loss.png"
awk -v b="$before" -v a="$after" 'BEGIN { if (a < 0.6 * b) { print "the model learned: validation loss fell by " int(100 * (1 - a / b)) "%"; exit 0 } print "the model did NOT learn"; exit 1 }'
