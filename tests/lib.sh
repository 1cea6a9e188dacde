# lib.sh: shared preamble of the shell tests (sourced): a temporary folder
# $tmp removed on exit, and ok / bad / expect printing "ok NAME" and
# "FAIL NAME: why" lines for tests/run.sh, counting failures in $failures;
# mpirun_env for tests that start mpirun.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
expect() { if eval "$2"; then ok "$1"; else bad "$1" "$2"; fi; }
# mpirun_env: what tests that start mpirun need (as root, Open MPI asks to
# be allowed; no single-copy mechanism inside containers).
mpirun_env() {
  if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}
