# test_attention_layers.py: the include graph of attention/, derived from
# the sources' #include "..." lines, is layers (docs/ARCHITECTURE.md,
# Attention), and the rest of mtrain sees attention/ through its one public
# header. Layers, from the bottom:
#   0  attention/*.h, *.c (attention.h, layout.h, sparse_types.h, attn_args.h): the shared vocabulary and rules
#   1  kernels/
#   2  sparse/   (beside ring/: ring/ may include sparse/, never the reverse)
#   3  ring/
#   4  op/ and attention_api.h (the ops' public declarations)
# Checks: no file includes one of a higher layer; attention/ includes
# nothing of mtrain outside itself but dist/ (the bottom); no cycle among the files;
# outside attention/, production code (model/, data/, trainer/, dist/,
# scripts/ but its kernel benchmarks) includes only attention/attention_api.h,
# data/ also attention/layout.h, and the planner's ring on paper
# (trainer/plan_ring.c) the ring's geometry and byte planner. tests/ and
# scripts/bench_* test and time the parts themselves and may include any.
#   python3 tests/repo/test_attention_layers.py [ROOT]   (ROOT: the tree to read, default this one)
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import check, finish  # noqa: E402

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ROOT = os.path.abspath(ROOT)
SOURCE = re.compile(r".*\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LAYER = {"kernels": 1, "sparse": 2, "ring": 3, "op": 4}
PUBLIC = "attention/attention_api.h"
# Outside attention/: who may include what beyond the public header.
ALLOWED = {
    "data/": {"attention/layout.h"},
    "trainer/plan_ring.c": {"attention/ring/ring_plan.h", "attention/ring/ring_sparse.h"},
}


def sources(folder):
    """Every source file under ROOT/folder, as paths relative to ROOT."""
    found = []
    for top, _, names in os.walk(os.path.join(ROOT, folder)):
        found += [os.path.relpath(os.path.join(top, n), ROOT) for n in names if SOURCE.match(n)]
    return sorted(found)


def includes(path):
    """The files path includes with quotes, relative to ROOT (resolved from path's folder)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(path)
    return [os.path.normpath(os.path.join(here, name)) for name in INCLUDE.findall(text)]


def layer(path):
    """path's layer inside attention/ (see the top of this file)."""
    if path == PUBLIC:
        return 4
    parts = path.split("/")
    return LAYER[parts[1]] if len(parts) > 2 else 0


inside = sources("attention")
graph = {f: [t for t in includes(f) if t.startswith("attention/")] for f in inside}

upward = [f"{f} ({layer(f)}) includes {t} ({layer(t)})" for f in inside for t in graph[f]
          if t in graph and layer(t) > layer(f)]
check("attention_layers_downward: no attention/ file includes one of a higher layer",
      not upward, "; ".join(upward))
outward = [f"{f} includes {t}" for f in inside for t in includes(f)
           if not t.startswith("attention/") and not t.startswith("dist/")]
check("attention_layers_reach_only_dist: no attention/ file includes trainer/, model/, data/ or any other part "
      "of mtrain but dist/", not outward, "; ".join(outward))
missing = [f"{f} includes {t}" for f in inside for t in graph[f] if t not in graph]
check("attention_layers_resolved: every include inside attention/ names a file of it", not missing,
      "; ".join(missing))

# Cycles: a depth-first walk; a file met again while on the walk's path closes one.
cycles, state = [], {}


def walk(f, path):
    state[f] = "open"
    for t in graph.get(f, []):
        if state.get(t) == "open":
            cycles.append(" -> ".join(path[path.index(t):] + [t]))
        elif t in graph and t not in state:
            walk(t, path + [t])
    state[f] = "done"


for f in inside:
    if f not in state:
        walk(f, [f])
check("attention_layers_no_cycle: the include graph of attention/ has no cycle", not cycles, "; ".join(cycles))

outside = [f for folder in ("model", "data", "trainer", "dist", "scripts") for f in sources(folder)
           if not os.path.basename(f).startswith("bench_")]
private = []
for f in outside:
    allowed = {PUBLIC}.union(*[names for prefix, names in ALLOWED.items() if f.startswith(prefix)])
    private += [f"{f} includes {t}" for t in includes(f) if t.startswith("attention/") and t not in allowed]
check("attention_public_header: code outside attention/ includes only attention/attention_api.h",
      not private, "; ".join(private))
check("attention_public_header_used: the backends include it",
      all(PUBLIC in includes(f) for f in ("model/backend.h", "model/ops_cpu.c")),
      "model/backend.h or model/ops_cpu.c does not include " + PUBLIC)
finish()
