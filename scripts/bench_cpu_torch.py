# bench_cpu_torch.py: the peer of scripts/bench_cpu.sh: PyTorch (Debian's
# python3-torch, CPU, fp32, eager) training forward+backward of the same
# Qwen2 shape, using the test reference's model (tests/lib/qwen2_ref.py) with
# float32 parameters. Prints "torch_tokens_per_s N".
#   /usr/bin/python3 scripts/bench_cpu_torch.py T VOCAB HIDDEN INTER LAYERS HEADS KV_HEADS
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import torch  # noqa: E402

import qwen2_ref  # noqa: E402

T, vocab, hidden, inter, layers, heads, kv = (int(a) for a in sys.argv[1:8])
torch.set_num_threads(os.cpu_count())
cfg = qwen2_ref.make_config(vocab=vocab, hidden=hidden, inter=inter, layers=layers, heads=heads,
                            kv_heads=kv, theta=1e6, tied=True, max_pos=T)
params = {n: t.to(torch.float32).requires_grad_(True) for n, t in qwen2_ref.random_model(cfg).items()}
tokens = torch.randint(0, vocab, (T,))
times = []
for it in range(4):
    t0 = time.perf_counter()
    logits = qwen2_ref.forward(cfg, params, tokens)
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:])
    loss.backward()
    times.append(time.perf_counter() - t0)
best = min(times[1:])
print(f"torch_tokens_per_s {T / best:.0f}")
