# test_finite_diff.py: mtrain's backward against central finite differences
# of mtrain's OWN forward, independently of torch autograd. For a few scalar
# parameters from different tensors, the weight is moved by +-h in the F32
# model.safetensors, `mtrain score` is rerun, and
#     fd = (loss(w + h) - loss(w - h)) / (w+h - (w-h))   (as stored in fp32)
# is compared with the gradient that `mtrain score --grads` wrote.
#
# Tolerance: |fd - grad| <= 1e-2 * |grad| + 1e-4, with h = 1e-2 and the
# entry of largest |grad| in each tensor (|grad| ~ 0.05-0.5 here). Two error
# sources: (1) truncation, h^2/6 * f''' -- measured with the float64 reference
# on this model at < 1.5e-4 relative; (2) fp32 rounding of the loss: a loss of
# ~4.7 has an ulp of 4.8e-7, and the forward's accumulated rounding moves it by
# a few ulp between the two runs, i.e. ~1e-4 absolute on fd after dividing by
# 2h. Simulating the whole forward in fp32 gave fd errors <= 6e-4 relative on
# these entries. So 1e-2 relative (+1e-4 absolute) leaves >10x margin while
# any real backward bug (wrong sign, missing term, a factor of 2, a transposed
# index) is far outside it. torch is used only to build and write the model.
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

H_STEP = 1e-2
REL_TOL, ABS_TOL = 1e-2, 1e-4
CPU = ["train.backend=cpu"]
OVERRIDES = CPU + ["attention.block_size=5", "train.loss_chunk=6"]


def argmax_entry(g, rows=None):
    """Index tuple of the largest |g| entry (optionally within some rows)."""
    a = g.abs().clone()
    if rows is not None:
        keep = torch.zeros(a.shape[0], dtype=torch.bool)
        keep[rows] = True
        a[~keep] = -1
    flat = int(torch.argmax(a))
    idx = []
    for s in reversed(a.shape):
        idx.append(flat % s)
        flat //= s
    return tuple(reversed(idx))


def run_case(tag, cfg, seed, T, picks, d):
    """picks: list of (tensor name, row restriction or None, label)."""
    params = ref.round_to(ref.random_model(cfg, seed=seed), "F32")
    tokens = ref.random_tokens(cfg, T, seed=seed)
    tok_path = os.path.join(d, tag + ".tokens")
    ref.write_tokens(tok_path, tokens)
    base = os.path.join(d, tag + "_base")
    ref.write_model(base, cfg, params)
    gpath = os.path.join(d, tag + ".grads.st")
    p, loss0, _ = harness.score(base, tok_path, grads=gpath, overrides=OVERRIDES)
    check(f"{tag} score runs", p.returncode == 0 and loss0 is not None, p.stderr.strip()[-300:])
    if p.returncode != 0 or loss0 is None:
        return
    grads = harness.read_safetensors(gpath)
    pert = os.path.join(d, tag + "_pert")
    for name, rows, label in picks:
        if name not in grads:
            check(f"{tag} fd {label}", False, f"no gradient {name} in the grads file")
            continue
        if rows == "used":
            rows = sorted(set(int(t) for t in tokens[:-1]))
        elif rows == "unused":
            rows = sorted(set(range(cfg["vocab_size"])) - set(int(t) for t in tokens))
        idx = argmax_entry(grads[name], rows)
        g = float(grads[name][idx])
        w = float(params[name][idx])
        losses, stored = [], []
        for sign in (+1, -1):
            pp = dict(params)
            t = pp[name].clone()
            t[idx] = torch.tensor(w + sign * H_STEP, dtype=torch.float32).double()
            pp[name] = t
            stored.append(float(t[idx]))
            ref.write_model(pert, cfg, pp)
            q, l, _ = harness.score(pert, tok_path, overrides=OVERRIDES)
            if q.returncode != 0 or l is None:
                check(f"{tag} fd {label}", False, f"perturbed run failed: {q.stderr.strip()[-300:]}")
                break
            losses.append(l)
        if len(losses) != 2:
            continue
        fd = (losses[0] - losses[1]) / (stored[0] - stored[1])
        err = abs(fd - g)
        tol = REL_TOL * abs(g) + ABS_TOL
        check(f"{tag} fd {label} {name}{list(idx)}", err <= tol,
              f"grad {g:+.6e} finite difference {fd:+.6e} (losses {losses[0]!r}, {losses[1]!r}) "
              f"err {err:.2e} > tol {tol:.2e}")


def main():
    harness.require_mtrain()
    with tempfile.TemporaryDirectory(prefix="mtrain_fd_") as d:
        # untied, GQA 2, two layers
        cfg = ref.make_config(vocab=64, hidden=32, inter=48, layers=2, heads=4, kv_heads=2,
                              theta=10000.0, tied=False)
        run_case("untied", cfg, 7, 17, [
            ("model.embed_tokens.weight", "used", "embedding row"),
            ("model.layers.0.self_attn.q_proj.bias", None, "q bias"),
            ("model.layers.1.input_layernorm.weight", None, "norm weight"),
            ("model.layers.0.mlp.down_proj.weight", None, "down_proj"),
            ("model.layers.1.self_attn.k_proj.weight", None, "k_proj"),
            ("model.layers.1.self_attn.v_proj.bias", None, "v bias"),
            ("model.norm.weight", None, "final norm"),
            ("lm_head.weight", None, "lm_head"),
        ], d)
        # tied: the embedding is also the head; an unused row gets only the
        # head's gradient, a used row both
        cfg = ref.make_config(vocab=48, hidden=32, inter=40, layers=1, heads=2, kv_heads=1,
                              theta=1e6, tied=True)
        run_case("tied", cfg, 8, 15, [
            ("model.embed_tokens.weight", "used", "embedding row (input + head)"),
            ("model.embed_tokens.weight", "unused", "embedding row (head only)"),
            ("model.layers.0.mlp.gate_proj.weight", None, "gate_proj"),
            ("model.layers.0.self_attn.o_proj.weight", None, "o_proj"),
        ], d)
    harness.finish()


if __name__ == "__main__":
    main()
