#!/usr/bin/env bash
# test_bench_train.sh: scripts/bench_train.sh and its transformers peer
# (scripts/bench_train_hf.py) without a GPU: the script refuses with one line
# and exit 1; the peer builds Qwen2ForCausalLM from a resolved run file and
# trains one step on the CPU at a tiny shape when transformers is installed
# (a "skip" line otherwise, and then the one line naming what is missing).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  skip bench_train_refuses "a GPU is visible (the script would benchmark)"
else
  bash scripts/bench_train.sh >"$tmp/out" 2>&1
  rc=$?
  expect bench_train_refuses "[ $rc -eq 1 ] && [ \$(wc -l <'$tmp/out') -eq 1 ] && grep -q 'no GPU visible' '$tmp/out'"
fi

build/mtrain config configs/tiny-cpu.yaml >"$tmp/config.yaml"
expect tiny_config_resolves "grep -q '^model:' '$tmp/config.yaml'"
/usr/bin/python3 scripts/bench_train_hf.py "$tmp/config.yaml" 64 2 cpu >"$tmp/hf" 2>&1
rc=$?
if /usr/bin/python3 -c 'import transformers' 2>/dev/null; then
  expect hf_peer_trains "[ $rc -eq 0 ] && grep -Eq '^hf_tokens_per_s [0-9]+$' '$tmp/hf' && \
    awk '\$1 == \"hf_loss\" { exit !(\$2 > 0 && \$2 < 100) }' '$tmp/hf'"
else
  skip hf_peer_trains "python3 has no transformers module (the peer needs it on the GPU machine)"
  expect hf_peer_names_missing "[ $rc -eq 2 ] && [ \$(wc -l <'$tmp/hf') -eq 1 ] && grep -q \"'transformers'\" '$tmp/hf'"
fi
exit $((failures > 0))
