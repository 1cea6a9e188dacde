# qwen2_ref.py: an independent Qwen2 (Qwen2.5) forward in plain torch float64,
# written from the Qwen2 equations (not from transformers). The
# tests differentiate it with autograd and compare loss, logits and every
# gradient with build/mtrain. Also makes random tiny models and writes them
# as Hugging Face folders (config.json + model.safetensors).
import json
import math
import os

import torch

import harness

torch.set_default_dtype(torch.float64)


def make_config(vocab=64, hidden=32, inter=48, layers=1, heads=4, kv_heads=4,
                theta=10000.0, eps=1e-6, tied=True, max_pos=4096):
    """A Qwen2 config.json dict (head_dim = hidden / heads, as in Qwen2)."""
    assert hidden % heads == 0 and heads % kv_heads == 0
    assert (hidden // heads) % 2 == 0
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rope_theta": theta,
        "rms_norm_eps": eps,
        "tie_word_embeddings": tied,
        "max_position_embeddings": max_pos,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


def param_shapes(cfg):
    """Ordered dict name -> shape of every parameter, HF names."""
    V, H, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = H // Hq
    shapes = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (Hq * D, H)
        shapes[p + "self_attn.q_proj.bias"] = (Hq * D,)
        shapes[p + "self_attn.k_proj.weight"] = (Hkv * D, H)
        shapes[p + "self_attn.k_proj.bias"] = (Hkv * D,)
        shapes[p + "self_attn.v_proj.weight"] = (Hkv * D, H)
        shapes[p + "self_attn.v_proj.bias"] = (Hkv * D,)
        shapes[p + "self_attn.o_proj.weight"] = (H, Hq * D)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    shapes["model.norm.weight"] = (H,)
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def random_model(cfg, seed=0):
    """Random float64 parameters, scaled so that activations stay O(1), the
    logits are spread (loss well away from log V) and every gradient is
    exercised: norm weights around 1, biases non-zero."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = 1.0 / math.sqrt(shape[1]) * torch.randn(shape, generator=g)
        else:
            fan_in = shape[1]
            t = 1.0 / math.sqrt(fan_in) * torch.randn(shape, generator=g)
        params[name] = t
    return params


def random_tokens(cfg, T, seed=0):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, cfg["vocab_size"], (T,), generator=g)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def yarn_inv_freq(D, theta, scaling, max_pos):
    """YaRN inverse frequencies [D/2] and attention factor, float64, as
    transformers' _compute_yarn_parameters defines them (rope_scaling keys:
    factor, original_max_position_embeddings (default max_pos), beta_fast 32,
    beta_slow 1, attention_factor, mscale, mscale_all_dim, truncate True)."""
    s = float(scaling["factor"])
    L = scaling.get("original_max_position_embeddings") or max_pos
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def corr_dim(rot):
        return D * math.log(L / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s * pos_freqs)
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor

    def mscale(scale, k=1.0):
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0
    af = scaling.get("attention_factor")
    if af is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            af = mscale(s, scaling["mscale"]) / mscale(s, scaling["mscale_all_dim"])
        else:
            af = mscale(s)
    return inv_freq, af


def rope_cos_sin(T, D, theta, scaling=None, max_pos=4096, pos=None):
    """cos, sin [T, D] of rotate-half RoPE at positions pos [T] (default
    0..T-1); with a YaRN rope_scaling dict the YaRN frequencies, and both
    multiplied by its attention factor."""
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        inv_freq, af = yarn_inv_freq(D, theta, scaling, max_pos)
    else:
        inv_freq, af = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D), 1.0  # [D/2]
    pos = torch.arange(T, dtype=torch.float64) if pos is None else pos.to(torch.float64)
    freqs = pos[:, None] * inv_freq[None, :]                                # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)                                 # [T, D]
    return emb.cos() * af, emb.sin() * af


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat([-x[..., d:], x[..., :d]], dim=-1)


def document_positions(T, doc_starts):
    """RoPE positions [T] restarting at 0 at each of doc_starts (ascending);
    tokens before the first start count from 0."""
    pos = torch.arange(T)
    first = torch.zeros(T, dtype=torch.long)
    for s in doc_starts:
        first[s:] = s
    return pos - first


def forward(cfg, params, tokens, doc_starts=None, mask_docs=True, reset_positions=False):
    """Logits [T, V] (float64) of one sequence of token ids [T]; with
    doc_starts (ascending positions where a document begins) a query sees
    only keys of its own document when mask_docs, and RoPE positions restart
    at each document when reset_positions."""
    H = cfg["hidden_size"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, g = H // Hq, Hq // Hkv
    eps = cfg["rms_norm_eps"]
    T = tokens.shape[0]
    pos = document_positions(T, doc_starts) if reset_positions else None
    cos, sin = rope_cos_sin(T, D, float(cfg["rope_theta"]), cfg.get("rope_scaling"), cfg["max_position_embeddings"],
                            pos)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if doc_starts is not None and mask_docs:
        doc = torch.zeros(T, dtype=torch.long)
        for s in doc_starts:
            doc[s:] += 1
        mask &= doc[:, None] == doc[None, :]
    x = params["model.embed_tokens.weight"][tokens]                       # [T, H]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # angles in fp64; float32 runs are for experiments
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        q = h @ params[p + "self_attn.q_proj.weight"].T + params[p + "self_attn.q_proj.bias"]
        k = h @ params[p + "self_attn.k_proj.weight"].T + params[p + "self_attn.k_proj.bias"]
        v = h @ params[p + "self_attn.v_proj.weight"].T + params[p + "self_attn.v_proj.bias"]
        q = q.view(T, Hq, D).transpose(0, 1)                              # [Hq, T, D]
        k = k.view(T, Hkv, D).transpose(0, 1)                             # [Hkv, T, D]
        v = v.view(T, Hkv, D).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(g, dim=0)                                 # kv head j -> q heads j*g..j*g+g-1
        v = v.repeat_interleave(g, dim=0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(D)                        # [Hq, T, T]
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                                  # [Hq, T, D]
        a = a.transpose(0, 1).reshape(T, Hq * D)
        x = x + a @ params[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        gate = h @ params[p + "mlp.gate_proj.weight"].T
        up = h @ params[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ params[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else params["lm_head.weight"]
    return x @ head.T


def loss_fn(logits, tokens):
    """Mean next-token cross entropy: logits at t predict token t+1."""
    return torch.nn.functional.cross_entropy(logits[:-1], tokens[1:])


def loss_and_grads(cfg, params, tokens, doc_starts=None, mask_docs=True, reset_positions=False):
    """(loss float, logits [T,V] float64, grads dict name -> float64 tensor)."""
    leaves = {n: t.detach().to(torch.float64).clone().requires_grad_(True) for n, t in params.items()}
    logits = forward(cfg, leaves, tokens, doc_starts, mask_docs, reset_positions)
    loss = loss_fn(logits, tokens)
    loss.backward()
    return loss.item(), logits.detach(), {n: t.grad.detach() for n, t in leaves.items()}


def round_to(params, dtype):
    """The float64 values that a dtype ("F32", "BF16", "F16") file stores."""
    tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]
    return {n: t.to(tdt).to(torch.float64) for n, t in params.items()}


def write_model(folder, cfg, params, dtype="F32"):
    """Write a Hugging Face Qwen2 folder: config.json + model.safetensors."""
    os.makedirs(folder, exist_ok=True)
    c = dict(cfg)
    c["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    harness.write_safetensors(os.path.join(folder, "model.safetensors"), params, dtype)


def write_tokens(path, tokens):
    with open(path, "w") as f:
        f.write(" ".join(str(int(t)) for t in tokens) + "\n")


def self_check():
    """The reference against itself in float64: autograd against central
    finite differences (h = 1e-6) on 3 random entries of every tensor of a
    tiny untied GQA model, and causality (the last token changes no earlier
    logit). Returns (worst fd error relative to the tensor's max |grad|,
    causal ok, loss, log V)."""
    cfg = make_config(vocab=40, hidden=16, inter=24, layers=2, heads=4, kv_heads=2, tied=False)
    params = random_model(cfg, seed=1)
    toks = random_tokens(cfg, 9, seed=1)
    loss, logits, grads = loss_and_grads(cfg, params, toks)
    worst = 0.0
    g = torch.Generator().manual_seed(5)
    for name, t in params.items():
        for _ in range(3):
            idx = tuple(int(torch.randint(0, s, (1,), generator=g)) for s in t.shape)
            h = 1e-6
            pp = {n: v.clone() for n, v in params.items()}
            pp[name][idx] += h
            lp = loss_fn(forward(cfg, pp, toks), toks).item()
            pp[name][idx] -= 2 * h
            lm = loss_fn(forward(cfg, pp, toks), toks).item()
            fd = (lp - lm) / (2 * h)
            err = abs(fd - grads[name][idx].item()) / max(grads[name].abs().max().item(), 1e-12)
            worst = max(worst, err)
    toks2 = toks.clone()
    toks2[-1] = (toks2[-1] + 1) % cfg["vocab_size"]
    l2 = forward(cfg, params, toks2)
    causal = torch.equal(l2[:-1], logits[:-1]) and not torch.equal(l2[-1], logits[-1])
    return worst, causal, loss, math.log(cfg["vocab_size"])


if __name__ == "__main__":
    worst, causal, loss, logv = self_check()
    print(f"loss {loss:.6f} (log V = {logv:.3f})")
    print(f"worst finite-difference error (relative to tensor max) {worst:.2e}")
    assert worst < 1e-6 and causal
    print("reference self-check ok")
