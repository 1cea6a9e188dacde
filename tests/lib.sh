# lib.sh: shared preamble of the shell tests (sourced): a temporary folder
# $tmp removed on exit, and ok / bad / expect printing "ok NAME" and
# "FAIL NAME: why" lines for tests/run.sh, counting failures in $failures.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
expect() { if eval "$2"; then ok "$1"; else bad "$1" "$2"; fi; }
