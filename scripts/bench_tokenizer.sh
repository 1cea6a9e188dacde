#!/usr/bin/env bash
# bench_tokenizer.sh: throughput of `mtrain tokenize` with Qwen's tokenizer.json
# (byte-level BPE), on one core, over a few MB of real text found on any
# Debian machine: English (the copyright files under /usr/share/doc) and
# multilingual (translated man pages: ja, ko, zh, ru, uk, de, fr, es, pl, tr,
# as roff source). Prints MB of text per second for each; the time covers
# reading, encoding and writing the shard, not loading tokenizer.json.
#   scripts/bench_tokenizer.sh [MB per corpus, default 4]
set -eu  # no pipefail: `head` cuts the corpus pipelines short on purpose
cd "$(dirname "$0")/.."
mb=${1:-4}
bytes=$((mb * 1000000))
make -s build/mtrain
tok=$(bash scripts/fetch_qwen_tokenizer.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Only valid UTF-8 reaches the files (iconv -c drops the rest).
utf8() { iconv -c -f utf-8 -t utf-8 2>/dev/null || true; }
find /usr/share/doc -name copyright -print0 | sort -z | xargs -0 cat 2>/dev/null | head -c "$bytes" | utf8 >"$work/english.txt"
for lang in ja ko zh_CN ru uk de fr es pl tr; do
  [ -d "/usr/share/man/$lang" ] || continue
  find "/usr/share/man/$lang" -name '*.gz' -print0 | sort -z | xargs -0 zcat -f 2>/dev/null | head -c $((bytes / 10)) | utf8
done >"$work/multilingual.txt"

echo "tokenizer $tok"
echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), pinned to core 0"
for corpus in english multilingual; do
  out=$(taskset -c 0 build/mtrain tokenize --tokenizer "$tok" --input "$work/$corpus.txt" --output "$work/$corpus.shard")
  line=$(echo "$out" | head -n 1)
  echo "$corpus: $line"
done
