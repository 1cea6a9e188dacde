# harness.py: shared helpers of the Python reference tests: check() prints
# "ok NAME" / "FAIL NAME: why" lines for tests/run.sh, run() calls build/mtrain,
# the safetensors reader/writer used to hand tensors to and from mtrain, and
# the checks of a score's logits and gradient names against the reference.
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MTRAIN = os.path.join(ROOT, "build", "mtrain")
failures = 0


def check(name, cond, detail=""):
    global failures
    if cond:
        print(f"ok {name}", flush=True)
    else:
        failures += 1
        print(f"FAIL {name}: {detail}", flush=True)


def finish():
    sys.exit(1 if failures else 0)


def run(args, **kw):
    """Run build/mtrain with args; returns CompletedProcess (text)."""
    return subprocess.run([MTRAIN] + list(args), capture_output=True, text=True, **kw)


DTYPES = {"F32": ("<f4", 4), "F64": ("<f8", 8), "BF16": (None, 2), "F16": ("<f2", 2)}


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: dict name -> torch tensor. Writes F32, F16 or BF16."""
    import torch
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if dtype == "F32":
            raw = t.to(torch.float32).numpy().tobytes()
        elif dtype == "F16":
            raw = t.to(torch.float16).numpy().tobytes()
        elif dtype == "BF16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def read_raw(path):
    """Returns dict name -> (dtype, shape, raw data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            a, b = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], data[8 + n + a:8 + n + b])
    return out


def read_safetensors(path):
    """Returns dict name -> float64 torch tensor (F32/F16/BF16/F64 files)."""
    import numpy as np
    import torch
    out = {}
    for name, (dtype, shape, raw) in read_raw(path).items():
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[dtype][0])
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(shape))
    return out


def require_mtrain():
    """Fail (one FAIL line) and exit when build/mtrain has not been built."""
    if not os.access(MTRAIN, os.X_OK):
        check("build/mtrain exists", False, f"{MTRAIN} not built (run make)")
        finish()


def parse_score(stdout):
    """(loss, tokens) from `mtrain score` output lines `loss X` and `tokens T`;
    None for a line that is missing."""
    loss = ntok = None
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "loss":
            loss = float(parts[1])
        elif len(parts) == 2 and parts[0] == "tokens":
            ntok = int(parts[1])
    return loss, ntok


def score(model_dir, tokens_path, grads=None, logits=None, overrides=(), timeout=300, docs=None):
    """Run `mtrain score`; returns (CompletedProcess, loss, tokens)."""
    args = ["score", "--model", model_dir, "--tokens", tokens_path]
    if docs:
        args += ["--docs", docs]
    if grads:
        args += ["--grads", grads]
    if logits:
        args += ["--logits", logits]
    p = run(args + list(overrides), timeout=timeout)
    loss, ntok = parse_score(p.stdout) if p.returncode == 0 else (None, None)
    return p, loss, ntok


def rel_err(got, ref):
    """max |got - ref| / max |ref| of two tensors (0 when both are zero)."""
    den = float(ref.abs().max()) if ref.numel() else 0.0
    num = float((got - ref).abs().max()) if ref.numel() else 0.0
    return num / den if den > 0 else num


def check_logits(tag, path, want, tol):
    """The logits file of `mtrain score --logits` at path against want [T, V]:
    max |got - want| / max |want| < tol."""
    logits = read_safetensors(path)
    got = logits.get("logits")
    if got is not None and tuple(got.shape) == tuple(want.shape):
        e = rel_err(got.to(want.dtype), want)
        check(f"{tag} logits", e < tol, f"max abs err / max abs = {e:.2e}")
    else:
        check(f"{tag} logits", False, f"tensors {[(k, list(v.shape)) for k, v in logits.items()]}, "
              f"expected logits {list(want.shape)}")


def check_grad_names(tag, grads, params):
    """The gradients file holds exactly the model's parameters."""
    check(f"{tag} grad names", set(grads) == set(params),
          f"missing {sorted(set(params) - set(grads))}, extra {sorted(set(grads) - set(params))}")
