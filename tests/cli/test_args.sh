#!/usr/bin/env bash
# test_args.sh: the verbs' arguments through trainer/args.c: help, an option
# without its value, an unknown option (one rule for every verb) or argument,
# a bad number, the --input list, options valid for one shard action only,
# and a run file's overrides among the options; each error one line with
# exit status 2. Prints "ok NAME" / "FAIL NAME: why".
#   MTRAIN=path/to/mtrain bash tests/cli/test_args.sh   (default build/mtrain)
set -uo pipefail
cd "$(dirname "$0")/../.."
mtrain=$(realpath "${MTRAIN:-build/mtrain}")
. tests/lib/lib.sh
cd "$tmp"

# usage_error NAME MESSAGE ARGS...: mtrain ARGS exits 2 with "mtrain: MESSAGE"
# as the first line of stderr.
usage_error() {
  local name=$1 message=$2; shift 2
  "$mtrain" "$@" >out.txt 2>err.txt
  local rc=$? first
  first=$(head -n 1 err.txt)
  if [ "$rc" -ne 2 ]; then bad "$name" "exited $rc (expected 2)"
  elif [ "$first" != "mtrain: $message" ]; then bad "$name" "first line '$first' (expected 'mtrain: $message')"
  else ok "$name"; fi
}

printf 'hello world\n' >a.txt
printf 'other doc' >b.txt
cat >run.yaml <<YAML
model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, vocab_size: 258}
attention: {block_size: 16}
train: {steps: 2, seq_len: 4, micro_batches: 1}
data: {train: $tmp/c.shard}
YAML

for verb in tokenize detokenize shard data; do
  expect "$verb --help: its usage on stdout, exit 0" \
    "'$mtrain' $verb --help >out.txt 2>err.txt && grep -q '^usage: mtrain $verb' out.txt && ! [ -s err.txt ]"
done

usage_error "tokenize: a value missing" "--output needs a value" tokenize --tokenizer bytes --input a.txt --output
usage_error "tokenize: --input followed by an option" "--input needs at least one file" \
  tokenize --tokenizer bytes --input --output c.shard
usage_error "tokenize: unknown option" "unknown option '--bogus'" tokenize --tokenizer bytes --bogus
usage_error "tokenize: stray argument" "tokenize: unknown argument 'extra'" \
  tokenize --tokenizer bytes --input a.txt --output c.shard extra
usage_error "tokenize: --threads 1025" "--threads '1025' is not a whole number in 1 .. 1024" \
  tokenize --tokenizer bytes --input a.txt --output c.shard --threads 1025
usage_error "tokenize: --frame-tokens 2x" "--frame-tokens '2x' is not a whole number in 1 .. 67108864" \
  tokenize --tokenizer bytes --input a.txt --output c.shard --frame-tokens 2x
usage_error "tokenize: --tokenizer required" "tokenize: --tokenizer is required" tokenize --input a.txt --output c.shard
expect "tokenize: two --input lists add up" \
  "'$mtrain' tokenize --tokenizer bytes --input a.txt --input b.txt --output c.shard --frame-tokens 4 >out.txt 2>&1 &&
   grep -q '^tokenized 2 documents .* from 2 files' out.txt"

usage_error "detokenize: a value missing" "--tokenizer needs a value" detokenize a.txt --tokenizer
usage_error "detokenize: a second file" "detokenize: unexpected argument 'b.txt'" detokenize --tokenizer bytes a.txt b.txt
usage_error "detokenize: unknown option" "unknown option '--bogus'" detokenize --bogus
usage_error "detokenize: --tokenizer required" "detokenize: --tokenizer is required" detokenize a.txt

usage_error "shard info: --text is dump's" "unknown option '--text'" shard info c.shard --text
usage_error "shard dump: a value missing" "--tokenizer needs a value" shard dump c.shard --text --tokenizer
usage_error "shard dump: two files" "shard dump: expected exactly one FILE" shard dump c.shard c.shard
expect "shard dump: options before the file" \
  "'$mtrain' shard dump --text c.shard --tokenizer bytes >out.txt && [ \"\$(head -n 1 out.txt)\" = 'hello world' ]"

usage_error "data: options first" "data: which RUN.yaml?" data --read 1 run.yaml
usage_error "data: a value missing" "--show needs a value" data run.yaml --show
usage_error "data: unknown option" "unknown option '--bogus'" data run.yaml --bogus
usage_error "data: --read -1" "--read '-1' is not a whole number >= 0" data run.yaml --read -1
expect "data: an override among the options" \
  "'$mtrain' data run.yaml --show 1 train.seq_len=2 >out.txt && grep -q ' sequences of 2 per epoch' out.txt && grep -q '^sequence 1 ' out.txt"

# One rule for an unknown option, whichever verb: one line naming it, the usage, exit 2, nothing run.
for verb in "train run.yaml" "eval run.yaml" "config run.yaml" "plan run.yaml" "tasks run.yaml --count 1 --output t.jsonl" \
  "score --model m --tokens a.txt" "generate --model m --prompt hi" "export ck out" "plot logs"; do
  usage_error "${verb%% *}: unknown option" "unknown option '--bogus'" $verb --bogus
  usage_error "${verb%% *}: unknown short option" "unknown option '-q'" $verb -q
  expect "${verb%% *}: unknown option: the usage follows" "grep -q '^usage: mtrain ${verb%% *}' err.txt"
done
usage_error "generate: a value missing" "--seed needs a value" generate --model m --prompt hi --seed
usage_error "plan: a value missing" "--gpu needs a value" plan run.yaml --gpu
exit $((failures > 0))
