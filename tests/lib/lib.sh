# lib.sh: shared preamble of the shell tests (sourced): a temporary folder
# $tmp removed on exit, and ok / bad / skip / expect / expect_within printing "ok NAME",
# "FAIL NAME: why" and "skip NAME: why" lines for tests/run.sh, counting failures in $failures;
# mpirun_env for tests that start mpirun; sim_train, runs_differ and below
# for the tests that train on the CUDA backend under the sim.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
# skip NAME WHY: a check this machine cannot run (tests/run.sh counts it apart).
skip() { echo "skip $1: $2"; }
expect() { if eval "$2"; then ok "$1"; else bad "$1" "$2"; fi; }
# expect_within NAME PLANNED MEASURED TOLERANCE OUTPUT: a planned figure
# within TOLERANCE (a fraction) of the measured one, both printed on a
# "# NAME: planned P MiB, measured M MiB" line; either missing fails with the
# last lines of OUTPUT (and returns 1).
expect_within() {
  if [ -z "$2" ] || [ -z "$3" ]; then bad "$1" "no planned / measured figure: $(tail -2 "$5")"; return 1; fi
  echo "# $1: planned $2 MiB, measured $3 MiB"
  expect "$1" "awk -v p=$2 -v m=$3 -v t=$4 'BEGIN { d = (p - m) / m; exit !(d <= t && d >= -t) }'"
}
# mpirun_env: what tests that start mpirun need (as root, Open MPI asks to
# be allowed; no single-copy mechanism inside containers).
mpirun_env() {
  if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

# sim_setup PREFIX: for a test that trains under the sim: mpirun_env, one
# OpenMP thread, SIM_RUN = the settings of a small model on the CUDA backend
# (3 steps of 128 tokens, AdamW with lr 1e-2 and eps 1e-3: the update
# g / (|g| + eps) is smooth in g, so a wrong gradient moves weights by ~1e-3);
# SIM_SPARSE = sparse attention with a fixed budget of 4 vertical and 1 slash
# lines, sink 4, local 1, in blocks of 64 (the CUDA kernels' smallest index
# block): density ~0.7 at 256 tokens, its statistics logged every step.
# Ends the test with "FAIL PREFIX_binary" when build/sim/mtrain is missing.
SIM_SPARSE="attention.type=sparse attention.block_size=64 attention.budget=fixed attention.vertical=4 attention.slash=1
            attention.sink=4 attention.local=1 log.attention_every=1"
sim_setup() {
  mpirun_env
  export OMP_NUM_THREADS=1
  SIM_RUN="model.hidden_size=128 model.intermediate_size=256 model.num_layers=2 model.num_heads=2
           model.num_kv_heads=1 model.head_dim=64 train.backend=cuda train.steps=3 train.seq_len=128
           train.lr_schedule=constant train.lr=1e-2 train.warmup_steps=0 train.eps=1e-3 train.grad_clip=0 log.every=1"
  if [ ! -x build/sim/mtrain ]; then
    bad "$1_binary" "build/sim/mtrain missing (make build/sim/mtrain)"
    exit 1
  fi
}

# sim_train NAME NP DEVICES ARGS...: build/sim/mtrain train
# configs/tiny-cpu.yaml $RUN ARGS on NP ranks (1: no mpirun) on a node of
# DEVICES GPUs, into $tmp/NAME (metrics and checkpoints); stdout and stderr
# appended to $tmp/NAME.out; returns the exit status (124: 600 s time limit, reached only by a hang).
# stdin is /dev/null: mpirun would otherwise read the test's input (the list
# a `while read` loop is reading).
sim_train() {
  local name=$1 np=$2 devices=$3
  shift 3
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$np")
  # shellcheck disable=SC2086  # $RUN is a list of settings
  CUDASIM_DEVICES=$devices timeout 600 "${launch[@]}" build/sim/mtrain train configs/tiny-cpu.yaml $RUN \
    log.dir="$tmp/$name" checkpoint.dir="$tmp/$name" "$@" </dev/null >>"$tmp/$name.out" 2>&1
}

# seeds_agree PREFIX NAME NP DEVICES LOSS WEIGHTS ARGS...: the sim_train run
# NAME (made under CUDASIM_SEED 1) repeated as NAME_seed2 and NAME_seed3
# under CUDASIM_SEED 2 and 3, other orders of the grid's blocks and of the
# streams' work: each within LOSS (relative) and WEIGHTS of NAME. 0 0 where
# every reduction of the run has a fixed order, so that only a missing event
# between streams, a race, can change a bit; sparse estimation sums its
# scores with atomics, whose order follows the blocks'.
seeds_agree() {
  local prefix=$1 name=$2 np=$3 devices=$4 loss_tol=$5 weights_tol=$6 seed rc loss weights
  shift 6
  for seed in 2 3; do
    CUDASIM_SEED=$seed sim_train "${name}_seed$seed" "$np" "$devices" "$@"
    rc=$?
    read -r loss weights < <(runs_differ "${name}_seed$seed" "$name")
    expect "${prefix}_${name}_seed$seed: $name under CUDASIM_SEED=$seed = under seed 1 (exit $rc; loss $loss <= $loss_tol relative, weights $weights <= $weights_tol)" \
      "[ $rc -eq 0 ] && below '$loss' $loss_tol && below '$weights' $weights_tol"
  done
}

# runs_differ A B [STEP]: "LOSS WEIGHTS" between the sim_train runs A and B
# at step STEP (default 3; tests/lib/compare_runs.py).
runs_differ() { /usr/bin/python3 tests/lib/compare_runs.py "$tmp/$1" "$tmp/$2" "${3:-3}"; }

# below X TOL: X is a number (not "-") no larger than TOL.
below() { awk -v x="$1" -v tol="$2" 'BEGIN { exit !(x != "-" && x + 0 <= tol + 0) }'; }

# moments DIR: the raw AdamW moments m then v [2, P] F32 of checkpoint folder
# DIR on stdout, from optimizer.zst (a 24-byte header) or from its ZeRO-1
# shards optimizer.K-of-N.zst (40-byte headers, each m then v of its range).
moments() {
  local part f n
  if [ -f "$1/optimizer.zst" ]; then tail -c +25 "$1/optimizer.zst" | zstd -dq; return; fi
  for part in head tail; do
    for f in "$1"/optimizer.*-of-*.zst; do
      n=$(tail -c +41 "$f" | zstd -dq | wc -c)
      tail -c +41 "$f" | zstd -dq | "$part" -c $((n / 2))
    done
  done
}
