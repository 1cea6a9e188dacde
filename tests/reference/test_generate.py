# test_generate.py: `mtrain generate` (model/decode.c: a KV cache over the
# backend ops) against an independent greedy loop on the float64 torch
# reference of tests/lib/qwen2_ref.py that recomputes the whole sequence for every
# new token (no cache), as transformers' generate(do_sample=False) picks
# tokens: the argmax of the last position's logits. Weights are stored F32
# and the reference computes on those values in float64; every step's
# margin between the best and the second-best logit is checked to be well
# above fp32 rounding, so that equal ids are the claim and not luck.
# Also: a prompt longer than one prefill chunk (256 tokens), GQA, tied and
# untied heads, YaRN; text output with the bytes tokenizer (always UTF-8:
# invalid bytes as U+FFFD, as Python decodes them); a stop at the end
# of text; sampling with a seed is reproducible and a different seed changes
# it; --top-k 1 equals greedy; sampled tokens lie in the top-k set / the top-p nucleus of the
# reference's distribution at their step; the CUDA backend (build/sim/mtrain,
# bf16) gives the CPU's greedy ids on a tiny model; bad input (no model
# folder, an empty prompt, ids outside the vocabulary, bad numbers) is one
# line and a non-zero exit.
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

CPU = ["train.backend=cpu"]
SIM = os.path.join(harness.ROOT, "build", "sim", "mtrain")
MIN_MARGIN = 1e-3   # fp32 logits of these models are good to ~1e-5


def reference_greedy(cfg, params, prompt, new):
    """(ids [new], the smallest top-1 minus top-2 logit gap of the steps)."""
    toks, out, margin = prompt.clone(), [], float("inf")
    for _ in range(new):
        last = ref.forward(cfg, params, toks)[-1]
        top = torch.topk(last, 2).values
        margin = min(margin, float(top[0] - top[1]))
        nxt = int(last.argmax())
        out.append(nxt)
        toks = torch.cat([toks, torch.tensor([nxt])])
    return out, margin


def generate(model, tokens_path, args, binary=None, overrides=CPU):
    """(CompletedProcess, new ids or None) of `mtrain generate --ids`."""
    cmd = ["generate", "--model", model, "--tokens", tokens_path, "--ids"] + list(args) + list(overrides)
    p = subprocess.run([binary or harness.MTRAIN] + cmd, capture_output=True, text=True, timeout=300)
    ids = [int(x) for x in p.stdout.split()] if p.returncode == 0 else None
    return p, ids


def one_line_error(p, tag, needle):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(f"{tag}: exits non-zero with one line naming {needle}",
          p.returncode != 0 and len(lines) == 1 and needle in p.stderr,
          f"exit {p.returncode}, stderr {p.stderr!r}")


# tag, config, prompt length, new tokens
GREEDY = [
    ("gqa2-untied-2layers", ref.make_config(vocab=64, hidden=32, inter=48, layers=2, heads=4, kv_heads=2,
                                            tied=False), 7, 24),
    ("mha-tied-prompt300", ref.make_config(vocab=96, hidden=32, inter=40, layers=1, heads=2, kv_heads=2,
                                           theta=1e6, tied=True), 300, 6),
    ("gqa4-yarn", dict(ref.make_config(vocab=80, hidden=64, inter=48, layers=2, heads=4, kv_heads=1, max_pos=64),
                       rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}), 20, 16),
]


def test_greedy(d):
    for i, (tag, cfg, T, new) in enumerate(GREEDY):
        params = ref.round_to(ref.random_model(cfg, seed=10 + i), "F32")
        prompt = ref.random_tokens(cfg, T, seed=10 + i)
        folder, tok = os.path.join(d, tag), os.path.join(d, tag + ".tok")
        ref.write_model(folder, cfg, params)
        ref.write_tokens(tok, prompt)
        want, margin = reference_greedy(cfg, params, prompt, new)
        p, got = generate(folder, tok, ["--temperature", "0", "--max-new", str(new)])
        check(f"greedy {tag}: the reference's margins are meaningful", margin > MIN_MARGIN, f"margin {margin}")
        check(f"greedy {tag}: {new} ids equal the reference's recomputed greedy loop", got == want,
              f"got {got}, want {want}, stderr {p.stderr.strip()[-300:]}")


def test_sampling(d):
    cfg = ref.make_config(vocab=64, hidden=32, inter=48, layers=2, heads=4, kv_heads=2, tied=False)
    params = ref.round_to(ref.random_model(cfg, seed=20), "F32")
    prompt = ref.random_tokens(cfg, 5, seed=20)
    folder, tok = os.path.join(d, "sample"), os.path.join(d, "sample.tok")
    ref.write_model(folder, cfg, params)
    ref.write_tokens(tok, prompt)
    n = ["--max-new", "30"]
    _, a = generate(folder, tok, n + ["--temperature", "1.5", "--seed", "7"])
    _, b = generate(folder, tok, n + ["--temperature", "1.5", "--seed", "7"])
    _, c = generate(folder, tok, n + ["--temperature", "1.5", "--seed", "8"])
    _, greedy = generate(folder, tok, n + ["--temperature", "0"])
    _, top1 = generate(folder, tok, n + ["--temperature", "1.5", "--top-k", "1", "--seed", "3"])
    check("sampling: the same seed gives the same 30 ids", a is not None and a == b, f"{a} vs {b}")
    check("sampling: another seed gives other ids", a is not None and a != c, f"{a} vs {c}")
    check("sampling: temperature 1.5 differs from greedy", a is not None and a != greedy, f"{a} vs {greedy}")
    check("sampling: --top-k 1 equals greedy", top1 is not None and top1 == greedy, f"{top1} vs {greedy}")

    # Every sampled token inside the set the rule allows at its step, from the reference's logits.
    def allowed(ids, rule):
        logits = ref.forward(cfg, params, torch.cat([prompt, torch.tensor(ids[:-1])]))[len(prompt) - 1:]
        for step, t in enumerate(ids):
            probs = torch.softmax(logits[step], -1)
            order = torch.argsort(probs, descending=True)
            if t not in rule(probs, order):
                return f"step {step}: token {t} (p {float(probs[t]):.4f})"
        return None

    _, k3 = generate(folder, tok, n + ["--top-k", "3", "--seed", "1"])
    bad = allowed(k3, lambda probs, order: set(order[:3].tolist())) if k3 else "no output"
    check("sampling: --top-k 3 draws only among the 3 most likely", bad is None, bad)
    _, p5 = generate(folder, tok, n + ["--top-p", "0.5", "--seed", "1"])

    def nucleus(probs, order):
        keep, mass = [], 0.0
        for t in order.tolist():
            keep.append(t)
            mass += float(probs[t])
            if mass >= 0.5 - 1e-6:   # the boundary token, with slack for fp32
                break
        return set(keep)
    bad = allowed(p5, nucleus) if p5 else "no output"
    check("sampling: --top-p 0.5 draws only from the nucleus", bad is None, bad)
    check("sampling: --top-p 0.5 is not greedy", p5 is not None and p5 != greedy, f"{p5}")


def test_text(d):
    """A bytes model (vocab 258, no tokenizer.json): --prompt text in, the
    same ids out as --tokens with the prompt's bytes, and the text is those
    bytes read as UTF-8 with every invalid or cut-short sequence as U+FFFD
    (Python's decode(errors="replace")): greedy, and 300 tokens sampled at
    temperature 3 from random weights, which give invalid sequences (and,
    among them, a few valid characters of 2 to 4 bytes)."""
    cfg = ref.make_config(vocab=258, hidden=32, inter=48, layers=1, heads=2, kv_heads=1)
    folder, tok = os.path.join(d, "bytes"), os.path.join(d, "bytes.tok")
    ref.write_model(folder, cfg, ref.random_model(cfg, seed=30))
    ref.write_tokens(tok, list(b"Hello"))
    for tag, new, sampling in (("greedy", 12, ["--temperature", "0"]),
                               ("sampled", 300, ["--temperature", "3", "--seed", "5"])):
        args = ["generate", "--model", folder, "--max-new", str(new), "--prompt", "Hello"] + sampling + CPU
        text = subprocess.run([harness.MTRAIN] + args, capture_output=True, timeout=300)
        _, ids = generate(folder, tok, sampling + ["--max-new", str(new)])
        if ids and 256 in ids:                   # stops after <|endoftext|>
            ids = ids[:ids.index(256) + 1]
        raw = bytes(t for t in (ids or []) if t < 256)
        want = raw.decode("utf-8", "replace").encode()
        check(f"text {tag}: --prompt on the bytes tokenizer gives the --tokens ids as UTF-8 text",
              text.returncode == 0 and ids is not None and text.stdout == want + b"\n",
              f"{text.stdout!r} vs {want!r}, stderr {text.stderr.strip()[-300:]}")
        if tag == "sampled":
            check("text sampled: the ids hold bytes that are not UTF-8 (the case under test)", want != raw,
                  f"{raw!r}")


def test_end_of_text(d):
    """A bytes model whose every step's best token is <|endoftext|> (256):
    layers that add nothing (o_proj, down_proj zero), embedding column 0 at 5,
    the head's row 256 reading it: --ids ends with 256, and the text is empty."""
    cfg = ref.make_config(vocab=258, hidden=32, inter=48, layers=1, heads=2, kv_heads=1, tied=False)
    params = ref.random_model(cfg, seed=60)
    params["model.layers.0.self_attn.o_proj.weight"].zero_()
    params["model.layers.0.mlp.down_proj.weight"].zero_()
    params["model.embed_tokens.weight"][:, 0] = 5.0
    params["model.norm.weight"].fill_(1.0)
    params["lm_head.weight"][256] = 0.0
    params["lm_head.weight"][256, 0] = 20.0
    folder, tok = os.path.join(d, "eot"), os.path.join(d, "eot.tok")
    ref.write_model(folder, cfg, params)
    ref.write_tokens(tok, list(b"Hi"))
    _, ids = generate(folder, tok, ["--temperature", "0", "--max-new", "5"])
    text = subprocess.run([harness.MTRAIN, "generate", "--model", folder, "--prompt", "Hi", "--temperature", "0",
                           "--tokenizer", "bytes"] + CPU, capture_output=True, timeout=300)
    check("end of text: generation stops at <|endoftext|>, its id last of --ids", ids == [256], f"{ids}")
    check("end of text: no text for it", text.returncode == 0 and text.stdout == b"\n", f"{text.stdout!r}")


def test_cuda(d):
    if not os.path.exists(SIM):
        check("cuda: build/sim/mtrain exists", False, f"{SIM} not built (make build-sim)")
        return
    cfg = ref.make_config(vocab=257, hidden=128, inter=200, layers=2, heads=2, kv_heads=1, tied=False)
    params = ref.random_model(cfg, seed=40)
    prompt = ref.random_tokens(cfg, 70, seed=40)
    folder, tok = os.path.join(d, "cuda"), os.path.join(d, "cuda.tok")
    ref.write_model(folder, cfg, params)
    ref.write_tokens(tok, prompt)
    args = ["--temperature", "0", "--max-new", "8"]
    _, cpu = generate(folder, tok, args)
    p, gpu = generate(folder, tok, args, binary=SIM, overrides=["train.backend=cuda"])
    check("cuda: the CUDA backend's greedy ids equal the CPU's", cpu is not None and gpu == cpu,
          f"cuda {gpu} cpu {cpu}, stderr {p.stderr.strip()[-300:]}")


def test_bad_input(d):
    cfg = ref.make_config(vocab=64, hidden=32, inter=48, layers=1, heads=2, kv_heads=2)
    folder = os.path.join(d, "bad")
    ref.write_model(folder, cfg, ref.random_model(cfg, seed=50))
    tok = os.path.join(d, "bad.tok")
    run = lambda *a: harness.run(["generate"] + list(a) + CPU, timeout=60)  # noqa: E731
    one_line_error(run("--model", os.path.join(d, "missing"), "--prompt", "x"), "missing model", "config.json")
    one_line_error(run("--model", folder, "--prompt", ""), "empty prompt", "--prompt")
    ref.write_tokens(tok, [1, 2, 64])
    one_line_error(run("--model", folder, "--tokens", tok), "id out of vocabulary", "outside")
    ref.write_tokens(tok, [])
    one_line_error(run("--model", folder, "--tokens", tok), "empty tokens file", "no token ids")
    ref.write_tokens(tok, [1, 2])
    one_line_error(run("--model", folder, "--tokens", tok, "--top-p", "0"), "top-p 0", "--top-p")
    one_line_error(run("--model", folder, "--tokens", tok, "--temperature", "-1"), "negative temperature",
                   "--temperature")


def main():
    harness.require_mtrain()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="mtrain_generate_") as d:
        test_greedy(d)
        test_sampling(d)
        test_text(d)
        test_end_of_text(d)
        test_cuda(d)
        test_bad_input(d)
    harness.finish()


if __name__ == "__main__":
    main()
