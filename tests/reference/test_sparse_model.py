# test_sparse_model.py: sparse attention inside the model (attention.type=sparse).
#  - top_p = 1 with caps >= T selects every line, so the pattern is dense:
#    `mtrain score` gives the dense loss, logits and every gradient (fp32
#    reordering only, < 1e-5 relative) and matches the fp64 torch reference;
#  - a truly sparse setting changes the result (the pattern is applied) and
#    activation checkpointing reuses the pattern (bitwise identical grads);
#  - budget fixed, with and without a budget file, runs; a bad budget file
#    fails with one line naming the file and line;
#  - log.attention_every writes per-layer density and recall;
#  - training the tiny config (300 steps) with sparse attention at ~50%
#    density ends within 3% of dense (validation loss, same data and seed).
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

CPU = ["train.backend=cpu"]
DENSE_PATTERN = ["attention.type=sparse", "attention.top_p=1", "attention.max_vertical=100000",
                 "attention.max_slash=100000", "attention.sink=0", "attention.local=0"]
# Short sequences need small blocks to be sparse at block level.
SPARSE = ["attention.type=sparse", "attention.top_p=0.5", "attention.sink=1", "attention.local=2",
          "attention.last_q=8", "attention.block_size=4"]


def score_files(tag, mdir, tok_path, d, overrides):
    g, lg = os.path.join(d, tag + ".grads.st"), os.path.join(d, tag + ".logits.st")
    p, loss, _ = harness.score(mdir, tok_path, grads=g, logits=lg, overrides=CPU + overrides)
    check(f"{tag} score runs", p.returncode == 0 and loss is not None, p.stderr.strip()[-400:])
    if p.returncode != 0 or loss is None:
        return None
    return loss, harness.read_safetensors(g), harness.read_safetensors(lg)["logits"], open(g, "rb").read()


def test_dense_equivalence(d):
    cases = [("gqa2", ref.make_config(vocab=97, hidden=32, inter=64, layers=2, heads=2, kv_heads=1,
                                      theta=1e6, tied=False), 61, 16),
             ("gqa4", ref.make_config(vocab=150, hidden=64, inter=80, layers=2, heads=8, kv_heads=2,
                                      theta=10000.0, tied=True), 45, 5)]
    for i, (tag, cfg, T, block) in enumerate(cases):
        params = ref.random_model(cfg, seed=40 + i)
        tokens = ref.random_tokens(cfg, T, seed=40 + i)
        mdir = os.path.join(d, tag)
        ref.write_model(mdir, cfg, params)
        tok_path = os.path.join(d, tag + ".tokens")
        ref.write_tokens(tok_path, tokens)
        blk = [f"attention.block_size={block}"]
        dense = score_files(tag + " dense", mdir, tok_path, d, blk)
        full = score_files(tag + " sparse top_p=1", mdir, tok_path, d, blk + DENSE_PATTERN)
        if not dense or not full:
            continue
        check(f"{tag} sparse top_p=1 loss equals dense", abs(full[0] - dense[0]) <= 1e-5 * abs(dense[0]),
              f"{full[0]!r} vs {dense[0]!r}")
        check(f"{tag} sparse top_p=1 logits equal dense", harness.rel_err(full[2], dense[2]) < 1e-5,
              f"rel err {harness.rel_err(full[2], dense[2]):.2e}")
        worst = max(harness.rel_err(full[1][n], dense[1][n]) for n in dense[1])
        check(f"{tag} sparse top_p=1 every gradient equals dense", worst < 1e-5, f"worst rel err {worst:.2e}")
        rloss, _, rgrads = ref.loss_and_grads(cfg, params, tokens)
        check(f"{tag} sparse top_p=1 loss equals the fp64 reference", abs(full[0] - rloss) < 1e-5 * abs(rloss),
              f"{full[0]!r} vs {rloss!r}")
        worst = max(harness.rel_err(full[1][n], rgrads[n]) for n in rgrads)
        check(f"{tag} sparse top_p=1 gradients equal the fp64 reference", worst < 1e-4, f"worst {worst:.2e}")

        sparse = score_files(tag + " sparse", mdir, tok_path, d, blk + SPARSE)
        ckpt = score_files(tag + " sparse ckpt", mdir, tok_path, d,
                           blk + SPARSE + ["train.recompute=full"])
        if sparse and ckpt:
            check(f"{tag} a sparse pattern changes the loss", abs(sparse[0] - dense[0]) > 1e-4 * abs(dense[0]),
                  f"sparse {sparse[0]!r} dense {dense[0]!r}")
            check(f"{tag} sparse: activation checkpointing reuses the pattern (grads bitwise equal)",
                  sparse[3] == ckpt[3] and sparse[0] == ckpt[0])


def test_budgets(d):
    cfg = ref.make_config(vocab=97, hidden=32, inter=64, layers=2, heads=2, kv_heads=1, theta=1e6, tied=False)
    params = ref.random_model(cfg, seed=50)
    tokens = ref.random_tokens(cfg, 61, seed=50)
    mdir = os.path.join(d, "budget")
    ref.write_model(mdir, cfg, params)
    tok_path = os.path.join(d, "budget.tokens")
    ref.write_tokens(tok_path, tokens)
    fixed = ["attention.type=sparse", "attention.block_size=8", "attention.budget=fixed",
             "attention.sink=0", "attention.local=1"]
    small = score_files("fixed 2 lines", mdir, tok_path, d, fixed + ["attention.vertical=2", "attention.slash=2"])
    big = score_files("fixed 61 lines", mdir, tok_path, d, fixed + ["attention.vertical=61", "attention.slash=61"])
    dense = score_files("fixed dense", mdir, tok_path, d, ["attention.block_size=8"])
    if small and big and dense:
        check("budget fixed: every line selected gives dense", abs(big[0] - dense[0]) <= 1e-5 * abs(dense[0]),
              f"{big[0]!r} vs {dense[0]!r}")
        check("budget fixed: 2 lines differ from dense", abs(small[0] - dense[0]) > 1e-4 * abs(dense[0]))
    bf = os.path.join(d, "budgets.txt")
    with open(bf, "w") as f:
        f.write("# layer head vertical slash\n0 0 61 61\n0 1 61 61\n1 0 61 61\n1 1 61 61\n")
    filed = score_files("budget file", mdir, tok_path, d,
                        fixed + ["attention.vertical=1", "attention.slash=1", f"attention.budget_file={bf}"])
    if filed and dense:
        check("budget file overrides the counts per layer and head", abs(filed[0] - dense[0]) <= 1e-5 * abs(dense[0]),
              f"{filed[0]!r} vs {dense[0]!r}")
    with open(bf, "w") as f:
        f.write("0 0 4 4\n0 7 4 4\n")
    p = harness.score(mdir, tok_path, overrides=CPU + fixed + [f"attention.budget_file={bf}"])[0]
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check("bad budget file: non-zero exit, one line naming file:line",
          p.returncode != 0 and len(lines) == 1 and f"{bf}:2" in lines[0], p.stderr)


def train(d, tag, overrides):
    logdir = os.path.join(d, "log_" + tag)
    p = harness.run(["train", os.path.join(harness.ROOT, "configs", "tiny-cpu.yaml"), "train.steps=300",
                     "log.val_every=300", f"log.dir={logdir}", f"checkpoint.dir={os.path.join(d, 'ck_' + tag)}",
                     "checkpoint.resume=never", "attention.block_size=8"] + overrides, timeout=600)
    check(f"train {tag} runs", p.returncode == 0, p.stderr.strip()[-400:])
    if p.returncode != 0:
        return None, [], p.stdout
    rows = [json.loads(l) for l in open(os.path.join(logdir, "metrics.jsonl"))]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return val[-1], rows, p.stdout


def test_training(d):
    # At 256 tokens a top_p pattern covers nearly every 8-token block (its
    # slash lines spread over all offsets); a fixed budget keeps it sparse.
    sparse_cfg = ["attention.type=sparse", "attention.budget=fixed", "attention.vertical=8", "attention.slash=8",
                  "attention.sink=8", "attention.local=16", "attention.last_q=32", "log.attention_every=100"]
    dense, _, _ = train(d, "dense", [])
    sparse, rows, out = train(d, "sparse", sparse_cfg)
    if dense is None or sparse is None:
        return
    check("sparse training: final validation loss within 3% of dense", abs(sparse - dense) <= 0.03 * dense,
          f"sparse {sparse:.4f} dense {dense:.4f}")
    stats = [r for r in rows if "attention_density" in r]
    check("log.attention_every=100: statistics at steps 100, 200, 300", [r["step"] for r in stats] == [100, 200, 300],
          f"steps {[r['step'] for r in stats]}")
    if stats:
        dens, rec = stats[-1]["attention_density"], stats[-1]["attention_recall"]
        check("attention statistics per layer", len(dens) == 2 and len(rec) == 2, f"{dens} {rec}")
        check("density of a sparse pattern in (0, 1)", all(0 < x < 1 for x in dens), f"{dens}")
        check("recall in (0, 1]", all(0 < x <= 1 + 1e-6 for x in rec), f"{rec}")
    check("step line shows attention density and recall", "attn density" in out and "recall" in out)


def main():
    harness.require_mtrain()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="mtrain_sparse_model_") as d:
        test_dense_equivalence(d)
        test_budgets(d)
        test_training(d)
    harness.finish()


if __name__ == "__main__":
    main()
