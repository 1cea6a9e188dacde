# compare_runs.py: how far two training runs of the same steps are apart, for
# the shell tests that compare multi-rank runs with one rank:
#   python3 tests/lib/compare_runs.py RUN_A RUN_B STEP
# RUN_* are log/checkpoint folders (metrics.jsonl, step_NNNNNNNN/model.safetensors).
# Prints "LOSS WEIGHTS": the largest |loss_a - loss_b| / |loss_b| over the
# steps both logged (a resumed run logs only the steps after its
# checkpoint), the largest |w_a - w_b| over every tensor of checkpoint STEP;
# "- -" when a run lacks either, inf when either did not log STEP or the
# runs have different tensors.
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import read_raw  # noqa: E402


def run(folder, step):
    losses = {}
    for line in open(os.path.join(folder, "metrics.jsonl")):
        row = json.loads(line)
        if "loss" in row:
            losses[row["step"]] = row["loss"]
    weights = read_raw(os.path.join(folder, f"step_{step:08d}", "model.safetensors"))
    return losses, {k: np.frombuffer(raw, "<f4").astype(np.float64) for k, (_, _, raw) in weights.items()}


def main():
    a, b, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        (la, wa), (lb, wb) = run(a, step), run(b, step)
    except (OSError, ValueError, KeyError):
        print("- -")
        return
    steps = sorted(set(la) & set(lb))
    loss = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in steps) if step in steps else float("inf")
    weights = max(np.abs(wa[k] - wb[k]).max() for k in wb) if wa.keys() == wb.keys() else float("inf")
    print(f"{loss:.3e} {weights:.3e}")


main()
