# bench_train_hf.py: the peer of scripts/bench_train.sh: Hugging Face
# transformers' Qwen2ForCausalLM training on one sequence of TOKENS tokens,
# the model section of a resolved mtrain run file (`mtrain config RUN.yaml`
# printed to CONFIG), as a fine-tuning run is usually set up: fp32 parameters,
# bf16 autocast, SDPA attention, gradient checkpointing, fused AdamW (on a
# GPU), random initialisation, random tokens from a fixed seed. Steps after
# the first are timed. Prints "hf_step S L" per step, "hf_tokens_per_s N",
# "hf_loss L" (the last step's loss) and, on a GPU, "hf_peak_mib M" (the
# most memory PyTorch allocated). Without torch or transformers: one line
# naming what is missing, exit 2.
#   /usr/bin/python3 scripts/bench_train_hf.py CONFIG TOKENS STEPS cuda|cpu [--init-out DIR] [--sequences FILE]
# --init-out DIR: the random initial weights written first as a Hugging Face
# folder (`train.init_from` of an mtrain run that starts from them).
# --sequences FILE: step S trains on line S (cycling) of FILE, TOKENS + 1
# token ids each (inputs and the last target, as `mtrain data --show`
# prints them), instead of the random tokens (scripts/gpu_check.sh: the
# same weights and sequences as mtrain, losses compared step by step).
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
    args, options = sys.argv[1:5], dict(zip(sys.argv[5::2], sys.argv[6::2]))
    if len(args) != 4 or args[3] not in ("cuda", "cpu") or len(sys.argv) % 2 == 0 or \
            set(options) - {"--init-out", "--sequences"}:
        sys.exit("usage: bench_train_hf.py CONFIG TOKENS STEPS cuda|cpu [--init-out DIR] [--sequences FILE]")
    with open(args[0]) as f:
        model_section = yaml.safe_load(f)["model"]
    tokens, steps, device = int(args[1]), int(args[2]), args[3]
    if tokens < 2 or steps < 1:
        sys.exit(f"bench_train_hf.py: TOKENS {tokens} and STEPS {steps} (expected at least 2 and 1)")
    torch.manual_seed(1)
    model = transformers.Qwen2ForCausalLM(qwen2_config(model_section))
    if "--init-out" in options:
        model.save_pretrained(options["--init-out"], safe_serialization=True)
    model = model.to(device)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    if "--sequences" in options:
        with open(options["--sequences"]) as f:
            batches = [torch.tensor([[int(t) for t in line.split()]], device=device) for line in f if line.strip()]
        bad = [len(b[0]) for b in batches if len(b[0]) != tokens + 1]
        if not batches or bad:
            sys.exit(f"bench_train_hf.py: {options['--sequences']}: sequences of {bad[:1] or [0]} tokens "
                     f"(expected {tokens + 1} each: inputs and the last target)")
    else:
        batches = [torch.randint(0, model_section["vocab_size"], (1, tokens), device=device)]
    times, loss = [], None
    for step in range(steps):
        ids = batches[step % len(batches)]
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
        print(f"hf_step {step + 1} {loss.item():.6f}", flush=True)
    timed = times[1:] or times
    print(f"hf_tokens_per_s {tokens * len(timed) / sum(timed):.0f}")
    print(f"hf_loss {loss.item():.4f}")
    if device == "cuda":
        print(f"hf_peak_mib {torch.cuda.max_memory_allocated() / 2**20:.0f}")


if __name__ == "__main__":
    main()
