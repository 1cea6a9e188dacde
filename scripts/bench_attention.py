"""bench_attention.py: PyTorch scaled_dot_product_attention (flash and cuDNN
backends) on the shapes of tests/sim/gpu_bench_attention.c, timed in the same run,
and the comparison table with mtrain's numbers.

  python3 scripts/bench_attention.py MTRAIN_RESULTS [--head-dim D] N...

MTRAIN_RESULTS holds the lines "mtrain N fwd_ms bwd_ms". SDPA runs causal,
bf16, [1, H, N, D] contiguous (D = 128, or 64 with --head-dim 64), 16 q heads and 2 kv heads: enable_gqa=True
where the backend takes it, else K and V repeated to 16 heads beforehand (not
timed); the table says which. fwd is the median forward time; bwd is the
median of forward+backward minus the median forward. FLOPs of causal
attention: forward 2*2*N^2/2*D*H, backward 2.5 times that.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV = 16, 2
D = 128   # --head-dim


def median_ms(fn, reps):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    fn()  # warm-up
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[reps // 2]


def time_sdpa(backend, n, reps):
    """(fwd_ms, bwd_ms, gqa_mode) or None when the backend cannot run the shape."""
    gen = torch.Generator(device="cuda").manual_seed(n)

    def rand(h):
        return (torch.rand(1, h, n, D, device="cuda", generator=gen) * 4 - 2).to(torch.bfloat16)

    q, k, v, dout = rand(HQ), rand(HKV), rand(HKV), rand(HQ)
    q.requires_grad_(True)
    for mode in ("enable_gqa", "repeated K/V"):
        if mode == "enable_gqa":
            kk, vv, extra = k, v, {"enable_gqa": True}
        else:
            kk = k.repeat_interleave(HQ // HKV, dim=1)
            vv = v.repeat_interleave(HQ // HKV, dim=1)
            extra = {}
        kk = kk.detach().requires_grad_(True)
        vv = vv.detach().requires_grad_(True)

        def fwd():
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **extra)

        def fwd_bwd():
            q.grad = kk.grad = vv.grad = None   # no accumulation kernels in the timing
            fwd().backward(dout)

        try:
            with sdpa_kernel(backend):
                f = median_ms(fwd, reps)
                fb = median_ms(fwd_bwd, reps)
            return f, fb - f, mode
        except RuntimeError as err:
            print(f"sdpa {backend.name} N={n} {mode}: {str(err).splitlines()[0]}", flush=True)
            torch.cuda.empty_cache()
    return None


def flops_fwd(n):
    return 2 * 2 * n * n / 2 * D * HQ


def main():
    global D
    args = sys.argv[2:]
    if args[:1] == ["--head-dim"]:
        D, args = int(args[1]), args[2:]
    mtrain = {}
    with open(sys.argv[1]) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "mtrain":
                mtrain[int(parts[1])] = (float(parts[2]), float(parts[3]))
    sizes = [int(a) for a in args]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, head dim {D}", flush=True)
    rows = []
    for n in sizes:
        reps = 3 if n >= 65536 else 10
        res = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            res[name] = time_sdpa(backend, n, reps)
            if res[name]:
                f, b, mode = res[name]
                print(f"sdpa {name} N={n} ({mode}): fwd {f:.3f} ms, bwd {b:.3f} ms", flush=True)
            torch.cuda.empty_cache()
        rows.append((n, res))

    def cell(r):
        return f"{r[0]:.2f} / {r[1]:.2f} ({'gqa' if r[2] == 'enable_gqa' else 'rep'})" if r else "n/a"

    print()
    print("| N | mtrain fwd / bwd ms | mtrain fwd / bwd TFLOP/s | SDPA flash fwd / bwd ms "
          "| SDPA cuDNN fwd / bwd ms | best SDPA fwd+bwd ms (TFLOP/s) | mtrain ÷ best SDPA |")
    print("|---|---|---|---|---|---|---|")
    for n, res in rows:
        m = mtrain.get(n)
        best = min((r[0] + r[1] for r in res.values() if r), default=None)
        ff = flops_fwd(n)
        mt = f"{m[0]:.2f} / {m[1]:.2f}" if m else "n/a"
        tf = f"{ff / m[0] / 1e9:.0f} / {2.5 * ff / m[1] / 1e9:.0f}" if m else "n/a"
        best_ms = f"{best:.2f} ({3.5 * ff / best / 1e9:.0f})" if best else "n/a"
        ratio = f"{(m[0] + m[1]) / best:.2f}" if m and best else "n/a"
        print(f"| {n} | {mt} | {tf} | {cell(res['flash'])} | {cell(res['cudnn'])} | {best_ms} | {ratio} |")


if __name__ == "__main__":
    main()
