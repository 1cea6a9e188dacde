# bench_train_hf.py: the peer of scripts/bench_train.sh: Hugging Face
# transformers' Qwen2ForCausalLM training on one sequence of TOKENS tokens,
# the model section of a resolved mtrain run file (`mtrain config RUN.yaml`
# printed to CONFIG), as a fine-tuning run is usually set up: fp32 parameters,
# bf16 autocast, SDPA attention, gradient checkpointing, fused AdamW (on a
# GPU), random initialisation, random tokens from a fixed seed. Steps after
# the first are timed. Prints "hf_tokens_per_s N" and "hf_loss L" (the last
# step's loss). Without torch or transformers: one line naming what is
# missing, exit 2.
#   /usr/bin/python3 scripts/bench_train_hf.py CONFIG TOKENS STEPS cuda|cpu
import sys
import time

try:
    import torch
    import transformers
    import yaml
except ImportError as e:
    where = {"torch": "Debian: python3-torch", "yaml": "Debian: python3-yaml",
             "transformers": "Debian has no package: pip install transformers on the GPU machine"}
    print(f"bench_train_hf.py: needs the python module '{e.name}', which is not installed "
          f"({where.get(e.name, 'its Debian package')})", file=sys.stderr)
    sys.exit(2)


def qwen2_config(model):
    """transformers' Qwen2Config of mtrain's resolved model section."""
    rope = model.get("rope_scaling", {})
    scaling = None
    if rope.get("type", "none") == "yarn":
        scaling = {"type": "yarn", "rope_type": "yarn", "factor": rope["factor"],
                   "original_max_position_embeddings": rope["original_max_position_embeddings"],
                   "beta_fast": rope["beta_fast"], "beta_slow": rope["beta_slow"]}
    elif rope.get("type", "none") != "none":
        sys.exit(f"bench_train_hf.py: rope_scaling type '{rope['type']}' (expected none or yarn)")
    return transformers.Qwen2Config(
        vocab_size=model["vocab_size"], hidden_size=model["hidden_size"],
        intermediate_size=model["intermediate_size"], num_hidden_layers=model["num_layers"],
        num_attention_heads=model["num_heads"], num_key_value_heads=model["num_kv_heads"],
        rope_theta=model["rope_theta"], rms_norm_eps=model["rms_norm_eps"],
        tie_word_embeddings=model["tie_word_embeddings"],
        max_position_embeddings=model["max_position_embeddings"], rope_scaling=scaling,
        initializer_range=model["init_std"], use_cache=False, attn_implementation="sdpa")


def main():
    if len(sys.argv) != 5 or sys.argv[4] not in ("cuda", "cpu"):
        sys.exit("usage: bench_train_hf.py CONFIG TOKENS STEPS cuda|cpu")
    with open(sys.argv[1]) as f:
        model_section = yaml.safe_load(f)["model"]
    tokens, steps, device = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if tokens < 2 or steps < 1:
        sys.exit(f"bench_train_hf.py: TOKENS {tokens} and STEPS {steps} (expected at least 2 and 1)")
    torch.manual_seed(1)
    model = transformers.Qwen2ForCausalLM(qwen2_config(model_section)).to(device)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    ids = torch.randint(0, model_section["vocab_size"], (1, tokens), device=device)
    times, loss = [], None
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    timed = times[1:] or times
    print(f"hf_tokens_per_s {tokens * len(timed) / sum(timed):.0f}")
    print(f"hf_loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
