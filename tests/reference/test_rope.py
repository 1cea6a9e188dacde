# test_rope.py: RoPE context extension against torch float64 references.
#  - YaRN inverse frequencies and attention factor of model/rope.c (printed by
#    build/tests/test_rope table ...) against transformers' formula written
#    out here (_compute_yarn_parameters, in fp64), over head dims, thetas,
#    factors, betas, truncate, explicit attention_factor and mscale ratios;
#  - `mtrain score` of a model whose config.json has rope_scaling yarn against
#    tests/lib/qwen2_ref.py with the same YaRN rope: loss, logits, every gradient
#    (tolerances of tests/reference/test_reference.py);
#  - the same scaling given as model.rope_scaling.* overrides gives the same
#    loss; a model.rope_theta override changes the result as the reference says;
#  - train.init_from: the folder's config.json sets the model section, keys of
#    the run file and overrides win over it.
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

TABLE = os.path.join(harness.ROOT, "build", "tests", "test_rope")
LOSS_TOL, LOGITS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
CPU = ["train.backend=cpu"]


def hf_yarn(D, theta, factor, original, max_pos, beta_fast=None, beta_slow=None, attention_factor=None,
            mscale=None, mscale_all_dim=None, truncate=True):
    """transformers' _compute_yarn_parameters, transcribed, in float64."""
    base, dim = theta, D
    L = original or max_pos
    if attention_factor is None:
        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = beta_fast or 32
    beta_slow = beta_slow or 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(L / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    return inter * (1 - extra_factor) + extra * extra_factor, attention_factor


TABLE_CASES = [
    # D, theta, factor, original, max_pos, beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate
    (128, 1e6, 4.0, 32768, 131072, None, None, None, None, None, True),    # Qwen2.5 model card
    (128, 1e6, 16.0, 32768, 524288, None, None, None, None, None, True),   # 512K target
    (64, 1e4, 8.0, 4096, 32768, 32, 1, None, None, None, True),
    (64, 1e4, 8.0, 4096, 32768, 16, 2, None, None, None, False),           # untruncated ramp
    (128, 5e5, 2.5, 0, 8192, None, None, 1.3, None, None, True),           # explicit attention factor
    (96, 1e6, 40.0, 4096, 163840, 32, 1, None, 0.707, 0.707, True),        # DeepSeek-style mscale
    (96, 1e6, 40.0, 4096, 163840, 32, 1, None, 1.0, 0.5, True),
    (16, 1e4, 4.0, 64, 256, None, None, None, None, None, True),           # the end-to-end model below
    (8, 100.0, 3.0, 100000, 300000, None, None, None, None, None, True),   # every pair high-frequency
]


def test_tables():
    for case in TABLE_CASES:
        D, theta, factor, orig, max_pos, bf, bs, af, ms, msa, trunc = case
        args = [TABLE, "table", str(D), repr(theta), repr(factor), str(orig), str(max_pos), repr(bf or 32),
                repr(bs or 1), repr(af or 0), repr(ms or 0), repr(msa or 0), "1" if trunc else "0"]
        p = subprocess.run(args, capture_output=True, text=True)
        tag = f"yarn table D={D} theta={theta:g} s={factor:g} L={orig or max_pos} beta={bf or 32}/{bs or 1}" \
              f"{' af=' + str(af) if af else ''}{' mscale=' + str(ms) + '/' + str(msa) if ms else ''}" \
              f"{'' if trunc else ' untruncated'}"
        if p.returncode != 0:
            check(tag, False, f"exit {p.returncode}: {p.stderr.strip()}")
            continue
        got_af, got = None, {}
        for line in p.stdout.splitlines():
            w = line.split()
            if w[0] == "attention_factor":
                got_af = float(w[1])
            elif w[0] == "inv_freq":
                got[int(w[1])] = float(w[2])
        want, want_af = hf_yarn(D, theta, factor, orig, max_pos, bf, bs, af, ms, msa, trunc)
        g = torch.tensor([got.get(i, float("nan")) for i in range(D // 2)], dtype=torch.float64)
        err = float(((g - want).abs() / want).max())
        check(f"{tag} inv_freq", err < 1e-14, f"max rel err {err:.2e}")
        check(f"{tag} attention factor", got_af is not None and abs(got_af - want_af) < 1e-15,
              f"got {got_af!r}, want {want_af!r}")


def compare(tag, cfg, params, tokens, d, overrides=(), ref_cfg=None):
    """Score folder of cfg (+ overrides) against the reference run on ref_cfg."""
    mdir = os.path.join(d, tag)
    ref.write_model(mdir, cfg, params)
    tok = os.path.join(d, tag + ".tokens")
    ref.write_tokens(tok, tokens)
    gpath, lpath = os.path.join(d, tag + ".g.st"), os.path.join(d, tag + ".l.st")
    p, loss, _ = harness.score(mdir, tok, grads=gpath, logits=lpath, overrides=CPU + list(overrides))
    check(f"{tag} score runs", p.returncode == 0 and loss is not None, p.stderr.strip()[-300:])
    if loss is None:
        return None, None
    rloss, rlogits, rgrads = ref.loss_and_grads(ref_cfg or cfg, params, tokens)
    e = abs(loss - rloss) / abs(rloss)
    check(f"{tag} loss", e < LOSS_TOL, f"mtrain {loss!r} reference {rloss!r} rel err {e:.2e}")
    lg = harness.read_safetensors(lpath)["logits"]
    e = harness.rel_err(lg, rlogits)
    check(f"{tag} logits", e < LOGITS_TOL, f"rel err {e:.2e}")
    grads = harness.read_safetensors(gpath)
    worst, worst_name = 0.0, None
    for name, rg in rgrads.items():
        e = harness.rel_err(grads[name], rg) if name in grads else float("inf")
        if e > worst:
            worst, worst_name = e, name
    check(f"{tag} grads of all {len(rgrads)} tensors", worst < GRAD_TOL, f"worst {worst_name}: {worst:.2e}")
    return loss, rloss


YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


def test_end_to_end(d):
    # head_dim 16, theta 1e4, original context 16 over 61 tokens: pairs 0-1 keep
    # their frequency, the rest are interpolated, and the attention factor is 1.139.
    base = ref.make_config(vocab=97, hidden=64, inter=80, layers=2, heads=4, kv_heads=2, theta=10000.0,
                           tied=False, max_pos=64)
    cfg = dict(base, rope_scaling=YARN)
    params = ref.random_model(cfg, seed=5)
    tokens = ref.random_tokens(cfg, 61, seed=5)
    tiles = ["attention.block_size=16", "train.loss_chunk=7"]
    yarn_loss, _ = compare("yarn", cfg, params, tokens, d, tiles)
    plain_ref, plain_logits, _ = ref.loss_and_grads(base, params, tokens)
    e = harness.rel_err(ref.forward(cfg, params, tokens), plain_logits)
    check("yarn moves the reference logits 100x beyond the tolerance (the test can see YaRN)", e > 100 * LOGITS_TOL,
          f"rel diff {e:.2e}")
    # The same scaling as overrides on a plain folder.
    over = tiles + ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=4",
                    "model.rope_scaling.original_max_position_embeddings=16"]
    over_loss, _ = compare("yarn_overrides", base, params, tokens, d, over, ref_cfg=cfg)
    check("yarn by overrides = yarn from config.json", over_loss == yarn_loss, f"{over_loss!r} vs {yarn_loss!r}")
    # Untruncated ramp, betas and an explicit attention factor.
    extra = dict(YARN, beta_fast=8, beta_slow=2, truncate=False, attention_factor=0.9)
    compare("yarn_options", dict(base, rope_scaling=extra), params, tokens, d, tiles)
    # theta override (ABF): the reference at theta 5e5, and not the one at 1e4.
    abf = dict(base, rope_theta=500000.0)
    compare("rope_theta_override", base, params, tokens, d, tiles + ["model.rope_theta=500000"], ref_cfg=abf)
    e = harness.rel_err(ref.forward(abf, params, tokens), plain_logits)
    check("theta 5e5 moves the reference logits 100x beyond the tolerance", e > 100 * LOGITS_TOL, f"rel diff {e:.2e}")


def resolved(run_yaml, *overrides):
    """`mtrain config` output as {"model.rope_scaling.factor": "2.0", ...}."""
    p = harness.run(["config", run_yaml] + list(overrides))
    out, path = {}, []
    for line in p.stdout.splitlines():
        depth = (len(line) - len(line.lstrip())) // 2
        key, _, value = line.strip().partition(":")
        path = path[:depth] + [key]
        if value.strip():
            out[".".join(path)] = value.strip()
    return p, out


def test_init_from_precedence(d):
    cfg = ref.make_config(vocab=50, hidden=32, inter=48, layers=1, heads=4, kv_heads=2, theta=10000.0,
                          max_pos=1024)
    cfg["rope_scaling"] = dict(YARN, factor=2.0)
    folder = os.path.join(d, "init_folder")
    ref.write_model(folder, cfg, ref.random_model(cfg, seed=9))
    run = os.path.join(d, "init.yaml")
    with open(run, "w") as f:
        f.write(f"model:\n  rope_scaling:\n    beta_fast: 16\ntrain:\n  init_from: {folder}\n")
    p, c = resolved(run)
    check("init_from: resolves", p.returncode == 0, p.stderr.strip())
    check("init_from: config.json sets the architecture and rope_theta",
          c.get("model.hidden_size") == "32" and c.get("model.vocab_size") == "50" and
          c.get("model.rope_theta") == "10000.0" and c.get("model.max_position_embeddings") == "1024", str(c))
    check("init_from: config.json sets rope_scaling, the run file's key wins",
          c.get("model.rope_scaling.type") == "yarn" and c.get("model.rope_scaling.factor") == "2.0" and
          c.get("model.rope_scaling.beta_fast") == "16.0", str(c))
    p, c = resolved(run, "model.rope_theta=500000", "model.rope_scaling.factor=8")
    check("init_from: overrides win over config.json",
          c.get("model.rope_theta") == "500000.0" and c.get("model.rope_scaling.factor") == "8.0", str(c))
    p, c = resolved(run, "model.rope_scaling.type=none")
    check("init_from: rope_scaling switched off by an override", c.get("model.rope_scaling.type") == "none", str(c))


def main():
    harness.require_mtrain()
    if not os.access(TABLE, os.X_OK):
        check("build/tests/test_rope exists", False, "run make")
        harness.finish()
    torch.set_num_threads(2)
    test_tables()
    with tempfile.TemporaryDirectory(prefix="mtrain_rope_") as d:
        test_end_to_end(d)
        test_init_from_precedence(d)
    harness.finish()


if __name__ == "__main__":
    main()
