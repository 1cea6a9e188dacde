#!/usr/bin/env bash
# test_dist.sh: dist/comm.c and attention/ring/ring.c under Open MPI on one machine
# (--oversubscribe: several ranks share the cores). Runs build/tests/mpi_dist
# (see tests/mpi/mpi_dist.c) with 1, 2, 4 and 8 ranks: collectives, communicator
# shapes, bad parallel.* settings, dense ring attention (every layout, flat and
# hierarchical, without and with documents) against the single-rank kernel,
# sparse ring attention (build/tests/mpi_sparse_ring: distributed pattern,
# ring_send full and selected, documents), a rank that dies and a rank that
# skips a collective. Prints
# "ok NAME" / "FAIL NAME: why".
set -uo pipefail
cd "$(dirname "$0")/../.."
prog=build/tests/mpi_dist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; }

if [ ! -x "$prog" ]; then
  bad dist_binary "$prog is missing (run make $prog)"
  exit 1
fi

export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# mpi NP ARGS...: run the program ($prog unless MPI_PROG is set) on NP ranks (at most 10 min: a hang guard); stdout and
# stderr into $tmp/out and $tmp/err, the wall time in seconds into $tmp/time.
mpi() {
  local np=$1; shift
  local start=$SECONDS
  timeout 600 mpirun --oversubscribe --bind-to none -np "$np" "${MPI_PROG:-$prog}" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  echo $((SECONDS - start)) >"$tmp/time"
  return $rc
}

# checks NAME NP ARGS...: a run whose rank 0 prints the checks; passes them
# on, and fails NAME when the run fails without saying which check.
checks() {
  local name=$1; shift
  mpi "$@"
  local rc=$?
  grep -E '^(ok|FAIL) ' "$tmp/out"
  if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/out"; then
    bad "$name" "exit status $rc: $(tail -n 5 "$tmp/err" | tr '\n' ' ')"
  fi
}

# --- collectives and communicators ---

if "$prog" collectives >"$tmp/out" 2>"$tmp/err"; then grep -E '^(ok|FAIL) ' "$tmp/out" | sed 's/^ok /ok singleton_/'
else bad dist_singleton "exit status $?: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"; fi
for np in 2 4; do checks "dist_collectives_$np" "$np" collectives; done
checks dist_grid_errors 1 grid-errors
for grid in "0 0 0" "2 2 0" "4 0 0" "1 4 2"; do checks "dist_grid_4_${grid// /_}" 4 grid $grid; done
for grid in "2 4 2" "1 8 4" "1 8 2" "0 2 0"; do checks "dist_grid_8_${grid// /_}" 8 grid $grid; done

# A bad request ends every rank with one line from rank 0:
# expect_error NAME PATTERN NP ARGS...
expect_error() {
  local name=$1 pattern=$2
  shift 2
  mpi "$@"
  local rc=$? lines
  lines=$(grep -c '^mtrain: ' "$tmp/err")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit status 0"
  elif grep -q 'setup succeeded' "$tmp/out"; then bad "$name" "setup succeeded"
  elif grep -q '^step ' "$tmp/out"; then bad "$name" "training started"
  elif [ "$lines" -ne 1 ]; then bad "$name" "$lines 'mtrain:' lines on stderr (expected 1)"
  elif ! grep -Eq -- "^mtrain: $pattern" "$tmp/err"; then bad "$name" "message '$(grep '^mtrain: ' "$tmp/err")' does not match '$pattern'"
  else ok "$name"
  fi
}
expect_error dist_bad_dp_times_cp 'mpi_dist: parallel\.dp × parallel\.cp = 2 × 3 = 6 does not match the job.s 4 ranks' \
  4 setup 2 3 0
expect_error dist_bad_cp 'mpi_dist: parallel\.cp: 3 does not divide the job.s 4 ranks' 4 setup 0 3 0
expect_error dist_bad_cp_inner 'mpi_dist: parallel\.cp_inner: 3 does not divide parallel\.cp = 4' 4 setup 0 4 3
# The same from build/mtrain, naming the run file.
if [ -x build/mtrain ]; then
  run="configs/tiny-cpu.yaml log.dir=$tmp/log checkpoint.dir=$tmp/ckpt"
  MPI_PROG=build/mtrain expect_error dist_mtrain_bad_cp \
    'configs/tiny-cpu\.yaml: parallel\.cp: 3 does not divide the job.s 4 ranks' 4 train $run parallel.cp=3
  MPI_PROG=build/mtrain expect_error dist_mtrain_bad_cp_inner \
    'configs/tiny-cpu\.yaml: parallel\.cp_inner: 2 does not divide parallel\.cp = 3' 3 train $run parallel.cp_inner=2
else
  bad dist_mtrain_binary "build/mtrain is missing (run make build/mtrain)"
fi

# --- ring attention (dense) ---

checks dist_ring_1 1 ring flat 0
checks dist_ring_2 2 ring flat 0
checks dist_ring_4_flat 4 ring flat 0
checks dist_ring_4_hier_2x2 4 ring hierarchical 2
checks dist_ring_8_flat 8 ring flat 0
checks dist_ring_8_hier_2x4 8 ring hierarchical 4
checks dist_ring_8_hier_4x2 8 ring hierarchical 2

# --- sparse ring attention (tests/mpi/mpi_sparse_ring.c): pattern, O/LSE/grads, ring_send full and selected ---

if [ -x build/tests/mpi_sparse_ring ]; then
  sparse() { MPI_PROG=build/tests/mpi_sparse_ring checks "$@"; }
  sparse sparse_ring_1 1 check flat 0
  sparse sparse_ring_2 2 check flat 0
  sparse sparse_ring_4_flat 4 check flat 0
  sparse sparse_ring_4_hier_2x2 4 check hierarchical 2
  sparse sparse_ring_8_flat 8 check flat 0
  sparse sparse_ring_8_hier_2x4 8 check hierarchical 4
  sparse sparse_ring_8_hier_4x2 8 check hierarchical 2
else
  bad sparse_ring_binary "build/tests/mpi_sparse_ring is missing (run make build/tests/mpi_sparse_ring)"
fi

# --- failures end every rank, never a hang ---

# A rank SIGKILLs itself while the others wait in an all-reduce (their own
# time-out is 600 s, which would print "did not complete within": Open MPI's
# abort propagation must end them).
MTRAIN_TIMEOUT_S=600 mpi 4 kill
rc=$? t=$(cat "$tmp/time")
if [ "$rc" -eq 0 ]; then bad dist_rank_killed "exit status 0"
elif [ "$rc" -eq 124 ]; then bad dist_rank_killed "still running after $t s"
elif ! grep -q 'exited on signal 9' "$tmp/err"; then bad dist_rank_killed "no message naming the dead rank: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"
elif grep -q 'did not complete within' "$tmp/err"; then bad dist_rank_killed "a rank's own time-out ended it: $(grep -m 1 'did not complete within' "$tmp/err")"
elif grep -q '^FAIL ' "$tmp/out"; then bad dist_rank_killed "$(grep '^FAIL ' "$tmp/out" | head -1)"
else ok "dist_rank_killed (all ranks ended in $t s)"
fi

# The last rank never joins an all-reduce: the others give up after 2 s.
MTRAIN_TIMEOUT_S=2 mpi 4 skip
rc=$? t=$(cat "$tmp/time")
if [ "$rc" -eq 0 ]; then bad dist_collective_timeout "exit status 0"
elif [ "$rc" -eq 124 ]; then bad dist_collective_timeout "still running after $t s"
elif ! grep -Eq '^mtrain: rank [0-2]: all-reduce \(sum\) on world did not complete within 2 s$' "$tmp/err"; then
  bad dist_collective_timeout "no time-out message: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"
elif grep -q '^mtrain: rank 3:' "$tmp/err"; then bad dist_collective_timeout "the skipping rank reported a time-out"
elif grep -q '^FAIL ' "$tmp/out"; then bad dist_collective_timeout "$(grep '^FAIL ' "$tmp/out" | head -1)"
else ok "dist_collective_timeout (all ranks ended in $t s)"
fi
