#!/usr/bin/env bash
# test_docs_commands.sh: every command that README.md and docs/*.md show runs
# as written, on a scratch copy of the repository (its files and build/), in
# the order the documents give them (README.md first, then docs/*.md by name;
# a command given twice runs once), so that later commands find what earlier
# ones wrote (a checkpoint, a shard).
#
# Which text is a command:
#   - a line of a fenced ``` block that starts with one of the PREFIXES below
#     (a trailing `\` continues it on the next line), and
#   - an inline `code span` that starts with one of the PREFIXES and has at
#     least two words (`mpirun` alone names the tool, not a command).
#   A trailing `# comment` is dropped.
# PREFIXES: make, build/mtrain, build/cuda/mtrain, mpirun, srun, sbatch, bash scripts/, OMP_NUM_THREADS=
#
# Every command must match a row of RULES (first match wins):
#   run  ERE | OVERRIDES    run it with OVERRIDES appended (section.key=value
#                           that shrink a long run; empty: as written)
#   skip ERE | REASON       not run; the reason is printed
#   verb ERE | OVERRIDES    run like `run` when build/mtrain has the command's
#                           verb (`build/mtrain VERB --help` exits 0), else skipped
# A command that matches no row fails the test: add a row when you add a
# command to the docs. Commands run with bash -c in the scratch copy with a
# time limit of $LIMIT s each, OMP_NUM_THREADS=1, Open MPI's ranks not bound
# to cores, and without the MAKEFLAGS of a `make test` that runs this test.
# Open MPI may place no more ranks than the machine has cores unless the
# command says --oversubscribe, so a documented mpirun runs as written on a
# 2-core machine.
#
# docs/RECIPE.md runs at toy scale: the scratch copy gets a Qwen-shaped
# model folder in models/Qwen2.5-0.5B (2 layers, 64 wide, GQA 4:2, random
# weights, a byte-level BPE tokenizer.json of 303 ids: tests/lib/qwen2_ref.py and
# tests/reference/test_tokenizer.py make them), long documents in
# data/long/pg19.jsonl, and build/cuda/mtrain when nvcc built none: the CPU
# build, which its rows run with train.backend=cpu.
#   bash tests/repo/test_docs_commands.sh        (uses build/ as built)
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh
LIMIT=1200

RULES=(
  'run |^make demo$|'
  'skip|^make test$|runs the whole suite, this test included'
  'skip|^make all$|builds what make test builds (this test runs inside it; CI runs make all)'
  'skip|^make test-gpu$|needs a GPU'
  'skip|^make test-sim$|part of make test (tests/sim/test_sim.sh)'
  'skip|^make test SANITIZE=1$|the whole sanitized suite (CI runs it: .ci/run)'
  'run |^make (-j2 )?build-fuzz$|'
  'run |^make fuzz$|FUZZ_RUNS=2000'
  'skip|^sbatch --signal=|an sbatch option of a sentence; needs a Slurm cluster'
  'run |^bash scripts/kernel_resources\.sh |'
  'run |^mpirun -np 4 --oversubscribe build/mtrain train configs/tiny-cpu\.yaml |train.steps=10'
  'run |^build/mtrain train configs/tiny-cpu\.yaml checkpoint\.resume=never$|train.steps=10'
  'skip|^mpirun -np 2 build/tests/mpi_gpu_nccl$|needs two GPUs (tests/sim/test_sim_libs.sh runs it under the sim)'
  'skip|^mpirun -np 4 build/tests/mpi_gpu_ring 2$|needs four GPUs (tests/sim/test_cuda_ring.sh runs it under the sim)'
  'skip|^srun |needs a Slurm cluster (tests/mpi/test_srun.sh runs srun on a private one)'
  'skip|^mpirun -np 2 build/mtrain score --model DIR |placeholders DIR and FILE (tests/reference/test_hf_folders.py runs score)'
  'run |^build/mtrain tokenize --tokenizer bytes --input corpus/|'
  'run |^build/mtrain data configs/tiny-cpu\.yaml |'
  'run |^build/mtrain train configs/tiny-cpu\.yaml data\.train=|train.steps=10'
  'run |^build/mtrain train configs/tiny-cpu\.yaml attention\.type=sparse attention\.block_size=8 |train.steps=20'
  'run |^build/mtrain eval configs/tiny-cpu\.yaml eval\.lengths=512,1024 |eval.samples=1'
  'skip|^mpirun -np 4 build/mtrain eval RUN\.yaml |placeholder RUN.yaml and 512K-token lengths'
  'skip|^bash scripts/context_extension\.sh$|takes about 15 minutes'
  'skip|^bash scripts/sparse_vs_dense\.sh$|the context-extension recipe: its short model and six fine-tunes (about 45 minutes)'
  'run |^build/mtrain config --doc$|'
  'run |^build/mtrain train configs/tiny-cpu\.yaml train\.lr=1e-3 train\.steps=10 checkpoint\.dir=checkpoints/lr1e-3$|'
  'skip|^build/mtrain config RUN\.yaml \[overrides\]$|synopsis with placeholders'
  'run |^bash scripts/bench_packing\.sh$|'
  'run |^bash scripts/plan_kernels\.sh$|'
  'skip|^bash scripts/bench_train\.sh|needs a GPU (without one it exits 1 with one line: tests/repo/test_bench_train.sh)'
  'skip|^bash scripts/bench_|benchmark, minutes'
  'skip|^bash scripts/gpu_check\.sh$|needs a GPU'
  'skip|^bash scripts/gpu_check\.sh --sim$|tests/sim/test_gpu_check.sh runs it'
  'skip|^make gpu-bundle$|tests/repo/test_gpu_bundle.sh builds and runs it'
  'skip|^build/mtrain data run\.yaml --read R |placeholders R, DIR and N'
  'skip|-np W build/tests/mpi_dist bench |placeholder W; benchmark'
  'skip|^OMP_NUM_THREADS=1 build/tests/mpi_sparse_ring plan |benchmark'
  'skip|^build/mtrain train big\.yaml |placeholder big.yaml (a model too large for this machine)'
  'skip|-np NP build/mtrain train configs/demo-cpu\.yaml |placeholders NP, TH and GRID'
  'run |^build/mtrain eval configs/tiny-cpu\.yaml checkpoint\.dir=\$T/ck |eval.lengths=1024 eval.depths=0 eval.samples=1'
  'skip|^OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none$|environment settings, not a command'
  'skip|^build/mtrain train configs/demo-cpu\.yaml .*parallel\.cp=2 |runs under the srun / mpirun -np 2 of its sentence (tests/mpi/test_srun.sh)'
  'skip|^mpirun --oversubscribe --bind-to none -np 2$|launcher options of a command beside it'
  'run |^build/mtrain plan configs/tiny-cpu\.yaml$|'
  'skip|^build/mtrain train configs/tiny-cpu\.yaml model\.hidden_size=512 .* parallel\.dp=2 parallel\.zero=1$|the second line of an mpirun -np 2 under /usr/bin/time, a timing (tests/mpi/test_checkpoint_shards.sh writes and resumes the same ZeRO shards)'
  'skip|^bash scripts/ring_overlap\.sh RUN\.yaml|placeholder RUN.yaml (docs/PLANNER.md runs the same plan --ring on a run file)'
  'run |^build/mtrain plan configs/qwen2\.5-3b-512k-32xa100\.yaml .*--kernels .*train\.seq_len=524288 |; [ $? -eq 3 ]'
  'run |^build/mtrain plan configs/qwen2\.5-[0-9.]+b-[0-9]+k-32x[a-z0-9]+\.yaml( train\.init_from=none)?|'
  'skip|^sbatch scripts/sbatch_example\.sh |needs a Slurm cluster (tests/cli/test_plan.sh runs the script with an srun shim)'
  'skip|^mpirun -np 32 --hostfile hosts |32 ranks on 4 nodes of GPUs'
  'run |^build/mtrain plot logs/tiny-cpu$|'
  'skip|^build/mtrain plan configs/NAME\.yaml( .*)?$|placeholder NAME (docs/RECIPE.md and docs/USAGE.md run two of these run files)'
  'run |^build/mtrain tokenize --tokenizer models/Qwen2\.5-0\.5B |'
  'run |^build/mtrain shard info data/long/|'
  'run |^build/mtrain data configs/qwen2\.5-0\.5b-512k-1gpu\.yaml$|train.seq_len=256'
  'run |^build/mtrain plan configs/qwen2\.5-0\.5b-512k-1gpu\.yaml$|'
  'run |^build/mtrain plan configs/qwen2\.5-0\.5b-512k-1gpu\.yaml train\.seq_len=65536 --density 0\.038 --kernels$|'
  'run |^build/cuda/mtrain train configs/qwen2\.5-0\.5b-512k-1gpu\.yaml |train.backend=cpu train.steps=2 train.seq_len=256 attention.block_size=64'
  'run |^build/mtrain plot logs/qwen2\.5-0\.5b-512k$|'
  'run |^build/cuda/mtrain eval configs/qwen2\.5-0\.5b-512k-1gpu\.yaml$|train.backend=cpu train.seq_len=256 attention.block_size=64 eval.lengths=1024 eval.depths=0.5 eval.samples=1'
  'run |^build/mtrain export checkpoints/qwen2\.5-0\.5b-512k/|'
  'verb|^build/mtrain generate --model models/Qwen2\.5-0\.5B-512K |'
)

# Commands as "FILE:LINE<TAB>COMMAND", in document order, each once.
extract_commands() {
  /usr/bin/python3 - README.md docs/*.md <<'EOF'
import re, sys
prefix = re.compile(r"^(make |build/mtrain |build/cuda/mtrain |mpirun |srun |sbatch |bash scripts/|OMP_NUM_THREADS=)")
seen = set()
for path in sys.argv[1:]:
    lines = open(path, encoding="utf-8").read().split("\n")
    fenced, i = False, 0
    while i < len(lines):
        line, number = lines[i], i + 1
        found = []
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            text = line.strip()
            if prefix.match(text):
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                found.append(text)
        else:
            found = [s.strip() for s in re.findall(r"`([^`]+)`", line)
                     if prefix.match(s.strip()) and len(s.split()) >= 2]
        for text in found:
            text = re.sub(r"\s+#.*$", "", text).strip()
            if text not in seen:
                seen.add(text)
                print(f"{path}:{number}\t{text}")
        i += 1
EOF
}

# The scratch copy: the repository's files and build/ (timestamps kept, so
# make finds it up to date), a tiny corpus for the own-text example and $T for
# the commands of docs/PERFORMANCE.md that use it.
scratch=$tmp/repo
mkdir -p "$scratch"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp -a --parents -t "$scratch"
cp -a build "$scratch/build"
mkdir -p "$scratch/corpus" "$tmp/T"
for d in 1 2 3; do
  awk -v d=$d 'BEGIN { srand(d); for (i = 0; i < 3000; i++) printf "%s%s", substr("the river town old road map", int(rand() * 20) + 1, 4), i % 11 == 10 ? ".\n" : " " }' \
    >"$scratch/corpus/doc$d.txt"
done
export T=$tmp/T OMP_NUM_THREADS=1 OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_btl_vader_single_copy_mechanism=none
unset MAKEFLAGS MFLAGS MAKELEVEL
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# docs/RECIPE.md's model folder, long documents and CUDA trainer, at toy scale.
mkdir -p "$scratch/data/long"
(cd "$scratch" && /usr/bin/python3 - <<'EOF'
import json, random, sys
sys.path[:0] = ["tests/lib", "tests/reference"]
import qwen2_ref as ref
from test_tokenizer import tiny_tokenizer
cfg = ref.make_config(vocab=320, hidden=64, inter=96, layers=2, heads=4, kv_heads=2, theta=1000000.0, max_pos=32768)
ref.write_model("models/Qwen2.5-0.5B", cfg, {n: t.float() for n, t in ref.random_model(cfg, seed=1).items()})
with open("models/Qwen2.5-0.5B/tokenizer.json", "w") as f:
    json.dump(tiny_tokenizer(), f)
rng = random.Random(1)
words = "the river town old road map north bridge mill lantern".split()
with open("data/long/pg19.jsonl", "w") as f:
    for _ in range(6):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(1500))}) + "\n")
EOF
) || bad "setup: the recipe's model folder and documents" "python failed"
if [ ! -x "$scratch/build/cuda/mtrain" ]; then mkdir -p "$scratch/build/cuda" && ln -s ../mtrain "$scratch/build/cuda/mtrain"; fi
# docs/PERFORMANCE.md's evaluation reads a tiny-cpu model trained into $T/ck.
(cd "$scratch" && build/mtrain train configs/tiny-cpu.yaml train.steps=10 checkpoint.dir="$T/ck" log.dir="$T/log" \
  >/dev/null 2>&1) || bad "setup: a tiny-cpu checkpoint in \$T/ck" "train failed"

commands=$(extract_commands)
[ -n "$commands" ] || bad "commands found in the docs" "none"
count=0
while IFS=$'\t' read -r where command; do
  count=$((count + 1))
  action="" detail=""
  for rule in "${RULES[@]}"; do
    IFS='|' read -r kind pattern text <<<"$rule"
    if [[ $command =~ $pattern ]]; then action=${kind% }; detail=$text; break; fi
  done
  case $action in
    skip) echo "skipped $where: $command ($detail)" ;;
    verb|run)
      verb=$(echo "$command" | awk '{print $2}')
      if [ "$action" = verb ] && ! (cd "$scratch" && build/mtrain "$verb" --help >/dev/null 2>&1); then
        echo "skipped $where: $command (build/mtrain has no verb $verb)"
        continue
      fi
      start=$SECONDS
      (cd "$scratch" && timeout $LIMIT bash -c "$command $detail" >"$tmp/out" 2>&1 </dev/null)
      rc=$?
      if [ $rc -eq 0 ]; then ok "$where runs: $command${detail:+ (+ $detail)} [$((SECONDS - start)) s]"
      else bad "$where runs: $command${detail:+ (+ $detail)}" "exit $rc: $(tail -n 100 "$tmp/out" | tr '\n' '|')"; fi
      ;;
    *) bad "$where: $command" "matches no row of RULES in tests/repo/test_docs_commands.sh (run it, or skip it with a reason)" ;;
  esac
done <<<"$commands"
echo "$count documented commands"
[ "$failures" -eq 0 ]
