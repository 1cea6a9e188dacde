#!/usr/bin/env bash
# test_config.sh: `mtrain config` end to end: the tiny run file resolves,
# overrides apply, print -> load -> print is exact, every kind of bad input
# gets one clear line on stderr and a non-zero exit, and docs/CONFIG.md is
# what `mtrain config --doc` prints. Prints "ok NAME" / "FAIL NAME: why".
#   MTRAIN=path/to/mtrain bash tests/cli/test_config.sh   (default build/mtrain)
set -uo pipefail
cd "$(dirname "$0")/../.."
mtrain=${MTRAIN:-build/mtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failed=1; }

if [ ! -x "$mtrain" ]; then
  bad config_binary "$mtrain is missing (run make build/mtrain)"
  exit 1
fi

# expect_error NAME PATTERN ARGS...: mtrain config ARGS must exit non-zero
# with exactly one line on stderr, nothing on stdout, and the line matching
# the extended regex PATTERN.
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$mtrain" config "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit status 0"
  elif [ "$lines" -ne 1 ]; then bad "$name" "$lines lines on stderr: $(head -c 300 "$tmp/err")"
  elif [ -s "$tmp/out" ]; then bad "$name" "wrote to stdout"
  elif ! grep -Eq -- "$pattern" "$tmp/err"; then bad "$name" "message '$(cat "$tmp/err")' does not match '$pattern'"
  else ok "$name"
  fi
}

# has_lines NAME FILE LINE...: every LINE appears in FILE as a whole line.
has_lines() {
  local name=$1 file=$2; shift 2
  for line in "$@"; do
    if ! grep -Fxq -- "$line" "$file"; then bad "$name" "missing line '$line'"; return; fi
  done
  ok "$name"
}

# --- good input ---

if "$mtrain" config configs/tiny-cpu.yaml >"$tmp/tiny.yaml" 2>"$tmp/err"; then
  has_lines config_tiny_cpu_resolves "$tmp/tiny.yaml" "model:" "  hidden_size: 64" "  num_layers: 2" \
    "  num_heads: 4" "  num_kv_heads: 2" "  vocab_size: 256" "  backend: cpu" "  seq_len: 256" "  steps: 60" \
    "  lr: 0.003" "  warmup_steps: 5" "  lr_schedule: cosine" "  train: synthetic" "  dir: logs/tiny-cpu" \
    "  dir: checkpoints/tiny-cpu" "  rope_theta: 1000000.0" "  beta2: 0.95"
else
  bad config_tiny_cpu_resolves "exit status $?: $(head -c 300 "$tmp/err")"
fi

sections=$(grep -E '^[a-z]+:$' "$tmp/tiny.yaml" | tr -d ':\n')
if [ "$sections" = "modelattentionparalleltraindatacheckpointlogevalhardware" ]; then ok config_section_order
else bad config_section_order "sections in order '$sections'"; fi

if [ "$(grep -cE '^  (  )?[a-z0-9_]*: ' "$tmp/tiny.yaml")" -eq "$(grep -c '^| `' docs/CONFIG.md)" ]; then
  ok config_prints_every_key
else
  bad config_prints_every_key "printed keys differ from documented keys"
fi

: >"$tmp/empty.yaml"
if "$mtrain" config "$tmp/empty.yaml" >"$tmp/empty.out" 2>"$tmp/err"; then
  has_lines config_empty_file_gives_defaults "$tmp/empty.out" "  hidden_size: 64" "  lr: 0.001" \
    "  seed: 1234" "  tie_word_embeddings: true" "  recompute: auto" "  profile: false" "  dir: checkpoints"
else
  bad config_empty_file_gives_defaults "exit status $?: $(head -c 300 "$tmp/err")"
fi

if "$mtrain" config configs/tiny-cpu.yaml train.lr=2.5e-3 model.num_layers=3 'data.train=shards/*.zst' \
    >"$tmp/over.yaml" 2>"$tmp/err"; then
  has_lines config_override "$tmp/over.yaml" "  lr: 0.0025" "  num_layers: 3" '  train: "shards/*.zst"' \
    "  hidden_size: 64"
else
  bad config_override "exit status $?: $(head -c 300 "$tmp/err")"
fi

# Values that only survive with exact double printing and careful quoting.
if "$mtrain" config configs/tiny-cpu.yaml train.lr=0.1 train.min_lr=3.3333333333333335e-05 \
    model.init_std=0.017 train.eps=1e-10 model.rope_theta=12345.678901234567 train.weight_decay=0 \
    train.seed=18446744073709551615 'data.train=my "data"/a\b*.shard' checkpoint.dir=yes log.dir=123 \
    train.recompute=full >"$tmp/round1.yaml" 2>"$tmp/err" &&
   "$mtrain" config "$tmp/round1.yaml" >"$tmp/round2.yaml" 2>>"$tmp/err"; then
  if cmp -s "$tmp/round1.yaml" "$tmp/round2.yaml"; then
    has_lines config_round_trip "$tmp/round2.yaml" "  lr: 0.1" "  min_lr: 3.3333333333333335e-05" \
      "  rope_theta: 12345.678901234567" "  eps: 1.0e-10" "  seed: 18446744073709551615" \
      '  train: "my \"data\"/a\\b*.shard"' '  dir: "yes"' '  dir: "123"'
  else
    bad config_round_trip "print -> load -> print differs: $(diff "$tmp/round1.yaml" "$tmp/round2.yaml" | head -5)"
  fi
else
  bad config_round_trip "exit status $?: $(head -c 300 "$tmp/err")"
fi

# model.rope_scaling: a nested mapping in the file, dotted keys in overrides.
printf 'model:\n  rope_theta: 5e5\n  rope_scaling:\n    type: yarn\n    factor: 8\n    beta_fast: 16\n' >"$tmp/yarn.yaml"
if "$mtrain" config "$tmp/yarn.yaml" model.rope_scaling.original_max_position_embeddings=32768 \
    >"$tmp/yarn.out" 2>"$tmp/err" && "$mtrain" config "$tmp/yarn.out" >"$tmp/yarn2.out" 2>>"$tmp/err" &&
   cmp -s "$tmp/yarn.out" "$tmp/yarn2.out"; then
  has_lines config_rope_scaling_nested "$tmp/yarn.out" "  rope_theta: 500000.0" "  rope_scaling:" "    type: yarn" \
    "    factor: 8.0" "    beta_fast: 16.0" "    beta_slow: 1.0" "    original_max_position_embeddings: 32768"
else
  bad config_rope_scaling_nested "exit status $? or print -> load -> print differs: $(head -c 300 "$tmp/err")"
fi

printf 'model:\n  rope_scaling: 4\n' >"$tmp/run.yaml"
expect_error config_rope_scaling_not_mapping "run\.yaml:2: model\.rope_scaling is a scalar \(expected a mapping" \
  "$tmp/run.yaml"

printf 'model:\n  rope_scaling:\n    type: yarn\n    fator: 8\n' >"$tmp/run.yaml"
expect_error config_rope_scaling_unknown_key \
  "run\.yaml:4: unknown key 'model\.rope_scaling\.fator' \(did you mean 'model\.rope_scaling\.factor'\?\)$" "$tmp/run.yaml"

printf 'model:\n  rope_scaling:\n    type: linear\n' >"$tmp/run.yaml"
expect_error config_rope_scaling_type "run\.yaml:3: model\.rope_scaling\.type: 'linear' is not allowed \(expected one of none, yarn\)$" \
  "$tmp/run.yaml"

expect_error config_rope_scaling_factor_range "model\.rope_scaling\.factor: '0\.5' is out of range" \
  configs/tiny-cpu.yaml model.rope_scaling.factor=0.5

expect_error config_rope_scaling_betas "model\.rope_scaling\.beta_fast: 1\.0 is not above model\.rope_scaling\.beta_slow = 2\.0" \
  configs/tiny-cpu.yaml model.rope_scaling.type=yarn model.rope_scaling.beta_fast=1 model.rope_scaling.beta_slow=2

# --- bad input: one line on stderr, naming file and line (or override) ---

printf 'model:\n  hidden_size: 64\ntrain:\n  lr: 1e-3\n\n  steps: 3\n  lrr: 2\n' >"$tmp/run.yaml"
expect_error config_unknown_key "^mtrain: .*/run\.yaml:7: unknown key 'train\.lrr' \(did you mean 'train\.lr'\?\)$" \
  "$tmp/run.yaml"

printf 'model:\n  lr: 1\n' >"$tmp/run.yaml"
expect_error config_key_in_wrong_section "run\.yaml:2: unknown key 'model\.lr' \(did you mean 'train\.lr'\?\)$" \
  "$tmp/run.yaml"

printf 'train:\n  steps: 3\nmodle:\n  hidden_size: 64\n' >"$tmp/run.yaml"
expect_error config_unknown_section "run\.yaml:3: unknown section 'modle' \(did you mean 'model'\?\)$" "$tmp/run.yaml"

printf 'model:\n  vocab_size: 256\n  hidden_size: abc\n' >"$tmp/run.yaml"
expect_error config_wrong_type \
  "run\.yaml:3: model\.hidden_size: 'abc' is not an integer \(expected an integer in \[1, 65536\]\)$" "$tmp/run.yaml"

printf 'train:\n  steps: 1e5\n' >"$tmp/run.yaml"
expect_error config_integer_must_be_whole "run\.yaml:2: train\.steps: '1e5' is not an integer" "$tmp/run.yaml"

printf 'model:\n  tie_word_embeddings: yes\n' >"$tmp/run.yaml"
expect_error config_bool_is_true_or_false "run\.yaml:2: model\.tie_word_embeddings: 'yes' is not a bool \(expected true or false\)$" \
  "$tmp/run.yaml"

printf 'train:\n  beta2: 1.0\n' >"$tmp/run.yaml"
expect_error config_out_of_range "run\.yaml:2: train\.beta2: '1\.0' is out of range \(expected a number in \[0, 1\)\)$" \
  "$tmp/run.yaml"

printf 'model:\n  num_layers: 0\n' >"$tmp/run.yaml"
expect_error config_integer_out_of_range "run\.yaml:2: model\.num_layers: '0' is out of range \(expected an integer in \[1, 1024\]\)$" \
  "$tmp/run.yaml"

printf 'train:\n  backend: gpu\n' >"$tmp/run.yaml"
expect_error config_bad_enum "run\.yaml:2: train\.backend: 'gpu' is not allowed \(expected one of cpu, cuda, auto\)$" \
  "$tmp/run.yaml"

printf 'train:\n  lr: "1\n' >"$tmp/run.yaml"
expect_error config_malformed_yaml "run\.yaml:[0-9]+: invalid YAML: " "$tmp/run.yaml"
printf 'train:\n  lr: 1\n bad: 2\n' >"$tmp/run.yaml"
expect_error config_indentation_shallower "run\.yaml:3: indentation: this line does not line up with the keys of the mapping" \
  "$tmp/run.yaml"
printf 'train:\n  steps: 5\n    lr\n' >"$tmp/run.yaml"
expect_error config_indentation_deeper "run\.yaml:2: indentation: line 3 is indented deeper than train\.steps and was read as part of its value '5 lr'" \
  "$tmp/run.yaml"
printf 'train:\nsteps: 5\n' >"$tmp/run.yaml"
expect_error config_indentation_key_at_margin "run\.yaml:2: indentation: 'steps' is not a section but the key 'train\.steps' \(expected it indented under 'train:'\)$" \
  "$tmp/run.yaml"

# Suggestions: names from Hugging Face configs and other trainers, then the
# nearest key of the same section, then of another section.
expect_error config_suggest_hf_layers "unknown key 'model\.num_hidden_layers' \(did you mean 'model\.num_layers'\?\)$" \
  configs/tiny-cpu.yaml model.num_hidden_layers=2
expect_error config_suggest_hf_heads "unknown key 'model\.num_attention_heads' \(did you mean 'model\.num_heads'\?\)$" \
  configs/tiny-cpu.yaml model.num_attention_heads=2
expect_error config_suggest_batch_size "unknown key 'train\.batch_size' \(did you mean 'train\.micro_batches'\?\)$" \
  configs/tiny-cpu.yaml train.batch_size=2
expect_error config_renamed_checkpoint_activations "'train\.checkpoint_activations' is now 'train\.recompute' \(true = full, false = none\)$" \
  configs/tiny-cpu.yaml train.checkpoint_activations=true
expect_error config_recompute_value "train\.recompute: 'some' is not allowed \(expected one of none, selective, full, auto\)$" \
  configs/tiny-cpu.yaml train.recompute=some
expect_error config_gemm_choice_value "train\.gemm_choice: 'fast' is not allowed \(expected one of timed, heuristic\)$" \
  configs/tiny-cpu.yaml train.gemm_choice=fast
expect_error config_dw_stream_value "train\.dw_stream: 'sometimes' is not allowed \(expected one of auto, on, off\)$" \
  configs/tiny-cpu.yaml train.dw_stream=sometimes
expect_error config_profile_value "log\.profile: 'maybe'" configs/tiny-cpu.yaml log.profile=maybe
expect_error config_suggest_save_every "unknown key 'checkpoint\.save_every' \(did you mean 'checkpoint\.every'\?\)$" \
  configs/tiny-cpu.yaml checkpoint.save_every=2
expect_error config_suggest_same_section_first "unknown key 'attention\.budjet' \(did you mean 'attention\.budget'\?\)$" \
  configs/tiny-cpu.yaml attention.budjet=topp
expect_error config_suggest_other_section "unknown key 'train\.hidden_size' \(did you mean 'model\.hidden_size'\?\)$" \
  configs/tiny-cpu.yaml train.hidden_size=2

# Keys that name files or folders: a missing one is named with its key.
expect_error config_path_resume "checkpoint\.resume: nope: no such checkpoint folder" configs/tiny-cpu.yaml checkpoint.resume=nope
expect_error config_path_init_from "train\.init_from: nope: no config\.json there" configs/tiny-cpu.yaml train.init_from=nope
expect_error config_path_eval_text "eval\.text: nope\.txt: no such file or folder" configs/tiny-cpu.yaml eval.text=nope.txt
expect_error config_path_eval_tokenizer "eval\.tokenizer: nope\.json: no such file or folder" configs/tiny-cpu.yaml \
  eval.tokenizer=nope.json
expect_error config_path_budget_file "attention\.budget_file: nope: no such file or folder" configs/tiny-cpu.yaml \
  attention.budget_file=nope

# Keyword-or-path keys: a keyword is the keyword, anything else a path, and
# both print back as they were given.
mkdir -p "$tmp/ck/step_00000003" "$tmp/hf"
touch "$tmp/ck/step_00000003/state.json" "$tmp/hf/config.json" "$tmp/none" "$tmp/book.txt"
mtrain_path=$(realpath "$mtrain") run_file=$(realpath configs/tiny-cpu.yaml)
(cd "$tmp" && "$mtrain_path" config "$run_file" checkpoint.resume=ck/step_00000003 'data.train=a/*.shard,b.shard' \
    data.val=v.shard attention.budget_file=./none eval.model=hf eval.text=book.txt eval.tokenizer=bytes \
    >"$tmp/paths.yaml" 2>"$tmp/err" && "$mtrain_path" config "$tmp/paths.yaml" >"$tmp/paths2.yaml" 2>>"$tmp/err")
if [ $? -eq 0 ] && cmp -s "$tmp/paths.yaml" "$tmp/paths2.yaml"; then
  has_lines config_keyword_or_path "$tmp/paths.yaml" "  resume: ck/step_00000003" '  train: "a/*.shard,b.shard"' \
    "  val: v.shard" '  budget_file: "./none"' "  model: hf" "  text: book.txt" "  tokenizer: bytes" \
    "  init_from: none"
else
  bad config_keyword_or_path "exit status or print -> load -> print differs: $(head -c 300 "$tmp/err")"
fi
expect_error config_keyword_or_path_empty \
  "^mtrain: override 'train\.init_from=': train\.init_from: '' is empty \(expected none, or a Hugging Face folder: 1 to 511 bytes\)$" \
  configs/tiny-cpu.yaml train.init_from=
expect_error config_val_shards_with_synthetic \
  "data\.val: v\.shard names shards but data\.train is 'synthetic' \(expected data\.val: holdout\)$" \
  configs/tiny-cpu.yaml data.train=synthetic data.val=v.shard

touch "$tmp/a_file"
expect_error config_output_under_a_file "log\.dir: .*/a_file/logs: cannot create it, .*/a_file is not a folder" \
  configs/tiny-cpu.yaml log.dir="$tmp/a_file/logs"
expect_error config_output_is_a_file "checkpoint\.dir: .*/a_file: cannot create it, .*/a_file is not a folder" \
  configs/tiny-cpu.yaml checkpoint.dir="$tmp/a_file"

# --help after any verb: its usage on stdout, exit 0.
for verb in train config eval tasks score generate tokenize export detokenize data shard "shard info" "train configs/tiny-cpu.yaml"; do
  "$mtrain" $verb --help >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 0 ] && grep -q "usage: mtrain" "$tmp/out" && [ ! -s "$tmp/err" ]; then ok "help: $verb --help"
  else bad "help: $verb --help" "rc=$rc, stdout $(head -c 100 "$tmp/out"), stderr $(head -c 100 "$tmp/err")"; fi
done

printf 'train:\n  lr: "abc\n' >"$tmp/run.yaml"
expect_error config_unterminated_quote "run\.yaml:3: invalid YAML: .*quoted scalar at line 2" "$tmp/run.yaml"

printf 'train:\n  lr: 1\n  lr: 2\n' >"$tmp/run.yaml"
expect_error config_key_given_twice "run\.yaml:3: train\.lr is given twice \(first at line 2\)$" "$tmp/run.yaml"

printf 'train: 3\n' >"$tmp/run.yaml"
expect_error config_section_not_mapping "run\.yaml:1: section 'train' is a scalar \(expected a mapping" "$tmp/run.yaml"

printf 'train:\n  lr: [1, 2]\n' >"$tmp/run.yaml"
expect_error config_value_not_scalar "run\.yaml:2: train\.lr: a list is not a value" "$tmp/run.yaml"

printf -- '- model\n' >"$tmp/run.yaml"
expect_error config_top_not_mapping "run\.yaml:1: the top level is a list" "$tmp/run.yaml"

printf 'data:\n  train: ""\n' >"$tmp/run.yaml"
expect_error config_empty_string "run\.yaml:2: data\.train: '' is empty" "$tmp/run.yaml"

expect_error config_missing_file "^mtrain: $tmp/nope\.yaml: cannot open \(No such file or directory\)$" "$tmp/nope.yaml"

expect_error config_bad_override_syntax "^mtrain: override 'train\.lr': not an assignment \(expected section\.key=value\)$" \
  configs/tiny-cpu.yaml train.lr

expect_error config_bad_override_value \
  "^mtrain: override 'train\.lr=abc': train\.lr: 'abc' is not a number \(expected a number in \[0, 10\]\)$" \
  configs/tiny-cpu.yaml train.lr=abc

expect_error config_override_unknown_key "^mtrain: override 'train\.lrr=3': unknown key 'train\.lrr' \(did you mean 'train\.lr'\?\)$" \
  configs/tiny-cpu.yaml train.lrr=3

printf 'model:\n  num_heads: 5\n  num_kv_heads: 2\n' >"$tmp/run.yaml"
expect_error config_heads_not_divisible "run\.yaml: model\.num_heads: 5 is not a multiple of model\.num_kv_heads = 2" \
  "$tmp/run.yaml"

expect_error config_odd_head_dim "model\.head_dim: 3 is odd" configs/tiny-cpu.yaml model.head_dim=3

expect_error config_min_lr_above_lr "train\.min_lr: 0\.5 is above train\.lr = 0\.003" configs/tiny-cpu.yaml train.min_lr=0.5

# A run that starts from a model folder takes the architecture from its
# config.json: a run-file key or an override that disagrees stops with one
# line naming the key, both values and the fix; equal keys, the context keys
# and a run file without model keys are fine.
mkdir -p "$tmp/qwen"
cat >"$tmp/qwen/config.json" <<'EOF2'
{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
 "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": true,
 "rope_theta": 1000000.0, "max_position_embeddings": 32768}
EOF2
expect_error config_init_from_disagreeing_key \
  "^mtrain: configs/tiny-cpu\.yaml \(with overrides\): model\.vocab_size: 256, but $tmp/qwen/config\.json \(train\.init_from\) has 151936 \(expected 151936 or no model\.vocab_size: .*remove the key" \
  configs/tiny-cpu.yaml train.init_from="$tmp/qwen"
expect_error config_init_from_disagreeing_override "model\.num_layers: 2, but .* has 24" \
  configs/qwen2.5-0.5b-128k-8xa100.yaml train.init_from="$tmp/qwen" model.num_layers=2
printf 'train:\n  init_from: %s\n  seq_len: 65536\nmodel:\n  max_position_embeddings: 131072\n  rope_theta: 4000000\n' \
  "$tmp/qwen" >"$tmp/finetune.yaml"
if "$mtrain" config "$tmp/finetune.yaml" >"$tmp/finetune.out" 2>"$tmp/err" &&
   "$mtrain" config configs/qwen2.5-0.5b-128k-8xa100.yaml train.init_from="$tmp/qwen" >/dev/null 2>>"$tmp/err"; then
  has_lines config_init_from_architecture_from_folder "$tmp/finetune.out" "  vocab_size: 151936" "  num_layers: 24" \
    "  max_position_embeddings: 131072" "  rope_theta: 4000000.0"
else
  bad config_init_from_architecture_from_folder "$(head -c 300 "$tmp/err")"
fi

# --- the reference ---

if "$mtrain" config --doc >"$tmp/doc.md" 2>"$tmp/err" && cmp -s "$tmp/doc.md" docs/CONFIG.md; then
  ok config_doc_is_generated
else
  bad config_doc_is_generated "docs/CONFIG.md differs from 'mtrain config --doc' (regenerate it)"
fi

exit "$failed"
