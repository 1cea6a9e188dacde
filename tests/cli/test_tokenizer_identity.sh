#!/usr/bin/env bash
# test_tokenizer_identity.sh: a model folder's tokenizer travels with it and
# guards its data. On a Hugging Face folder with a tiny byte-level BPE
# tokenizer.json (written here), bos/eos ids and a key mtrain does not know:
# shards record their tokenizer; training from the folder on a shard of
# another tokenizer stops with one line naming both (data.check_tokenizer=false
# trains anyway); checkpoints carry the folder's tokenizer files,
# generation_config.json and foreign config.json keys; export keeps those keys
# and warns how much of a short low-lr fine-tune bf16 rounds away; eval
# defaults to the folder's tokenizer and takes its model section.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
PY=/usr/bin/python3
. tests/lib/lib.sh
export OMP_NUM_THREADS=1

# The folder: a tiny model (vocab 258) trained 2 steps, exported as F32, plus
# a tokenizer.json (256 byte tokens, one merge, <|endoftext|> = 257),
# generation_config.json and extra config.json keys.
cat >"$tmp/run.yaml" <<EOF
model:
  vocab_size: 258
  hidden_size: 48
  intermediate_size: 96
  num_layers: 1
  num_heads: 2
  num_kv_heads: 1
attention:
  block_size: 16
train:
  steps: 2
  seq_len: 64
  warmup_steps: 0
checkpoint:
  dir: $tmp/ck
  resume: never
log:
  dir: $tmp/logs
eval:
  lengths: 160
  depths: 0
  samples: 1
  out: $tmp/eval
EOF
"$MTRAIN" train "$tmp/run.yaml" >/dev/null 2>&1 && "$MTRAIN" export "$tmp/ck/step_00000002" "$tmp/hf" --dtype f32 >/dev/null 2>&1
"$PY" - "$tmp/hf" <<'EOF'
import json, sys
folder = sys.argv[1]
# GPT-2's byte -> printable character map (byte-level BPE).
keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
chars, extra = {}, 0
for b in range(256):
    if b in keep: chars[b] = chr(b)
    else: chars[b] = chr(256 + extra); extra += 1
vocab = {chars[b]: b for b in range(256)}
vocab[chars[32] + "t"] = 256
tokenizer = {"version": "1.0", "truncation": None, "padding": None,
             "added_tokens": [{"id": 257, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": True}],
             "normalizer": {"type": "NFC"},
             "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                 {"type": "Split", "pattern": {"Regex": r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+"},
                  "behavior": "Isolated", "invert": False},
                 {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
             "post_processor": None, "decoder": {"type": "ByteLevel"},
             "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                       "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                       "vocab": vocab, "merges": [chars[32] + " t"]}}
json.dump(tokenizer, open(f"{folder}/tokenizer.json", "w"))
json.dump({"bos_token_id": 257, "eos_token_id": 257, "max_new_tokens": 8}, open(f"{folder}/generation_config.json", "w"))
config = json.load(open(f"{folder}/config.json"))
config.update({"bos_token_id": 257, "eos_token_id": 257, "custom_field": {"a": [1, 2]}})
json.dump(config, open(f"{folder}/config.json", "w"), indent=2)
EOF
expect "a model folder with tokenizer.json, generation_config.json, bos/eos" '[ -f "$tmp/hf/tokenizer.json" ] && [ -f "$tmp/hf/model.safetensors" ]'

# Shards record their tokenizer.
awk 'BEGIN { for (d = 0; d < 6; d++) { f = sprintf("'"$tmp"'/doc%d.txt", d); for (i = 0; i < 120; i++) printf "the tall tree at the top %d. ", i * d > f; close(f) } }'
"$MTRAIN" tokenize --tokenizer bytes --input "$tmp"/doc*.txt --output "$tmp/bytes.shard" >/dev/null
"$MTRAIN" tokenize --tokenizer "$tmp/hf" --input "$tmp"/doc*.txt --output "$tmp/hf.shard" >/dev/null
hash=$("$MTRAIN" shard info "$tmp/hf.shard" | sed -n 's/^  tokenizer    tokenizer.json xxh64 \([0-9a-f]\{16\}\)$/\1/p')
expect "shard info: a bytes shard says bytes" '"$MTRAIN" shard info "$tmp/bytes.shard" | grep -q "^  tokenizer    bytes$"'
expect "shard info: a tokenizer.json shard gives the XXH64 of the file (${hash:-none})" '[ -n "$hash" ]'
cp "$tmp/hf/tokenizer.json" "$tmp/copy.json"
printf ' ' >>"$tmp/copy.json"
"$MTRAIN" tokenize --tokenizer "$tmp/copy.json" --input "$tmp/doc0.txt" --output "$tmp/copy.shard" >/dev/null
expect "a tokenizer.json one byte longer has another identity" \
  '"$MTRAIN" shard info "$tmp/copy.shard" | grep "^  tokenizer    tokenizer.json xxh64 " | grep -vq "$hash"'

# Training from the folder checks the shards' tokenizer.
FT="train.init_from=$tmp/hf train.steps=2 train.lr=1e-5 train.min_lr=1e-5 train.warmup_steps=0 checkpoint.resume=never"
"$MTRAIN" train "$tmp/run.yaml" $FT data.train="$tmp/bytes.shard" checkpoint.dir="$tmp/bad" >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
expect "a shard of another tokenizer stops training with one line naming both" \
  '[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q "bytes.shard: made by tokenizer bytes, but the model.s is tokenizer.json xxh64 $hash from train.init_from $tmp/hf" "$tmp/bad.err" && [ ! -d "$tmp/bad" ]'
"$MTRAIN" train "$tmp/run.yaml" $FT data.train="$tmp/bytes.shard" data.check_tokenizer=false checkpoint.dir="$tmp/forced" \
  >/dev/null 2>&1
expect "data.check_tokenizer=false trains anyway" '[ -f "$tmp/forced/step_00000002/model.safetensors" ]'
"$MTRAIN" train "$tmp/run.yaml" $FT data.train="$tmp/hf.shard" checkpoint.dir="$tmp/ft" >"$tmp/ft.out" 2>&1
expect "shards of the folder's tokenizer train" '[ -f "$tmp/ft/step_00000002/model.safetensors" ]'

# The checkpoint carries the folder's tokenizer files and foreign config keys.
ckpt=$tmp/ft/step_00000002
expect "the checkpoint carries tokenizer.json and generation_config.json of init_from" \
  'cmp -s "$tmp/hf/tokenizer.json" "$ckpt/tokenizer.json" && cmp -s "$tmp/hf/generation_config.json" "$ckpt/generation_config.json"'
keys_kept() {  # keys_kept CONFIG_JSON: bos/eos/custom_field as in the folder, owned keys as the model
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))
sys.exit(not (c.get("bos_token_id") == 257 and c.get("eos_token_id") == 257 and c.get("custom_field") == {"a": [1, 2]}
              and c["hidden_size"] == 48 and c["vocab_size"] == 258 and c["model_type"] == "qwen2"))' "$1"
}
expect "the checkpoint's config.json keeps bos_token_id, eos_token_id and unknown keys" 'keys_kept "$ckpt/config.json"'

# Export keeps them and warns about bf16 rounding.
"$MTRAIN" export "$ckpt" "$tmp/out16" >"$tmp/out16.log" 2>"$tmp/out16.err"
rc=$?
expect "export: config.json keeps bos_token_id, eos_token_id and unknown keys; tokenizer files travel" \
  '[ $rc -eq 0 ] && keys_kept "$tmp/out16/config.json" && cmp -s "$tmp/hf/tokenizer.json" "$tmp/out16/tokenizer.json"'
expect "export bf16: warns which share of the fine-tune rounds back to init_from, pointing at --dtype f32" \
  'grep -Eq "^mtrain: warning: bf16 rounding puts [0-9.]+% of the weights that training changed \([0-9]+ of [0-9]+\) back at their train.init_from values \($tmp/hf\); --dtype f32 keeps them$" "$tmp/out16.err"'
share=$(sed -n 's/.*puts \([0-9.]*\)%.*/\1/p' "$tmp/out16.err")
expect "a 2-step fine-tune at lr 1e-5 mostly vanishes in bf16 (${share:-?}% > 50%)" '[ -n "$share" ] && "$PY" -c "import sys; sys.exit(not $share > 50)"'
"$MTRAIN" export "$ckpt" "$tmp/out32" --dtype f32 >/dev/null 2>"$tmp/out32.err"
expect "export f32: no warning" '[ -f "$tmp/out32/model.safetensors" ] && [ ! -s "$tmp/out32.err" ]'

# Eval of the folder: its model section and its tokenizer, by default.
sed '/^model:/,/^attention:/{/^attention:/!d}' "$tmp/run.yaml" >"$tmp/nomodel.yaml"
"$MTRAIN" eval "$tmp/nomodel.yaml" eval.model="$tmp/hf" eval.tasks=passkey >"$tmp/eval.out" 2>"$tmp/eval.err"
rc=$?
expect "eval.model folder: its config.json and tokenizer.json are used" \
  '[ $rc -eq 0 ] && grep -q "^eval: $tmp/hf .*| tokenizer $tmp/hf$" "$tmp/eval.out"'
"$MTRAIN" eval "$tmp/nomodel.yaml" eval.model="$ckpt" eval.tasks=passkey eval.tokenizer=bytes eval.out="$tmp/eval2" \
  >"$tmp/eval2.out" 2>&1
expect "eval.tokenizer=bytes overrides the folder's" 'grep -q "| tokenizer bytes$" "$tmp/eval2.out"'

[ "$failures" -eq 0 ]
