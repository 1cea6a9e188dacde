# test_reference.py: `mtrain score` (CPU backend, fp32) against the
# independent float64 torch reference of tests/lib/qwen2_ref.py on tiny Qwen2
# models: loss, logits and the gradient of every parameter, over configs that
# vary tied/untied head, GQA ratio 1/2/4, head dim 8/16/32, 1-3 layers, odd
# sequence lengths, vocabulary size, rope theta and tile sizes that do not
# divide the sequence. Also: recompute selective and full change no bit of the
# gradients, BF16/F16 files load, and bad model folders / token files fail
# with one clear line naming the file.
#
# Tolerances (fp32 against fp64): one fp32 rounding is 6e-8 relative; the
# dot products here have at most a few hundred terms and pass through <= 3
# layers, so the forward carries ~1e-6 relative error and the backward a few
# times more (softmax and RMSNorm backward subtract nearly equal terms).
#   loss:    |got - ref| / |ref|                       < 1e-5
#   logits:  max |got - ref| / max |ref|               < 1e-5
#   grads:   max |got - ref| / max |ref|  per tensor   < 1e-4
# An indexing, transpose, GQA, RoPE or masking bug gives errors of order 1.
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

LOSS_TOL, LOGITS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
CPU = ["train.backend=cpu"]

# name, config, sequence length, overrides (tiles that do not divide T)
CONFIGS = [
    ("cfg0", ref.make_config(vocab=50, hidden=32, inter=48, layers=1, heads=4, kv_heads=4,
                             theta=10000.0, tied=True), 7,
     ["attention.block_size=5", "train.loss_chunk=3"]),
    ("cfg1", ref.make_config(vocab=97, hidden=32, inter=64, layers=2, heads=2, kv_heads=1,
                             theta=1e6, tied=False), 33,
     ["attention.block_size=16", "train.loss_chunk=7"]),
    ("cfg2", ref.make_config(vocab=300, hidden=128, inter=96, layers=3, heads=4, kv_heads=1,
                             theta=1e6, tied=True), 61,
     ["attention.block_size=16", "train.loss_chunk=7"]),
    ("cfg3", ref.make_config(vocab=150, hidden=64, inter=80, layers=2, heads=8, kv_heads=2,
                             theta=10000.0, tied=False), 61,
     ["attention.block_size=5", "train.loss_chunk=7"]),
    ("cfg4", ref.make_config(vocab=211, hidden=48, inter=40, layers=3, heads=3, kv_heads=3,
                             theta=10000.0, eps=1e-5, tied=False), 33,
     ["attention.block_size=16", "train.loss_chunk=5"]),
    ("cfg5", ref.make_config(vocab=64, hidden=64, inter=128, layers=1, heads=2, kv_heads=1,
                             theta=1e6, tied=True), 61,
     ["attention.block_size=5", "train.loss_chunk=64"]),
]


def one_line_error(p, tag, needles):
    """Non-zero exit, exactly one stderr line, containing every needle."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(f"{tag} exits non-zero", p.returncode != 0, f"exit status {p.returncode}")
    check(f"{tag} one stderr line", len(lines) == 1, f"stderr has {len(lines)} lines: {p.stderr!r}")
    text = p.stderr
    missing = [n for n in needles if n not in text]
    check(f"{tag} error names {', '.join(needles)}", not missing, f"missing {missing} in {p.stderr!r}")


def compare_run(tag, cfg, params, tokens, d, overrides, doc_starts=None, mask_docs=True, reset_positions=False):
    """Write the model, score it with grads and logits (and the documents:
    masked when mask_docs, RoPE restarting at each when reset_positions),
    compare everything."""
    mdir = os.path.join(d, tag)
    ref.write_model(mdir, cfg, params)
    tok_path = os.path.join(d, tag + ".tokens")
    ref.write_tokens(tok_path, tokens)
    docs = None
    if doc_starts is not None:
        docs = os.path.join(d, tag + ".docs")
        with open(docs, "w") as f:
            f.write(" ".join(str(s) for s in doc_starts) + "\n")
        overrides = overrides + [f"data.doc_mask={str(mask_docs).lower()}",
                                 f"data.reset_positions={str(reset_positions).lower()}"]
    gpath, lpath = os.path.join(d, tag + ".grads.st"), os.path.join(d, tag + ".logits.st")
    p, loss, ntok = harness.score(mdir, tok_path, grads=gpath, logits=lpath, overrides=CPU + overrides,
                                  docs=docs)
    check(f"{tag} score runs", p.returncode == 0 and loss is not None,
          f"exit {p.returncode}, stderr: {p.stderr.strip()[-500:]}, stdout: {p.stdout.strip()[-300:]}")
    if p.returncode != 0 or loss is None:
        return None
    check(f"{tag} tokens line", ntok == len(tokens), f"tokens {ntok}, expected {len(tokens)}")
    rloss, rlogits, rgrads = ref.loss_and_grads(cfg, params, tokens, doc_starts, mask_docs, reset_positions)
    lerr = abs(loss - rloss) / abs(rloss)
    check(f"{tag} loss", lerr < LOSS_TOL, f"mtrain {loss!r} reference {rloss!r} rel err {lerr:.2e}")

    harness.check_logits(tag, lpath, rlogits, LOGITS_TOL)
    grads = harness.read_safetensors(gpath)
    harness.check_grad_names(tag, grads, params)
    for name, rg in rgrads.items():
        g = grads.get(name)
        if g is None:
            continue  # reported by the names check
        if tuple(g.shape) != tuple(rg.shape):
            check(f"{tag} grad {name}", False, f"shape {list(g.shape)}, expected {list(rg.shape)}")
            continue
        e = harness.rel_err(g, rg)
        check(f"{tag} grad {name}", e < GRAD_TOL,
              f"max abs err / max abs ref = {e:.2e} (max abs ref {float(rg.abs().max()):.3e})")
    return loss


def test_configs(d):
    for i, (tag, cfg, T, overrides) in enumerate(CONFIGS):
        params = ref.random_model(cfg, seed=i)
        tokens = ref.random_tokens(cfg, T, seed=i)
        compare_run(tag, cfg, params, tokens, d, overrides)


DOC_STARTS = [5, 16, 17, 40, 41, 100, 149]


def test_documents(d):
    """data.doc_mask with --docs: documents crossing tiles, one-token
    documents, position 0 continuing a document; dense and sparse (top_p = 1
    keeps every line: it must equal dense); and the one-line refusals."""
    cfg = ref.make_config(vocab=97, hidden=32, inter=64, layers=2, heads=4, kv_heads=2, theta=1e6, tied=False)
    params = ref.random_model(cfg, seed=40)
    tokens = ref.random_tokens(cfg, 150, seed=40)
    base = ["attention.block_size=16", "train.loss_chunk=7"]
    compare_run("docs_dense", cfg, params, tokens, d, base, DOC_STARTS)
    compare_run("docs_sparse", cfg, params, tokens, d, base + [
        "attention.type=sparse", "attention.top_p=1", "attention.last_q=16",
        "attention.max_vertical=150", "attention.max_slash=150"], DOC_STARTS)
    # RoPE restarting at each document: without the mask tokens attend across
    # documents at distances of two numberings (the reference differs from
    # the global-position run); with it only rounding changes.
    compare_run("docs_reset_unmasked", cfg, params, tokens, d, base, DOC_STARTS, mask_docs=False,
                reset_positions=True)
    compare_run("docs_reset_masked", cfg, params, tokens, d, base, DOC_STARTS, reset_positions=True)
    global_loss = ref.loss_and_grads(cfg, params, tokens)[0]
    reset_loss = ref.loss_and_grads(cfg, params, tokens, DOC_STARTS, mask_docs=False, reset_positions=True)[0]
    check("docs_reset_unmasked differs from global positions", abs(reset_loss - global_loss) > 1e-4 * abs(global_loss),
          f"reset {reset_loss!r} global {global_loss!r}")
    mdir, tok_path = os.path.join(d, "docs_dense"), os.path.join(d, "docs_dense.tokens")
    bad = {"unsorted": "5 40 17", "outside": "5 150", "garbage": "5 x"}
    for name, text in bad.items():
        path = os.path.join(d, name + ".docs")
        with open(path, "w") as f:
            f.write(text + "\n")
        p = harness.score(mdir, tok_path, overrides=CPU + ["data.doc_mask=true"], docs=path)[0]
        one_line_error(p, f"document starts {name}", [path, "document start"])
    p = harness.score(mdir, tok_path, overrides=CPU + ["data.doc_mask=true"])[0]
    one_line_error(p, "doc_mask without --docs", ["data.doc_mask", "--docs"])
    p = harness.score(mdir, tok_path, overrides=CPU, docs=os.path.join(d, "docs_dense.docs"))[0]
    one_line_error(p, "--docs without doc_mask", ["data.doc_mask", "--docs"])
    p = harness.score(mdir, tok_path, overrides=CPU + ["data.reset_positions=true"])[0]
    one_line_error(p, "reset_positions without --docs", ["data.reset_positions", "--docs"])


def test_recompute(d):
    tag, cfg, T, overrides = CONFIGS[3]
    params = ref.random_model(cfg, seed=3)
    tokens = ref.random_tokens(cfg, T, seed=3)
    mdir = os.path.join(d, "ckpt")
    ref.write_model(mdir, cfg, params)
    tok_path = os.path.join(d, "ckpt.tokens")
    ref.write_tokens(tok_path, tokens)
    out = {}
    for policy in ("none", "selective", "full"):
        g = os.path.join(d, f"ckpt_{policy}.st")
        p, loss, _ = harness.score(mdir, tok_path, grads=g,
                                   overrides=CPU + overrides + [f"train.recompute={policy}"])
        check(f"recompute={policy} runs", p.returncode == 0 and loss is not None, p.stderr.strip()[-300:])
        if p.returncode != 0:
            return
        out[policy] = (loss, open(g, "rb").read(), g)
    for policy in ("selective", "full"):
        same = out["none"][1] == out[policy][1]
        detail = ""
        if not same:
            a, b = harness.read_safetensors(out["none"][2]), harness.read_safetensors(out[policy][2])
            diff = [n for n in a if n not in b or not torch.equal(a[n], b[n])]
            detail = f"grads files differ; tensors that differ: {diff[:6]}"
        check(f"recompute {policy} grads bitwise identical to none", same, detail)
        check(f"recompute {policy} loss identical to none", out["none"][0] == out[policy][0],
              f"{out['none'][0]!r} vs {out[policy][0]!r}")


def test_half_files(d):
    tag, cfg, T, overrides = CONFIGS[1]
    params = ref.random_model(cfg, seed=11)
    tokens = ref.random_tokens(cfg, T, seed=11)
    tok_path = os.path.join(d, "half.tokens")
    ref.write_tokens(tok_path, tokens)
    for dtype in ("BF16", "F16"):
        mdir = os.path.join(d, "half_" + dtype)
        ref.write_model(mdir, cfg, params, dtype=dtype)
        lpath = os.path.join(d, f"half_{dtype}.logits.st")
        p, loss, _ = harness.score(mdir, tok_path, logits=lpath, overrides=CPU + overrides)
        check(f"{dtype} model loads", p.returncode == 0 and loss is not None, p.stderr.strip()[-300:])
        if p.returncode != 0 or loss is None:
            continue
        # the reference runs on the values the file stores (rounded to dtype)
        rloss, rlogits, _ = ref.loss_and_grads(cfg, ref.round_to(params, dtype), tokens)
        e = abs(loss - rloss) / abs(rloss)
        check(f"{dtype} loss", e < LOSS_TOL, f"mtrain {loss!r} reference {rloss!r} rel err {e:.2e}")
        lg = harness.read_safetensors(lpath).get("logits")
        ok = lg is not None and tuple(lg.shape) == tuple(rlogits.shape)
        e = harness.rel_err(lg, rlogits) if ok else float("inf")
        check(f"{dtype} logits", e < LOGITS_TOL, f"max abs err / max abs = {e:.2e}")


def test_bad_inputs(d):
    tag, cfg, T, _ = CONFIGS[1]  # untied, 2 layers
    params = ref.random_model(cfg, seed=21)
    tokens = ref.random_tokens(cfg, T, seed=21)
    tok_path = os.path.join(d, "bad.tokens")
    ref.write_tokens(tok_path, tokens)

    def folder(name, p=params):
        m = os.path.join(d, name)
        ref.write_model(m, cfg, p)
        return m

    def score(m, toks=tok_path):
        return harness.score(m, toks, overrides=CPU)[0]

    # missing config.json
    m = folder("bad_noconfig")
    os.remove(os.path.join(m, "config.json"))
    one_line_error(score(m), "missing config.json", ["config.json"])

    # truncated model.safetensors (cut in the middle of the tensor data)
    m = folder("bad_truncated")
    st = os.path.join(m, "model.safetensors")
    size = os.path.getsize(st)
    with open(st, "r+b") as f:
        f.truncate(size - size // 3)
    one_line_error(score(m), "truncated model.safetensors", ["model.safetensors"])

    # truncated inside the header
    m = folder("bad_truncated_header")
    st = os.path.join(m, "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(40)
    one_line_error(score(m), "truncated safetensors header", ["model.safetensors"])

    # a tensor with the wrong shape
    bad = dict(params)
    name = "model.layers.1.self_attn.k_proj.weight"
    bad[name] = params[name].T.contiguous()
    m = folder("bad_shape", bad)
    one_line_error(score(m), "wrong tensor shape", ["model.safetensors", name])

    # a missing tensor
    bad = dict(params)
    name = "model.layers.0.mlp.up_proj.weight"
    del bad[name]
    m = folder("bad_missing", bad)
    one_line_error(score(m), "missing tensor", ["model.safetensors", name])

    # untied model without lm_head.weight
    bad = dict(params)
    del bad["lm_head.weight"]
    m = folder("bad_nohead", bad)
    one_line_error(score(m), "untied model without lm_head", ["model.safetensors", "lm_head.weight"])

    # a token id >= vocab_size
    m = folder("bad_tokens_model")
    bt = os.path.join(d, "oob.tokens")
    toks = tokens.clone()
    toks[5] = cfg["vocab_size"]
    ref.write_tokens(bt, toks)
    one_line_error(score(m, bt), "token id >= vocab_size", ["oob.tokens"])

    # a negative token id
    nt = os.path.join(d, "negative.tokens")
    with open(nt, "w") as f:
        f.write("1 2 -3 4\n")
    one_line_error(score(m, nt), "negative token id", ["negative.tokens"])

    # garbage in the token file
    gt = os.path.join(d, "garbage.tokens")
    with open(gt, "w") as f:
        f.write("1 2 three 4\n")
    one_line_error(score(m, gt), "non-numeric token", ["garbage.tokens"])


def main():
    harness.require_mtrain()
    torch.set_num_threads(2)
    worst, causal, _, _ = ref.self_check()
    check("reference autograd matches its own fp64 finite differences", worst < 1e-6, f"worst {worst:.2e}")
    check("reference is causal", causal)
    with tempfile.TemporaryDirectory(prefix="mtrain_ref_") as d:
        test_configs(d)
        test_recompute(d)
        test_half_files(d)
        test_bad_inputs(d)
        test_documents(d)
    harness.finish()


if __name__ == "__main__":
    main()
