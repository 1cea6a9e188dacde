# test_sparse_reference.py: the sparse CPU attention kernels (forward and
# backward, through build/tests/tool_sparse_attention) against a float64 torch
# autograd reference of dense causal attention masked with exactly the
# index's pattern. Python builds a random vertical-slash pattern per q head
# (sink + random verticals, local window + random slash offsets, as budgets)
# and turns it into the CSR index the way attention/sparse/sparse.h describes: a slash at
# offset d selects, for each query block, the key blocks that q - d falls in
# for the block's first and last query; the diagonal block always; verticals
# outside the selected blocks become columns. Lengths that the block does not
# divide, blocks 4/16/64, GQA 1/2/4, queries of every block or of one rank's
# striped blocks. Also: a malformed index fails with one line naming the file.
#
# Tolerances (fp32 kernel against fp64, max |got - ref| / max |ref| per
# tensor): a dot product of D <= 64 terms and a softmax over <= a few hundred
# keys carry ~1e-6 relative error in fp32, the backward a few times more:
#   o, lse: < 1e-5        dq, dk, dv: < 1e-4
# A wrong mask (a missing block or column, an off-by-one in causality) or a
# GQA/indexing bug gives errors of order 1e-2..1.
import json
import math
import os
import random
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import check  # noqa: E402

TOOL = os.path.join(harness.ROOT, "build", "tests", "tool_sparse_attention")
FWD_TOL, GRAD_TOL = 1e-5, 1e-4


def vertical_slash(rng, heads, n, verticals, slashes):
    """Per head: sorted vertical positions (sink 0..1 + random) and slash
    offsets (local 0..2 + random), as budgets."""
    pattern = []
    for _ in range(heads):
        vert = sorted(set([0, 1] + [rng.randrange(n) for _ in range(verticals)]))
        slash = sorted(set([0, 1, 2] + [rng.randrange(n) for _ in range(slashes)]))
        pattern.append((vert, slash))
    return pattern


def build_index(pattern, n, block, q_blocks):
    """CSR index rows r = h * len(q_blocks) + i."""
    index = {"q_blocks": q_blocks, "block_start": [0], "blocks": [], "column_start": [0],
             "columns": []}
    for vert, slash in pattern:
        for qb in q_blocks:
            first, last = qb * block, min((qb + 1) * block, n) - 1
            sel = {qb}
            for d in slash:
                for q in (first, last):
                    if q - d >= 0:
                        sel.add((q - d) // block)
            sel = sorted(sel)
            cols = [c for c in vert if c <= last and c // block not in sel]
            index["blocks"] += sel
            index["columns"] += cols
            index["block_start"].append(len(index["blocks"]))
            index["column_start"].append(len(index["columns"]))
    return index


def striped_blocks(n, block, world, rank):
    return list(range(rank, (n + block - 1) // block, world))


def reference(q, k, v, dout, q_pos, index, block, scale):
    """o, lse, dq, dk, dv in float64 with the index's mask (causal, token-exact)."""
    tq, hq, d = q.shape
    n, hkv, _ = k.shape
    group = hq // hkv
    nqb = len(index["q_blocks"])
    mask = torch.zeros(hq, tq, n, dtype=torch.bool)
    kpos = torch.arange(n)
    for h in range(hq):
        for i in range(nqb):
            r = h * nqb + i
            rows = slice(i * block, min((i + 1) * block, tq))
            allowed = torch.zeros(n, dtype=torch.bool)
            for b in index["blocks"][index["block_start"][r]:index["block_start"][r + 1]]:
                allowed[b * block:(b + 1) * block] = True
            for c in index["columns"][index["column_start"][r]:index["column_start"][r + 1]]:
                allowed[c] = True
            mask[h, rows] = allowed[None, :] & (kpos[None, :] <= q_pos[rows, None])
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    kr = k.repeat_interleave(group, dim=1)                   # [n, hq, d]
    vr = v.repeat_interleave(group, dim=1)
    s = torch.einsum("thd,nhd->htn", q, kr) * scale
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)                         # [hq, tq]
    o = torch.einsum("htn,nhd->thd", torch.softmax(s, dim=-1), vr)
    (o * dout).sum().backward()
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def run_case(tag, d, n, block, hq, hkv, dim, verticals, slashes, world, rank, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    q_blocks = (striped_blocks(n, block, world, rank) if world
                else list(range((n + block - 1) // block)))
    q_pos = torch.tensor([t for b in q_blocks for t in range(b * block, min((b + 1) * block, n))])
    tq = len(q_pos)
    pattern = vertical_slash(rng, hq, n, verticals, slashes)
    index = build_index(pattern, n, block, q_blocks)
    scale = 1.0 / math.sqrt(dim)
    index.update({"heads": hq, "kv_heads": hkv, "head_dim": dim, "block": block, "seq_len": n,
                  "scale": scale})
    q = (2 * torch.randn(tq, hq, dim, generator=gen, dtype=torch.float64)).float().double()
    k = torch.randn(n, hkv, dim, generator=gen, dtype=torch.float64).float().double()
    v = torch.randn(n, hkv, dim, generator=gen, dtype=torch.float64).float().double()
    dout = torch.randn(tq, hq, dim, generator=gen, dtype=torch.float64).float().double()
    case = os.path.join(d, tag)
    os.makedirs(case)
    with open(os.path.join(case, "index.json"), "w") as f:
        json.dump(index, f)
    harness.write_safetensors(os.path.join(case, "inputs.safetensors"),
                              {"q": q, "k": k, "v": v, "dout": dout})
    p = subprocess.run([TOOL, case], capture_output=True, text=True, timeout=120)
    check(f"{tag} runs", p.returncode == 0, p.stderr.strip()[-300:])
    if p.returncode != 0:
        return
    got = harness.read_safetensors(os.path.join(case, "outputs.safetensors"))
    ref = reference(q, k, v, dout, q_pos, index, block, scale)
    errs = {name: harness.rel_err(got[name], r)
            for name, r in zip(("o", "lse", "dq", "dk", "dv"), ref)}
    per_row = len(index["blocks"]) / (hq * len(q_blocks))
    detail = ", ".join(f"{name} {e:.1e}" for name, e in errs.items())
    check(f"{tag} forward o, lse ({detail}; {per_row:.1f} blocks/row)",
          errs["o"] < FWD_TOL and errs["lse"] < FWD_TOL, detail)
    check(f"{tag} backward dq, dk, dv ({detail})",
          max(errs["dq"], errs["dk"], errs["dv"]) < GRAD_TOL, detail)


def bad_index(d):
    """A block after its row's query block: one stderr line naming the problem."""
    case = os.path.join(d, "bad")
    os.makedirs(case)
    n, block = 32, 8
    index = build_index([([0], [0])], n, block, [0, 1, 2, 3])
    index["blocks"][1] = 3                                   # row 1 (query block 1) selects block 3
    index.update({"heads": 1, "kv_heads": 1, "head_dim": 4, "block": block, "seq_len": n,
                  "scale": 0.5})
    with open(os.path.join(case, "index.json"), "w") as f:
        json.dump(index, f)
    z = torch.zeros(n, 1, 4, dtype=torch.float64)
    harness.write_safetensors(os.path.join(case, "inputs.safetensors"),
                              {"q": z, "k": z, "v": z, "dout": z})
    p = subprocess.run([TOOL, case], capture_output=True, text=True, timeout=60)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    check("index with a block after its query block fails with one line",
          p.returncode != 0 and len(lines) == 1 and "sparse index" in p.stderr
          and not os.path.exists(os.path.join(case, "outputs.safetensors")),
          f"exit {p.returncode}, stderr {p.stderr!r}")
    index["blocks"][1] = 0
    index["seq_len"] = 31                                    # tensors no longer match
    with open(os.path.join(case, "index.json"), "w") as f:
        json.dump(index, f)
    p = subprocess.run([TOOL, case], capture_output=True, text=True, timeout=60)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    check("inputs of the wrong shape fail with one line naming the file",
          p.returncode != 0 and len(lines) == 1 and "inputs.safetensors" in p.stderr,
          f"exit {p.returncode}, stderr {p.stderr!r}")


def main():
    if not os.access(TOOL, os.X_OK):
        check("build/tests/tool_sparse_attention exists", False, f"{TOOL} not built (run make)")
        harness.finish()
    # tag, length, block, q heads, kv heads, head dim, verticals, slashes, striped world, rank
    cases = [
        ("n77_b4_gqa1", 77, 4, 2, 2, 8, 6, 4, 0, 0),
        ("n150_b16_gqa2", 150, 16, 4, 2, 32, 10, 3, 0, 0),
        ("n300_b64_gqa4", 300, 64, 8, 2, 64, 20, 2, 0, 0),
        ("n203_b16_gqa4_striped", 203, 16, 4, 1, 16, 12, 5, 3, 1),
        ("n130_b8_gqa2_budget0", 130, 8, 4, 2, 32, 0, 0, 0, 0),
        ("n260_b16_gqa1_dense_budget", 260, 16, 2, 2, 32, 60, 40, 2, 0),
    ]
    with tempfile.TemporaryDirectory() as d:
        for i, c in enumerate(cases):
            run_case(*c[:1], d, *c[1:], seed=1000 + i)
        bad_index(d)
    harness.finish()


if __name__ == "__main__":
    main()
