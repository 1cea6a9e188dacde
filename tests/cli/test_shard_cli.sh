#!/usr/bin/env bash
# test_shard_cli.sh: the data verbs end to end. `mtrain tokenize` on .txt and
# .jsonl files (on 1 to 3 threads: the same bytes), `shard dump --text` and `detokenize` giving the documents back
# byte for byte, `shard info`, `shard verify` on good and damaged shards, and the errors for
# bad input and bad arguments. Prints "ok NAME" / "FAIL NAME: why".
#   MTRAIN=path/to/mtrain bash tests/cli/test_shard_cli.sh   (default build/mtrain)
set -uo pipefail
cd "$(dirname "$0")/../.."
mtrain=$(realpath "${MTRAIN:-build/mtrain}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0

pass() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }

# expect_error NAME WANT_RC SUBSTRING CMD...: CMD exits with WANT_RC ("nonzero"
# for any failure) and its stderr's first line names the problem.
expect_error() {
  local name=$1 want_rc=$2 substring=$3; shift 3
  "$@" >out.log 2>err.log
  local rc=$?
  local first
  first=$(head -n 1 err.log)
  if [ "$want_rc" = nonzero ] && [ "$rc" -eq 0 ]; then fail "$name" "exited 0"
  elif [ "$want_rc" != nonzero ] && [ "$rc" -ne "$want_rc" ]; then fail "$name" "exited $rc (expected $want_rc)"
  elif [[ "$first" != *"$substring"* ]]; then fail "$name" "message '$first' lacks '$substring'"
  else pass "$name"; fi
}

# flip_byte FILE OFFSET: xor one byte with 1.
flip_byte() {
  local byte
  byte=$(od -An -tu1 -j "$2" -N 1 "$1" | tr -d ' ')
  printf "\\$(printf '%03o' $((byte ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# Inputs: two text files (one empty) and a jsonl file with escapes, unicode
# and a blank line.
printf 'Hello, world!\nA second line, caf\xc3\xa9 \xf0\x9f\x98\x80\n\tand a tab, no final newline' >a.txt
: >empty.txt
cat >docs.jsonl <<'EOF'
{"text": "first json document\nwith two lines", "id": 1}

{"id": 2, "text": "quotes \" and backslashes \\ and caf\u00e9 \ud83d\ude00"}
{"text": ""}
EOF
{
  cat a.txt; printf '<|endoftext|>\n'
  printf '<|endoftext|>\n'
  printf 'first json document\nwith two lines<|endoftext|>\n'
  printf 'quotes " and backslashes \\ and caf\xc3\xa9 \xf0\x9f\x98\x80<|endoftext|>\n'
  printf '<|endoftext|>\n'
} >expected.txt
text_bytes=$(( $(wc -c <expected.txt) - 5 * 14 ))  # less "<|endoftext|>\n" per document
tokens=$((text_bytes + 5))

if "$mtrain" tokenize --tokenizer bytes --input a.txt empty.txt docs.jsonl --output data/corpus.shard \
    --frame-tokens 16 >summary.log 2>&1; then
  if grep -q "tokenized 5 documents ($text_bytes bytes of text) from 3 files into $tokens tokens" summary.log &&
     grep -q "compression" summary.log; then pass "tokenize: summary"
  else fail "tokenize: summary" "$(tr '\n' ' ' <summary.log)"; fi
else
  fail "tokenize" "exited non-zero: $(tr '\n' ' ' <summary.log)"
fi
ls data 2>/dev/null | grep -q '\.tmp\.' && fail "tokenize: no temporary file" "$(ls data)" || pass "tokenize: no temporary file"
# The temporary of a killed tokenize (its process gone) is removed by the next
# one to the same output; a live writer's and other names stay.
sleep 0 & dead=$!
wait $dead
: >"data/corpus.shard.tmp.$dead"
: >"data/corpus.shard.tmp.$$"
: >"data/notes.tmp.$dead"
"$mtrain" tokenize --tokenizer bytes --input a.txt --output data/corpus.shard --force >again.log 2>&1
if ! [ -e "data/corpus.shard.tmp.$dead" ] && [ -e "data/corpus.shard.tmp.$$" ] && [ -e "data/notes.tmp.$dead" ] &&
   grep -q "^warning: data/corpus.shard.tmp.$dead: removed (left by process $dead, which is gone)" again.log; then
  pass "tokenize: a killed tokenize's temporary is removed, others stay"
else fail "tokenize: a killed tokenize's temporary is removed, others stay" "$(ls data | tr '\n' ' ') $(tr '\n' ' ' <again.log)"; fi
rm -f "data/corpus.shard.tmp.$$" "data/notes.tmp.$dead"
"$mtrain" tokenize --tokenizer bytes --input a.txt empty.txt docs.jsonl --output data/corpus.shard --frame-tokens 16 \
  --force >/dev/null 2>&1

"$mtrain" shard dump data/corpus.shard --text >dump.txt 2>&1
if cmp -s dump.txt expected.txt; then pass "dump --text reproduces every document"
else fail "dump --text reproduces every document" "$(cmp dump.txt expected.txt 2>&1)"; fi

"$mtrain" shard dump data/corpus.shard >ids.txt 2>&1
lines=$(wc -l <ids.txt)
first=$(head -n 1 ids.txt | cut -d' ' -f1-3)
ends=$(awk '$NF != 256' ids.txt | wc -l)
if [ "$lines" -eq 5 ] && [ "$first" = "72 101 108" ] && [ "$ends" -eq 0 ] && [ "$(sed -n 2p ids.txt)" = 256 ]; then
  pass "dump: ids, one document per line, each ending with 256"
else fail "dump: ids, one document per line, each ending with 256" "$lines lines, first '$first', $ends bad ends"; fi

"$mtrain" shard dump data/corpus.shard --text --tokenizer bytes >dump_bytes.txt 2>&1
"$mtrain" detokenize --tokenizer bytes <ids.txt >detok.txt 2>&1
if cmp -s dump_bytes.txt expected.txt && cmp -s detok.txt expected.txt; then
  pass "dump --text --tokenizer bytes and detokenize reproduce every document"
else fail "dump --text --tokenizer bytes and detokenize reproduce every document" "$(cmp detok.txt expected.txt 2>&1)"; fi
expect_error "detokenize: id outside the byte vocabulary" nonzero "stdin:1: '258' is not a token id of bytes" \
  sh -c "echo '72 258' | '$mtrain' detokenize --tokenizer bytes"
expect_error "dump: --tokenizer without --text" 2 "it needs --text" "$mtrain" shard dump data/corpus.shard --tokenizer bytes

"$mtrain" shard info data/corpus.shard >info.txt 2>&1
frames=$(( (tokens + 15) / 16 ))
if grep -qE "^  documents +5 " info.txt && grep -qE "^  tokens +$tokens$" info.txt &&
   grep -qE "^  vocab_size +258$" info.txt && grep -qE "^  token dtype +uint16$" info.txt &&
   grep -qE "^  frames +$frames of up to 16 tokens" info.txt && grep -q "compression" info.txt; then
  pass "info: counts"
else fail "info: counts" "$(tr '\n' '|' <info.txt)"; fi

out=$("$mtrain" shard verify data/corpus.shard 2>&1)
if [ $? -eq 0 ] && [ "$out" = "data/corpus.shard: ok" ]; then pass "verify: ok"
else fail "verify: ok" "$out"; fi

cp data/corpus.shard corrupt.shard
flip_byte corrupt.shard 140
expect_error "verify: corrupted frame" nonzero "corrupt.shard: frame 0 " "$mtrain" shard verify corrupt.shard
if [ "$(wc -l <err.log)" -eq 1 ] && grep -q "checksum mismatch" err.log; then pass "verify: corrupted frame, one line"
else fail "verify: corrupted frame, one line" "$(tr '\n' '|' <err.log)"; fi

head -c 200 data/corpus.shard >short.shard
expect_error "verify: truncated" nonzero "short.shard: truncated" "$mtrain" shard verify short.shard
expect_error "info: not a shard" nonzero "a.txt: not an mtrain shard" "$mtrain" shard info a.txt

# A bad jsonl line fails naming file:line and leaves an existing output alone.
cp data/corpus.shard before.shard
printf '{"text": "fine"}\n{"text": broken}\n' >bad.jsonl
expect_error "tokenize: bad jsonl line" nonzero "bad.jsonl:2: invalid JSON" \
  "$mtrain" tokenize --tokenizer bytes --input bad.jsonl --output data/corpus.shard --force
if cmp -s before.shard data/corpus.shard && ! ls data | grep -q '\.tmp\.'; then pass "tokenize: failure leaves the output untouched"
else fail "tokenize: failure leaves the output untouched" "$(ls data)"; fi
printf '{"title": "no text"}\n' >notext.jsonl
expect_error "tokenize: jsonl line without text" nonzero 'notext.jsonl:1: no string field "text"' \
  "$mtrain" tokenize --tokenizer bytes --input notext.jsonl --output x.shard

printf '{"text": "a\\u0000b"}\n' >nul.jsonl
expect_error "tokenize: jsonl text with a NUL" nonzero 'nul.jsonl:1: a \u0000 (NUL) escape is not supported' \
  "$mtrain" tokenize --tokenizer bytes --input nul.jsonl --output x.shard

# --threads N: the same shard bytes for any N, over several batches of
# documents (4096 per batch) from .jsonl and plain files; --text-field NAME
# reads another field; the first bad line in input order is the one named.
awk 'BEGIN { for (i = 0; i < 9000; i++) { printf "{\"body\": \"line %d", i; for (j = 0; j < i % 37; j++) printf " w%d", j; printf "\"}\n" } }' >many.jsonl
sed 's/"body"/"text"/' many.jsonl >many_text.jsonl
for n in 1 2 3; do
  "$mtrain" tokenize --tokenizer bytes --threads $n --text-field body --input a.txt many.jsonl empty.txt a.txt --output threads$n.shard >threads$n.log 2>&1 ||
    fail "tokenize --threads $n" "$(cat threads$n.log)"
done
if cmp -s threads1.shard threads2.shard && cmp -s threads1.shard threads3.shard && grep -q " 3 threads)" threads3.log; then
  pass "tokenize: --threads 1, 2, 3 write the same shard bytes"
else fail "tokenize: --threads 1, 2, 3 write the same shard bytes" "$(cat threads3.log)"; fi
"$mtrain" tokenize --tokenizer bytes --threads 1 --input a.txt many_text.jsonl empty.txt a.txt --output field.shard >/dev/null 2>&1
if cmp -s threads1.shard field.shard; then pass "tokenize: --text-field body reads the field as \"text\" is read"
else fail "tokenize: --text-field body reads the field as \"text\" is read" "shards differ"; fi
{ head -n 5000 many.jsonl; echo 'broken'; head -n 10 many.jsonl; echo '{"x": 1}'; } >twobad.jsonl
expect_error "tokenize --threads 2: the first bad line is named" nonzero "twobad.jsonl:5001: invalid JSON" \
  "$mtrain" tokenize --tokenizer bytes --threads 2 --text-field body --input twobad.jsonl --output x.shard
expect_error "tokenize: jsonl line without the --text-field" nonzero 'many_text.jsonl:1: no string field "body"' \
  "$mtrain" tokenize --tokenizer bytes --text-field body --input many_text.jsonl --output x.shard
expect_error "tokenize: --threads 0 is refused" 2 "--threads '0' is not a whole number in 1 .. 1024" \
  "$mtrain" tokenize --tokenizer bytes --threads 0 --input a.txt --output x.shard

# Binary input is refused with one line before any work: a compressed file
# (by its magic number), a NUL byte in the first 64 KiB or later.
printf 'some text\n' | gzip >text.txt.gz
expect_error "tokenize: a gzip file is refused" 1 "text.txt.gz: a gzip file, not text" \
  "$mtrain" tokenize --tokenizer bytes --input a.txt text.txt.gz --output x.shard
printf 'ab\0cd' >nul.bin
expect_error "tokenize: NUL bytes are refused" 1 "nul.bin: binary (it holds NUL bytes), not text" \
  "$mtrain" tokenize --tokenizer bytes --input nul.bin --output x.shard
{ head -c 70000 /dev/zero | tr '\0' a; printf '\0'; } >late_nul.txt
expect_error "tokenize: a NUL byte past 64 KiB is refused" 1 "late_nul.txt: byte 70000 is NUL" \
  "$mtrain" tokenize --tokenizer bytes --input late_nul.txt --output x.shard
# A bad line read before the NUL byte is found (its batch still queued) is
# the one named: input order, on any number of threads.
for n in 1 2; do
  expect_error "tokenize --threads $n: a bad line before a late NUL is named first" 1 "bad.jsonl:2: invalid JSON" \
    "$mtrain" tokenize --tokenizer bytes --threads $n --input bad.jsonl late_nul.txt --output x.shard
done
if [ ! -e x.shard ] && [ "$(wc -l <err.log)" -eq 1 ]; then pass "tokenize: binary input writes nothing, one line"
else fail "tokenize: binary input writes nothing, one line" "$(ls; cat err.log)"; fi

expect_error "tokenize: missing tokenizer file" 1 "nonexistent/tokenizer.json" \
  "$mtrain" tokenize --tokenizer nonexistent/tokenizer.json --input a.txt --output x.shard
expect_error "tokenize: an existing output needs --force" 1 "data/corpus.shard: already exists (expected a new file; --force replaces it)" \
  "$mtrain" tokenize --tokenizer bytes --input a.txt --output data/corpus.shard
if cmp -s before.shard data/corpus.shard; then pass "tokenize: an existing output is left alone without --force"
else fail "tokenize: an existing output is left alone without --force" "data/corpus.shard changed"; fi
printf 'x,y\n1,2\n' >table.csv
"$mtrain" tokenize --tokenizer bytes --input table.csv --output csv.shard >/dev/null 2>&1
"$mtrain" shard dump csv.shard --text >csv.txt 2>&1
if printf 'x,y\n1,2\n<|endoftext|>\n' | cmp -s - csv.txt; then pass "tokenize: a file that is not .jsonl is one document of text"
else fail "tokenize: a file that is not .jsonl is one document of text" "$(head -c 200 csv.txt)"; fi
"$mtrain" tokenize --tokenizer bytes --input a.txt --output csv.shard --force >/dev/null 2>&1
"$mtrain" shard dump csv.shard --text >csv.txt 2>&1
if { cat a.txt; printf '<|endoftext|>\n'; } | cmp -s - csv.txt; then pass "tokenize --force replaces an existing output"
else fail "tokenize --force replaces an existing output" "$(head -c 200 csv.txt)"; fi
expect_error "tokenize: missing --output" 2 "--output is required" "$mtrain" tokenize --tokenizer bytes --input a.txt
expect_error "shard: unknown action" 2 "unknown action 'frob'" "$mtrain" shard frob data/corpus.shard
expect_error "shard: no action" 2 "which action" "$mtrain" shard
[ -e x.shard ] && fail "failed commands write nothing" "x.shard exists" || pass "failed commands write nothing"

[ "$failures" -eq 0 ]
