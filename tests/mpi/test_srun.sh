#!/usr/bin/env bash
# test_srun.sh: mtrain launched by a real Slurm (srun --mpi=pmix) on a private
# single-node cluster that the test starts in a temporary folder (munged,
# slurmctld, slurmd on free localhost ports; proctrack/linuxproc, task/none, no
# cgroups) and stops at exit.
#   train        a step on 2 ranks (cp 2) and 4 ranks (dp 2 x cp 2, --overcommit
#                on the machine's CPUs) under srun equals the same step under
#                mpirun bit for bit (losses, validation losses, gradient norm,
#                checkpoint weights: same binary, ranks and threads, so the same
#                order of every sum), and rank 0 reports launcher srun;
#   score        loss and gradients under srun (cp 2, 4) equal mpirun's;
#   batch        sbatch with srun inside (the usual job script) equals mpirun;
#                mpirun inside sbatch (ranks inherit the script's SLURM_*
#                variables) still reports launcher mpirun;
#   failures     a rank that dies ends the step (no rank's own time-out); a rank that
#                skips a collective makes the others time out (mpi_dist);
#   bad input    srun without --mpi=pmix, a SLURM_LOCALID that differs from
#                MPI's node rank, a SLURM_STEP_NUM_TASKS that differs from the
#                world: one "mtrain:" line, non-zero exit.
# Needs slurmctld, slurmd, srun and munged (scripts/install_deps.sh), and root
# (slurmd starts tasks as their user). Prints "ok NAME" / "FAIL NAME: why".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
PY=/usr/bin/python3

for tool in slurmctld slurmd srun sbatch sinfo munged mungekey; do
  if ! command -v "$tool" >/dev/null; then
    bad srun_installed "$tool is missing: Slurm is not installed (run scripts/install_deps.sh as root)"
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ]; then bad srun_root "slurmd must run as root to start tasks (run the test as root)"; exit 1; fi
for bin in build/mtrain build/tests/mpi_dist; do
  if [ ! -x "$bin" ]; then bad srun_binary "$bin is missing (run make $bin)"; exit 1; fi
done

# --- a private cluster ---

# Whatever job this test runs in, its srun calls go to the private cluster.
unset $(compgen -v SLURM_) $(compgen -v PMIX_) $(compgen -v PMI_)
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
c=$tmp/cluster
mkdir -p "$c/state" "$c/spool" "$c/munge" "$c/pmix"
daemons=()
# The daemons and what they started (slurmstepd), TERM first; slurmd can
# ignore SIGTERM while a step winds down, so whatever still runs after 10 s
# gets SIGKILL: the test never hangs in its cleanup.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done
}
stop_cluster() {
  local pid procs=() i alive
  for pid in "${daemons[@]}"; do procs+=("$pid" $(descendants "$pid")); done
  [ ${#procs[@]} -gt 0 ] && kill "${procs[@]}" 2>/dev/null
  for i in $(seq 20); do
    alive=0
    for pid in "${procs[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.5
  done
  [ ${#procs[@]} -gt 0 ] && kill -9 "${procs[@]}" 2>/dev/null
  for pid in "${daemons[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap stop_cluster EXIT

mungekey -c -k "$c/munge/munge.key" >"$c/mungekey.log" 2>&1
munged -F -f --socket="$c/munge/socket" --key-file="$c/munge/munge.key" --pid-file="$c/munge/pid" \
  --seed-file="$c/munge/seed" --log-file="$c/munged.log" >"$c/munged.out" 2>&1 &
daemons+=($!)
read -r ctld_port slurmd_port < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
cpus=$(getconf _NPROCESSORS_ONLN)
cat >"$c/slurm.conf" <<EOF
ClusterName=mtrain
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$c/munge/socket
StateSaveLocation=$c/state
SlurmdSpoolDir=$c/spool
SlurmctldPidFile=$c/slurmctld.pid
SlurmdPidFile=$c/slurmd.pid
SlurmctldLogFile=$c/slurmctld.log
SlurmdLogFile=$c/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
FirstJobId=$((1000 + (RANDOM * 32768 + RANDOM) % 60000000))
NodeName=mtrain-node NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=mtrain-node Default=YES MaxTime=INFINITE State=UP
EOF
# The PMIx plugin's per-step folders and Open MPI's session folder and shared
# memory are named by job and step id: two of these tests running at once
# must not share ids (random job ids), and the plugin's folders stay here.
echo "PMIxCliTmpDirBase=$c/pmix" >"$c/mpi.conf"
export SLURM_CONF=$c/slurm.conf
# Hang guards only (a busy machine starts daemons and jobs slowly): 5 min for the daemons, 10 min for a job.
for _ in $(seq 3000); do [ -S "$c/munge/socket" ] && break; sleep 0.1; done
slurmctld -D -i >"$c/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -N mtrain-node >"$c/slurmd.out" 2>&1 &
daemons+=($!)
state=
for _ in $(seq 1500); do
  state=$(sinfo -h -n mtrain-node -o %t 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ] || ! hosts=$(timeout 300 srun --overcommit -n 2 hostname 2>&1) || [ "$(wc -l <<<"$hosts")" -ne 2 ]; then
  bad srun_cluster "the private Slurm did not start (node state '$state'): $(tail -n 3 "$c"/slurm*.log "$c"/*.out | tr '\n' ' ')"
  exit 1
fi
ok srun_cluster

# --- training: srun against mpirun ---

MODEL="model.hidden_size=32 model.intermediate_size=64 model.num_layers=2 model.num_heads=4 model.num_kv_heads=2"
RUN="$MODEL train.seq_len=128 attention.block_size=16 train.lr_schedule=constant train.lr=1e-2 train.warmup_steps=0
     train.eps=1e-3 train.grad_clip=0 train.steps=1 log.val_every=1 data.val_sequences=3 log.every=1
     checkpoint.resume=never"
SRUN="timeout 600 srun --overcommit --mpi=pmix"
MPIRUN="timeout 600 mpirun --oversubscribe --bind-to none"

# train NAME LAUNCH... -- ARGS...: configs/tiny-cpu.yaml launched by LAUNCH
# into $tmp/NAME (log and checkpoint); stdout+stderr in $tmp/NAME.out.
train() {
  local name=$1 launch=()
  shift
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  "${launch[@]}" build/mtrain train configs/tiny-cpu.yaml $RUN log.dir="$tmp/$name" checkpoint.dir="$tmp/$name" \
    "$@" >"$tmp/$name.out" 2>&1
}

# The numbers of a run's metrics.jsonl, without its timings.
numbers() { grep -o '"\(val_loss\|loss\|grad_norm\)": [^,}]*' "$tmp/$1/metrics.jsonl"; }

# same_run NAME REF NP LAUNCHER: run NAME printed "ranks: NP ... launcher
# LAUNCHER" and equals run REF bit for bit.
same_run() {
  local name=$1 ref=$2 np=$3 launcher=$4 ckpt=step_00000001/model.safetensors
  if [ ! -f "$tmp/$name/$ckpt" ] || [ ! -f "$tmp/$ref/$ckpt" ]; then
    bad "$name" "no checkpoint: $(tail -n 3 "$tmp/$name.out" "$tmp/$ref.out" | tr '\n' ' ')"
  elif ! grep -Eq "^ranks: $np = .*, launcher $launcher\$" "$tmp/$name.out"; then
    bad "${name}_launcher" "no line 'ranks: $np = ..., launcher $launcher': $(grep '^ranks' "$tmp/$name.out")"
  elif [ "$(numbers "$name" | wc -l)" -ne 4 ] || [ "$(numbers "$name")" != "$(numbers "$ref")" ]; then
    bad "${name}_metrics" "$(numbers "$name" | tr '\n' ' ') vs $ref: $(numbers "$ref" | tr '\n' ' ')"
  elif ! cmp -s "$tmp/$name/$ckpt" "$tmp/$ref/$ckpt"; then
    bad "${name}_weights" "the checkpoint's weights differ from $ref's"
  else ok "$name"
  fi
}

train mpirun_cp2 $MPIRUN -np 2 -- parallel.cp=2
train srun_cp2 $SRUN -n 2 -- parallel.cp=2
same_run srun_cp2 mpirun_cp2 2 srun
train mpirun_dp2cp2 $MPIRUN -np 4 -- parallel.dp=2 parallel.cp=2
train srun_dp2cp2 $SRUN -n 4 -- parallel.dp=2 parallel.cp=2
same_run srun_dp2cp2 mpirun_dp2cp2 4 srun
# The two grids train on different sequences: a comparison that could not
# tell runs apart would pass them too.
if [ "$(numbers mpirun_cp2)" = "$(numbers mpirun_dp2cp2)" ]; then
  bad srun_runs_differ "cp 2 and dp 2 x cp 2 give the same losses"
else ok srun_runs_differ; fi

# --- job scripts ---

# batch NAME COMMAND: a 2-task job script running COMMAND (output in
# $tmp/NAME.out); returns when the job has ended (at most 10 min). Polls, since
# sbatch --wait sleeps up to 10 s between its own polls.
batch() {
  local id
  id=$(sbatch --parsable -n 2 --overcommit -o "$tmp/$1.out" --wrap "$2") || return 1
  for _ in $(seq 6000); do
    scontrol -o show job "$id" | grep -Eq 'JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING)' || return 0
    sleep 0.1
  done
}
ARGS="configs/tiny-cpu.yaml $(echo $RUN) parallel.cp=2"
batch batch_srun "srun --mpi=pmix build/mtrain train $ARGS log.dir=$tmp/batch_srun checkpoint.dir=$tmp/batch_srun"
same_run batch_srun mpirun_cp2 2 srun
batch batch_mpirun "mpirun --oversubscribe --bind-to none -np 2 build/mtrain train $ARGS log.dir=$tmp/batch_mpirun \
  checkpoint.dir=$tmp/batch_mpirun"
same_run batch_mpirun mpirun_cp2 2 mpirun

# --- score: srun against mpirun ---

model=$tmp/mpirun_cp2/step_00000001
awk 'BEGIN { srand(7); for (i = 0; i < 117; i++) printf "%d ", int(rand() * 256); print "" }' >"$tmp/tokens.txt"
# score NAME LAUNCH... -- ARGS...: stdout in $tmp/NAME.out, errors in $tmp/NAME.err.
score() {
  local name=$1 launch=()
  shift
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  "${launch[@]}" build/mtrain score --model "$model" --tokens "$tmp/tokens.txt" "$@" attention.block_size=16 \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
}
for np in 2 4; do
  score "score_mpirun_$np" $MPIRUN -np "$np" -- --grads "$tmp/score_mpirun_$np.safetensors"
  score "score_srun_$np" $SRUN -n "$np" -- --grads "$tmp/score_srun_$np.safetensors"
  loss=$(grep '^loss ' "$tmp/score_srun_$np.out") ref=$(grep '^loss ' "$tmp/score_mpirun_$np.out")
  if [ -z "$ref" ] || [ "$loss" != "$ref" ]; then
    bad "srun_score_$np" "'$loss' vs mpirun '$ref': $(tail -n 2 "$tmp/score_srun_$np.err" | tr '\n' ' ')"
  elif ! cmp -s "$tmp/score_srun_$np.safetensors" "$tmp/score_mpirun_$np.safetensors"; then
    bad "srun_score_$np" "gradients differ from mpirun's"
  else ok "srun_score_$np"
  fi
done

# --- failures end every task ---

# A rank SIGKILLs itself while the others wait in an all-reduce (their own
# time-out is 600 s, which would print "did not complete within"): Slurm's
# PMIx plugin must end the step.
start=$SECONDS
MTRAIN_TIMEOUT_S=600 $SRUN -n 4 build/tests/mpi_dist kill >"$tmp/kill.out" 2>&1
rc=$? t=$((SECONDS - start))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  bad srun_rank_killed "exit status $rc after $t s: $(tail -n 3 "$tmp/kill.out" | tr '\n' ' ')"
elif grep -q 'did not complete within' "$tmp/kill.out"; then
  bad srun_rank_killed "a task's own time-out ended it: $(grep -m 1 'did not complete within' "$tmp/kill.out")"
elif grep -q '^FAIL ' "$tmp/kill.out"; then bad srun_rank_killed "$(grep '^FAIL ' "$tmp/kill.out" | head -1)"
else ok "srun_rank_killed (all tasks ended in $t s)"
fi
# The last rank never joins an all-reduce: the others give up after 2 s.
start=$SECONDS
MTRAIN_TIMEOUT_S=2 $SRUN -n 4 build/tests/mpi_dist skip >"$tmp/skip.out" 2>&1
rc=$? t=$((SECONDS - start))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  bad srun_collective_timeout "exit status $rc after $t s: $(tail -n 3 "$tmp/skip.out" | tr '\n' ' ')"
elif ! grep -Eq '^mtrain: rank [0-2]: all-reduce \(sum\) on world did not complete within 2 s$' "$tmp/skip.out"; then
  bad srun_collective_timeout "no time-out message: $(tail -n 3 "$tmp/skip.out" | tr '\n' ' ')"
else ok "srun_collective_timeout (all tasks ended in $t s)"
fi

# --- bad Slurm environments: one line ---

# expect_error NAME PATTERN CMD...: CMD fails with one "mtrain:" line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2 rc lines
  shift 2
  "$@" >"$tmp/error.out" 2>&1
  rc=$?
  lines=$(grep -c '^mtrain: ' "$tmp/error.out")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit status 0"
  elif [ "$lines" -ne 1 ]; then bad "$name" "$lines 'mtrain:' lines (expected 1): $(tr '\n' ' ' <"$tmp/error.out")"
  elif ! grep -Eq -- "^mtrain: $pattern" "$tmp/error.out"; then
    bad "$name" "message '$(grep '^mtrain: ' "$tmp/error.out")' does not match '$pattern'"
  else ok "$name"
  fi
}
expect_error srun_without_pmix 'started by srun without an MPI plugin .*expected srun --mpi=pmix' \
  timeout 600 srun --overcommit -n 2 build/mtrain train configs/tiny-cpu.yaml $RUN parallel.cp=2 log.dir="$tmp/bad"
expect_error srun_localid_mismatch "rank 1: the launcher's SLURM_LOCALID is 0 but MPI places this rank 1 of 2" \
  $SRUN -n 2 bash -c '[ "$SLURM_PROCID" = 1 ] && export SLURM_LOCALID=0; exec "$@"' - \
  build/tests/mpi_dist collectives
expect_error srun_ntasks_mismatch "rank 0 of 1: srun's SLURM_PROCID is 0 of SLURM_STEP_NUM_TASKS 2 \(expected" \
  $SRUN -n 1 env SLURM_STEP_NUM_TASKS=2 build/tests/mpi_dist collectives
expect_error srun_score_ranks 'mtrain score: --logits with 2 ranks' \
  $SRUN -n 2 build/mtrain score --model "$model" --tokens "$tmp/tokens.txt" --logits "$tmp/logits.safetensors"
exit $((failures > 0))
