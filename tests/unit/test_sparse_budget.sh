#!/usr/bin/env bash
# test_sparse_budget.sh: the fixed-budget file (attention.budget_file, read by
# sparse_budget_load) through `test_sparse_index --budget FILE LAYERS HEADS`,
# which prints "layer head vertical slash" for every head (defaults 7 and 9).
# A good file is read right; every bad line stops with exactly one stderr line
# "mtrain: FILE:LINE: what is wrong, what was expected" and a non-zero exit.
# Prints "ok NAME" / "FAIL NAME: why".
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build/tests/test_sparse_index
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$bin" ]; then
  echo "FAIL budget_binary: $bin is missing (run make $bin)"
  exit 1
fi

# expect_error NAME PATTERN CONTENT: a file with CONTENT (printf format) read
# for 2 layers x 3 heads must fail with one line matching the regex PATTERN.
expect_error() {
  local name=$1 pattern=$2 content=$3
  printf -- "$content" >"$tmp/$name.txt"
  "$bin" --budget "$tmp/$name.txt" 2 3 >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 0 ]; then echo "FAIL $name: exit status 0"
  elif [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr: $(head -c 300 "$tmp/err")"
  elif ! grep -Eq -- "^mtrain: $tmp/$name.txt:$pattern" "$tmp/err"; then
    echo "FAIL $name: message '$(cat "$tmp/err")' does not match '$pattern'"
  else echo "ok $name: $(cat "$tmp/err")"
  fi
}

printf '# layer head vertical slash\n0 2 100 200\n\n1 0\t0   5  # comment\n' >"$tmp/good.txt"
if "$bin" --budget "$tmp/good.txt" 2 3 >"$tmp/out" 2>"$tmp/err" &&
   [ "$(cat "$tmp/out")" = "$(printf '0 0 7 9\n0 1 7 9\n0 2 100 200\n1 0 0 5\n1 1 7 9\n1 2 7 9')" ]; then
  echo "ok budget_good: listed heads read, others keep the defaults"
else
  echo "FAIL budget_good: got '$(cat "$tmp/out" "$tmp/err")'"
fi

expect_error budget_three_fields "3: 3 fields, expected 'layer head vertical slash'" '# x\n\n0 1 2\n'
expect_error budget_five_fields "1: more than 4 fields, expected 'layer head vertical slash'" '0 1 2 3 4\n'
expect_error budget_word "2: vertical 'ten' is not a number, expected an integer >= 0" '0 0 1 1\n0 1 ten 5\n'
expect_error budget_fraction "1: slash '1.5' is not a number, expected an integer >= 0" '0 0 1 1.5\n'
expect_error budget_layer_range "1: layer 2 out of range, expected 0..1" '2 0 1 1\n'
expect_error budget_head_range "1: head 3 out of range, expected 0..2" '1 3 1 1\n'
expect_error budget_negative "1: slash -4 is negative, expected an integer >= 0" '1 1 8 -4\n'
expect_error budget_negative_layer "1: layer -1 is negative, expected an integer >= 0" '-1 1 8 4\n'
expect_error budget_too_large "1: vertical 9999999999 is too large, expected at most 1073741824" '0 0 9999999999 1\n'
expect_error budget_twice "3: layer 1 head 2 already given on line 1, expected one line per head" '1 2 1 1\n0 0 1 1\n1 2 3 3\n'

"$bin" --budget "$tmp/missing.txt" 2 3 >"$tmp/out" 2>"$tmp/err"
if [ $? -ne 0 ] && grep -q "^mtrain: $tmp/missing.txt: cannot open" "$tmp/err"; then
  echo "ok budget_missing_file: $(cat "$tmp/err")"
else
  echo "FAIL budget_missing_file: '$(cat "$tmp/err")'"
fi
