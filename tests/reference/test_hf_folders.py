# test_hf_folders.py: Hugging Face folders in and out of mtrain.
#  - sharded load (model.safetensors.index.json + shards) equals single-file
#    load: `mtrain export --max-shard-size` splits a tiny model over >= 3 shards
#    in HF's layout, and `mtrain score` of both gives the same bits;
#  - shards of different dtypes (F32, BF16, F16) load;
#  - every broken folder (missing shard, tensor missing from the map, map
#    naming a foreign tensor, a tensor listed twice or stored in two shards,
#    ...) fails with one line naming the file;
#  - export round trips: F32 is bit-identical, BF16 is the round-to-nearest-
#    even of the weights (torch's rounding), a BF16 model exports to the same
#    bytes; OUT_DIR is never overwritten unless empty;
#  - config.json of an export carries max_position_embeddings, rope_theta and
#    rope_scaling, from overrides and from a checkpoint trained with them;
#  - train.init_from loads a sharded folder.
import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

CPU = ["train.backend=cpu"]
INDEX = "model.safetensors.index.json"


def folder_raw(folder):
    """{name: (dtype, shape, bytes)} of a folder, single-file or sharded."""
    if not os.path.exists(os.path.join(folder, INDEX)):
        return harness.read_raw(os.path.join(folder, "model.safetensors"))
    out = {}
    with open(os.path.join(folder, INDEX)) as f:
        for shard in sorted(set(json.load(f)["weight_map"].values())):
            out.update(harness.read_raw(os.path.join(folder, shard)))
    return out


def one_line_error(p, tag, needles):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    missing = [n for n in needles if n not in p.stderr]
    check(f"{tag}: exits non-zero with one line naming {', '.join(needles)}",
          p.returncode != 0 and len(lines) == 1 and not missing,
          f"exit {p.returncode}, stderr {p.stderr!r}, missing {missing}")


def score_bits(tag, folder, tok, d, overrides=()):
    """(loss text, logits file bytes) of `mtrain score`, or (None, None)."""
    lpath = os.path.join(d, tag + ".logits.st")
    p, loss, _ = harness.score(folder, tok, logits=lpath, overrides=CPU + list(overrides))
    check(f"{tag}: score runs", p.returncode == 0 and loss is not None, p.stderr.strip()[-300:])
    if p.returncode != 0:
        return None, None
    return [l for l in p.stdout.splitlines() if l.startswith("loss ")][0], open(lpath, "rb").read()


def export(src, out, *args):
    return harness.run(["export", src, out] + list(args))


def test_sharded(d, cfg, params, tok):
    single = os.path.join(d, "single")
    ref.write_model(single, cfg, params)
    total = sum(t.numel() for t in params.values()) * 4
    sharded = os.path.join(d, "sharded")
    limit = total // 4
    p = export(single, sharded, "--dtype", "f32", "--max-shard-size", str(limit))
    check("export --max-shard-size runs", p.returncode == 0, p.stderr.strip())
    files = sorted(os.listdir(sharded))
    shards = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
    n = len(shards)
    check("export splits the tiny model into >= 3 shards named model-0000i-of-0000N",
          n >= 3 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)] and
          "model.safetensors" not in files and INDEX in files, f"files {files}")
    with open(os.path.join(sharded, INDEX)) as f:
        index = json.load(f)
    wmap = index.get("weight_map", {})
    raw = {s: harness.read_raw(os.path.join(sharded, s)) for s in shards}
    where = {name: [s for s in shards if name in raw[s]] for name in params}
    check("index weight_map names every tensor once, each in the shard that holds it (and only there)",
          set(wmap) == set(params) and all(where[k] == [wmap[k]] for k in params),
          f"map {len(wmap)} vs {len(params)} tensors; misplaced {[k for k in params if where[k] != [wmap.get(k)]][:4]}")
    data_bytes = sum(len(t[2]) for r in raw.values() for t in r.values())
    check("index metadata.total_size is the bytes of tensor data",
          index.get("metadata", {}).get("total_size") == data_bytes == total,
          f"{index.get('metadata')} vs {data_bytes}, {total}")
    sizes = [sum(len(t[2]) for t in r.values()) for r in raw.values()]
    check("every shard within the limit unless it holds one tensor",
          all(s <= limit or len(r) == 1 for s, r in zip(sizes, raw.values())), f"sizes {sizes} limit {limit}")
    a = folder_raw(single)
    check("F32 export keeps every tensor bit-identical", all(a[k] == folder_raw(sharded)[k] for k in a))
    l1, b1 = score_bits("single-file", single, tok, d)
    l2, b2 = score_bits("sharded", sharded, tok, d)
    check("sharded load = single-file load (loss and logits bits)", l1 is not None and l1 == l2 and b1 == b2,
          f"{l1} vs {l2}")
    with open(os.path.join(sharded, "config.json")) as f:
        c = json.load(f)
    check("exported config.json: same model, torch_dtype float32, rope_scaling null",
          all(c[k] == cfg[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads",
                                       "rope_theta", "max_position_embeddings", "tie_word_embeddings")) and
          c["torch_dtype"] == "float32" and c["rope_scaling"] is None, str(c))

    # load -> export (f32, one file) -> load: bit-identical
    back = os.path.join(d, "back")
    p = export(sharded, back, "--dtype", "f32")
    check("re-export of the sharded folder as one file", p.returncode == 0 and
          sorted(os.listdir(back)) == ["config.json", "model.safetensors"], p.stderr.strip())
    check("load -> export f32 -> load is bit-identical", folder_raw(back) == a)
    l3, b3 = score_bits("round trip", back, tok, d)
    check("round-tripped folder scores the same bits", l3 == l1 and b3 == b1)
    return single, sharded, l1, b1


def test_bf16(d, cfg, params, tok, single):
    out = os.path.join(d, "bf16")
    p = export(single, out)  # bf16 is the default
    check("export bf16 runs", p.returncode == 0, p.stderr.strip())
    got = folder_raw(out)
    want = {n: t.to(torch.float32).to(torch.bfloat16).view(torch.int16).numpy().tobytes() for n, t in params.items()}
    bad = [n for n in params if got.get(n, ("",))[0] != "BF16" or got[n][2] != want[n]]
    check("BF16 export = round to nearest even of every weight (torch's rounding), ties included", not bad,
          f"differ: {bad[:4]}")
    with open(os.path.join(out, "config.json")) as f:
        check("BF16 export's config.json says torch_dtype bfloat16", json.load(f)["torch_dtype"] == "bfloat16")
    py = os.path.join(d, "bf16_python")
    ref.write_model(py, cfg, params, dtype="BF16")
    l1, b1 = score_bits("bf16 export", out, tok, d)
    l2, b2 = score_bits("bf16 by torch", py, tok, d)
    check("BF16 export loads to the bf16-rounded weights (same bits as torch's BF16 file)",
          l1 is not None and l1 == l2 and b1 == b2)
    again = os.path.join(d, "bf16_again")
    p = export(py, again, "--dtype", "bf16", "--max-shard-size", "9KB")
    r, g = folder_raw(py), folder_raw(again) if p.returncode == 0 else {}
    check("a BF16 model exports in bf16 to byte-identical tensor data", p.returncode == 0 and r == g, p.stderr)


def test_mixed_dtypes(d, cfg, params, tok):
    names = list(params)
    groups = [names[0::3], names[1::3], names[2::3]]
    dtypes = ["F32", "BF16", "F16"]
    folder = os.path.join(d, "mixed")
    os.makedirs(folder)
    shutil.copy(os.path.join(d, "single", "config.json"), folder)
    wmap, rounded = {}, {}
    for i, (group, dt) in enumerate(zip(groups, dtypes)):
        name = f"part{i}.safetensors"
        harness.write_safetensors(os.path.join(folder, name), {n: params[n] for n in group}, dt)
        rounded.update(ref.round_to({n: params[n] for n in group}, dt))
        wmap.update({n: name for n in group})
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    plain = os.path.join(d, "mixed_f32")
    ref.write_model(plain, cfg, rounded)
    l1, b1 = score_bits("mixed-dtype shards", folder, tok, d)
    l2, b2 = score_bits("their values in one F32 file", plain, tok, d)
    check("shards of F32, BF16 and F16 load to the values they store", l1 is not None and l1 == l2 and b1 == b2)


def test_bad_folders(d, cfg, params, tok, sharded):
    with open(os.path.join(sharded, INDEX)) as f:
        index = json.load(f)
    wmap = index["weight_map"]
    shards = sorted(set(wmap.values()))
    first = sorted(n for n in wmap if wmap[n] == shards[0])[0]

    def broken(tag, edit_index=None, edit=None):
        folder = os.path.join(d, "bad_" + tag.replace(" ", "_"))
        shutil.copytree(sharded, folder)
        if edit_index:
            text = edit_index(json.loads(json.dumps(index)))
            with open(os.path.join(folder, INDEX), "w") as f:
                f.write(text if isinstance(text, str) else json.dumps(text, indent=2))
        if edit:
            edit(folder)
        return harness.score(folder, tok, overrides=CPU)[0]

    def drop(m, name):
        del m["weight_map"][name]
        return m

    def rewrite_shard(folder, shard, change):
        path = os.path.join(folder, shard)
        tensors = harness.read_safetensors(path)
        change(tensors)
        harness.write_safetensors(path, tensors)

    one_line_error(broken("missing shard", edit=lambda f: os.remove(os.path.join(f, shards[1]))),
                   "missing shard file", [INDEX, shards[1], "does not exist"])
    one_line_error(broken("not in map", edit_index=lambda m: drop(m, first)),
                   "tensor missing from weight_map", [INDEX, first, "missing from weight_map"])
    foreign = "model.layers.9.mlp.up_proj.weight"

    def add_foreign(m):
        m["weight_map"][foreign] = shards[0]
        return m
    one_line_error(broken("foreign in map", edit_index=add_foreign), "map names a tensor the model does not have",
                   [INDEX, foreign, "does not have"])

    def duplicate(m):
        text = json.dumps(m, indent=2)
        return text.replace('"weight_map": {', f'"weight_map": {{\n    "{first}": "{shards[0]}",', 1)
    one_line_error(broken("duplicate", edit_index=duplicate), "tensor listed twice in weight_map",
                   [INDEX, first, "twice"])
    one_line_error(broken("in two shards", edit=lambda f: rewrite_shard(
        f, shards[1], lambda t: t.__setitem__(first, params[first]))),
        "tensor stored in a second shard", [shards[1], first, "maps to"])
    one_line_error(broken("absent from shard", edit=lambda f: rewrite_shard(f, shards[0], lambda t: t.pop(first))),
                   "tensor absent from the shard the map names", [shards[0], first, "missing"])
    k_proj = "model.layers.1.self_attn.k_proj.weight"
    one_line_error(broken("wrong shape", edit=lambda f: rewrite_shard(
        f, wmap[k_proj], lambda t: t.__setitem__(k_proj, t[k_proj].T.contiguous()))),
        "wrong shape in a shard", [wmap[k_proj], k_proj, "shape"])
    one_line_error(broken("not json", edit_index=lambda m: "{\"weight_map\": "), "index not JSON",
                   [INDEX, "not valid JSON"])

    def escape(m):
        m["weight_map"][first] = "../" + shards[0]
        return m
    one_line_error(broken("path escape", edit_index=escape), "weight_map file outside the folder",
                   [INDEX, first, "not a file name in the same folder"])
    one_line_error(broken("no weight_map", edit_index=lambda m: {"metadata": {}}), "index without weight_map",
                   [INDEX, "weight_map"])

    # single files: a foreign tensor is refused; the head of a tied model is ignored
    folder = os.path.join(d, "bad_single_foreign")
    ref.write_model(folder, cfg, dict(params, **{"model.extra.weight": torch.zeros(3)}))
    one_line_error(harness.score(folder, tok, overrides=CPU)[0], "single file with a foreign tensor",
                   ["model.safetensors", "model.extra.weight", "not a parameter"])
    tied = dict(cfg, tie_word_embeddings=True)
    folder = os.path.join(d, "tied_with_head")
    ref.write_model(folder, tied, params)  # params include lm_head.weight
    p = harness.score(folder, tok, overrides=CPU)[0]
    check("tied model: a stored lm_head.weight is ignored", p.returncode == 0, p.stderr.strip())


def test_export_refusals(d, single):
    busy = os.path.join(d, "busy")
    os.makedirs(busy)
    with open(os.path.join(busy, "keep.txt"), "w") as f:
        f.write("precious\n")
    one_line_error(export(single, busy), "export into a non-empty folder", [busy, "not empty"])
    check("the non-empty folder is untouched", os.listdir(busy) == ["keep.txt"] and
          open(os.path.join(busy, "keep.txt")).read() == "precious\n")
    check("no temporary folder left behind", not [f for f in os.listdir(d) if f.startswith("busy.tmp")])
    afile = os.path.join(d, "afile")
    open(afile, "w").close()
    one_line_error(export(single, afile), "export onto a file", [afile, "not a directory"])
    empty = os.path.join(d, "empty")
    os.makedirs(empty)
    p = export(single, empty, "--dtype", "f32")
    check("export into an empty folder", p.returncode == 0 and folder_raw(empty) == folder_raw(single), p.stderr)
    one_line_error(export(single, os.path.join(d, "x1"), "--dtype", "f16"), "bad --dtype", ["f16", "bf16 or f32"])
    one_line_error(export(single, os.path.join(d, "x2"), "--max-shard-size", "5XB"), "bad size unit",
                   ["5XB", "unknown unit"])
    one_line_error(export(single, os.path.join(d, "x3"), "--max-shard-size", "0"), "zero size",
                   ["--max-shard-size", "not a positive size"])
    one_line_error(export(os.path.join(d, "nowhere"), os.path.join(d, "x4")), "missing source",
                   ["nowhere/config.json", "cannot open"])
    one_line_error(export(single, os.path.join(d, "x5"), "train.lr=1"), "non-model override",
                   ["train.lr=1", "only model.* keys"])
    check("failed exports create nothing", not [f for f in os.listdir(d) if f.startswith("x")])


def test_export_context(d, cfg, single, tok):
    out = os.path.join(d, "yarn_export")
    over = ["model.max_position_embeddings=131072", "model.rope_theta=500000", "model.rope_scaling.type=yarn",
            "model.rope_scaling.factor=4", "model.rope_scaling.original_max_position_embeddings=32768"]
    p = export(single, out, "--dtype", "f32", *over)
    check("export with context overrides runs", p.returncode == 0, p.stderr.strip())
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    want = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 32768,
            "rope_type": "yarn", "type": "yarn"}
    check("config.json carries rope_scaling (HF schema), rope_theta and max_position_embeddings",
          c.get("rope_scaling") == want and c.get("max_position_embeddings") == 131072 and c.get("rope_theta") == 5e5,
          str(c))
    l1, b1 = score_bits("yarn export", out, tok, d)
    l2, b2 = score_bits("same settings as overrides", single, tok, d, over)
    check("the exported rope settings load back as given", l1 is not None and l1 == l2 and b1 == b2)

    # A checkpoint of a run with rope settings exports them.
    run = os.path.join(d, "run.yaml")
    with open(run, "w") as f:
        f.write("model:\n  vocab_size: 64\n  hidden_size: 32\n  intermediate_size: 48\n  num_layers: 1\n"
                "  num_heads: 4\n  num_kv_heads: 2\n  rope_theta: 250000\n  max_position_embeddings: 65536\n"
                "  rope_scaling:\n    type: yarn\n    factor: 8\n    original_max_position_embeddings: 8192\n"
                "    beta_fast: 24\n"
                f"train:\n  steps: 1\n  seq_len: 16\ncheckpoint:\n  dir: {d}/ckpt\nlog:\n  dir: {d}/logs\n")
    p = harness.run(["train", run])
    check("train with rope_scaling runs", p.returncode == 0, p.stderr.strip()[-300:])
    out = os.path.join(d, "ckpt_export")
    p = export(os.path.join(d, "ckpt", "step_00000001"), out)
    check("export of a checkpoint folder runs", p.returncode == 0, p.stderr.strip())
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    check("checkpoint export's config.json carries the run's context settings",
          c.get("max_position_embeddings") == 65536 and c.get("rope_theta") == 250000.0 and
          c.get("rope_scaling", {}).get("factor") == 8.0 and c["rope_scaling"].get("beta_fast") == 24.0 and
          c["rope_scaling"].get("original_max_position_embeddings") == 8192, str(c))


def test_init_from_sharded(d, single, sharded):
    run = os.path.join(d, "init.yaml")
    with open(run, "w") as f:
        f.write(f"train:\n  init_from: {sharded}\n  steps: 1\n  seq_len: 16\n  lr: 0\n  warmup_steps: 0\n"
                f"checkpoint:\n  dir: {d}/init_ckpt\n  resume: never\nlog:\n  dir: {d}/logs\n")
    p = harness.run(["train", run])
    check("train.init_from a sharded folder runs", p.returncode == 0, p.stderr.strip()[-300:])
    step = os.path.join(d, "init_ckpt", "step_00000001")
    check("init_from a sharded folder loads its weights exactly (lr 0 checkpoint = source)",
          p.returncode == 0 and folder_raw(step) == folder_raw(single))


def main():
    harness.require_mtrain()
    torch.set_num_threads(2)
    cfg = ref.make_config(vocab=97, hidden=32, inter=48, layers=2, heads=4, kv_heads=2, theta=10000.0, tied=False)
    params = {n: t.to(torch.float32).to(torch.float64) for n, t in ref.random_model(cfg, seed=3).items()}
    # bf16 rounding ties (1 + 2^-8 lies halfway between two bf16 values) and
    # values just off them: round to nearest even, not truncation or ties-up.
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20, 1 + 2**-8 - 2**-20,
                         0.5 + 3 * 2**-10, 2**-130, -0.0], dtype=torch.float64)
    params["model.norm.weight"][:len(ties)] = ties
    with tempfile.TemporaryDirectory(prefix="mtrain_hf_") as d:
        tok = os.path.join(d, "tokens.txt")
        ref.write_tokens(tok, ref.random_tokens(cfg, 29, seed=3))
        single, sharded, _, _ = test_sharded(d, cfg, params, tok)
        test_bf16(d, cfg, params, tok, single)
        test_mixed_dtypes(d, cfg, params, tok)
        test_bad_folders(d, cfg, params, tok, sharded)
        test_export_refusals(d, single)
        test_export_context(d, cfg, single, tok)
        test_init_from_sharded(d, single, sharded)
    harness.finish()


if __name__ == "__main__":
    main()
