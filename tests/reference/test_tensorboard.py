# test_tensorboard.py: log.tensorboard's event files read back by a reader
# written here from the format's description, sharing nothing with
# trainer/tensorboard.c: TFRecord framing (uint64 length, masked CRC-32C of
# the length, data, masked CRC-32C of the data; CRC-32C computed bit by bit
# here), Event protobufs decoded with their own varint reader (wall_time 1,
# step 2, file_version 3, summary 5 {value 1 {tag 1, simple_value 2}},
# session_log 7 {status 1}; field 6 is the deprecated log_message, which
# TensorBoard does not read as a restart). Checks: every length and CRC; the first record of
# every file is file_version "brain.Event:2"; every scalar equals its
# metrics.jsonl value (float32, and the printed digits of tokens_per_s, mfu
# and the per-layer density and recall lists, whose means the scalars are),
# and the (tag, step) pairs are exactly those metrics.jsonl implies; the
# sparse ring run (mpirun -np 2, parallel.cp=2) logs attention/density,
# attention/recall, attention/estimation_recall and ring/mib; a run resumed from an earlier checkpoint
# appends a second file whose name sorts after the first and whose SessionLog START makes a TensorBoard-style
# reader (files in name order, START drops later steps) see what
# metrics.jsonl holds; no events file without log.tensorboard; the reader
# itself rejects a file with one byte changed.
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import check  # noqa: E402


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """[(field, wire type, value)] of one protobuf message: ints for wire 0,
    bytes for 1, 2 and 5."""
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((field, wire, v))
    if i != len(buf):
        raise ValueError("message overruns its length")
    return out


def read_records(path):
    data, i, records = open(path, "rb").read(), 0, []
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError(f"{path}: truncated header at {i}")
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hcrc != masked(head):
            raise ValueError(f"{path}: length CRC at {i}")
        body = data[i + 12:i + 12 + n]
        if len(body) != n or i + 16 + n > len(data):
            raise ValueError(f"{path}: truncated record at {i}")
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if dcrc != masked(body):
            raise ValueError(f"{path}: data CRC at {i}")
        records.append(body)
        i += 16 + n
    return records


def parse_event(body):
    """dict: wall_time, step, file_version, scalars {tag: value}, start."""
    ev = {"step": 0, "scalars": {}, "start": False}
    for field, wire, v in fields(body):
        if field == 1 and wire == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif field == 2 and wire == 0:
            ev["step"] = v
        elif field == 3 and wire == 2:
            ev["file_version"] = v.decode()
        elif field == 5 and wire == 2:
            for f, w, value in fields(v):
                assert f == 1 and w == 2
                tag = val = None
                for vf, vw, x in fields(value):
                    if vf == 1 and vw == 2:
                        tag = x.decode()
                    elif vf == 2 and vw == 5:
                        val = struct.unpack("<f", x)[0]
                ev["scalars"][tag] = val
        elif field == 7 and wire == 2:
            ev["start"] = any(f == 1 and value == 1 for f, _, value in fields(v))
    return ev


def read_dir(log_dir):
    """(files, {(tag, step): value}) as TensorBoard sees log_dir: files in name
    order, a SessionLog START at step s dropping what came before at steps >= s."""
    files = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    seen = {}
    for path in files:
        events = [parse_event(r) for r in read_records(path)]
        if not events or events[0].get("file_version") != "brain.Event:2":
            raise ValueError(f"{path}: first record is not file_version brain.Event:2")
        for ev in events:
            if "wall_time" not in ev or ev["wall_time"] < 1.5e9:
                raise ValueError(f"{path}: event without a unix wall_time")
            if ev["start"]:
                seen = {k: v for k, v in seen.items() if k[1] < ev["step"]}
            for tag, value in ev["scalars"].items():
                seen[(tag, ev["step"])] = value
    return files, seen


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected(metrics_path):
    """{(tag, step): (value, absolute tolerance)} from metrics.jsonl."""
    want = {}
    for line in open(metrics_path):
        m = json.loads(line)
        s = m["step"]
        if "val_loss" in m:
            want[("val/loss", s)] = (m["val_loss"], 0)
        if "loss" not in m:
            continue
        for tag, key, printed in [("train/loss", "loss", 0), ("train/lr", "lr", 0), ("train/grad_norm", "grad_norm", 0),
                                  ("train/tokens_per_s", "tokens_per_s", 0.05), ("train/mfu", "mfu", 5e-7)]:
            want[(tag, s)] = (m[key], printed)
        for tag, key in [("attention/density", "attention_density"), ("attention/recall", "attention_recall"),
                         ("attention/estimation_recall", "attention_estimation_recall")]:
            if key in m:
                want[(tag, s)] = (sum(m[key]) / len(m[key]), 5e-7 * max(m[key]))
        if "ring_bytes" in m:
            want[("ring/mib", s)] = (m["ring_bytes"] / 2**20, 0.5 / 2**20)
    return want


def compare(tag, log_dir, need_tags):
    try:
        files, seen = read_dir(log_dir)
    except (ValueError, IndexError, AssertionError) as e:
        check(f"{tag}: the event files read back (lengths, CRCs, header, protobuf)", False, str(e))
        return []
    check(f"{tag}: the event files read back (lengths, CRCs, header, protobuf)", len(files) > 0, "no events file")
    want = expected(os.path.join(log_dir, "metrics.jsonl"))
    check(f"{tag}: the (tag, step) scalars are exactly metrics.jsonl's ({len(want)})", set(seen) == set(want),
          f"extra {sorted(set(seen) - set(want))[:5]}, missing {sorted(set(want) - set(seen))[:5]}")
    bad = [(k, seen[k], v) for k, (v, tol) in want.items()
           if k in seen and abs(seen[k] - f32(v)) > tol + 2e-7 * abs(v)]
    check(f"{tag}: every scalar equals its metrics.jsonl value", not bad, f"{bad[:5]}")
    tags = {k[0] for k in want}
    check(f"{tag}: logs {', '.join(need_tags)}", set(need_tags) <= tags, f"tags {sorted(tags)}")
    return files


def train(log_dir, np, overrides):
    launch = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np)] if np > 1 else []
    cmd = launch + [harness.MTRAIN, "train", "configs/tiny-cpu.yaml", f"log.dir={log_dir}",
                    f"checkpoint.dir={log_dir}", "log.every=1"] + overrides
    p = subprocess.run(cmd, cwd=harness.ROOT, capture_output=True, text=True, timeout=300)
    check(f"train {os.path.basename(log_dir)} runs", p.returncode == 0, (p.stdout + p.stderr)[-500:])
    return p


def main():
    harness.require_mtrain()
    env = os.environ
    if os.getuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    env["OMP_NUM_THREADS"] = "1"
    small = ["train.steps=4", "train.warmup_steps=1", "train.seq_len=128", "log.val_every=2",
             "data.val_sequences=2", "log.tensorboard=true"]
    sparse = ["attention.type=sparse", "attention.budget=fixed", "attention.vertical=2", "attention.slash=2",
              "attention.sink=0", "attention.local=16", "log.attention_every=2"]
    with tempfile.TemporaryDirectory(prefix="mtrain_tb_") as d:
        dense = os.path.join(d, "dense")
        train(dense, 1, small + ["checkpoint.every=2"])
        files = compare("dense", dense, ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                                         "train/mfu", "val/loss"])

        # Resume from step 2 to step 3: step 4 of the first file is orphaned
        # (only the second file's SessionLog START drops it).
        train(dense, 1, small + ["train.steps=3", f"checkpoint.resume={dense}/step_00000002"])
        files2 = compare("resumed", dense, ["train/loss", "val/loss"])
        check("resumed: a second events file, sorting after the first",
              len(files) == 1 and len(files2) == 2 and files2[0] == files[0], f"{files} then {files2}")
        steps = sorted(json.loads(l)["step"] for l in open(os.path.join(dense, "metrics.jsonl")) if '"loss"' in l)
        check("resumed: metrics.jsonl holds steps 1-3 once", steps == [1, 2, 3], f"{steps}")

        ring = os.path.join(d, "ring")
        train(ring, 2, small + sparse + ["parallel.cp=2"])
        compare("sparse ring cp=2", ring, ["attention/density", "attention/recall", "attention/estimation_recall",
                                           "ring/mib"])

        off = os.path.join(d, "off")
        train(off, 1, ["train.steps=1", "train.warmup_steps=1", "train.seq_len=128"])
        check("no events file without log.tensorboard",
              not glob.glob(os.path.join(off, "events.out.tfevents.*")), f"{os.listdir(off)}")

        # The reader catches a change of one byte anywhere in a record.
        if files:
            broken = os.path.join(d, "broken")
            os.makedirs(broken)
            data = bytearray(open(files[0], "rb").read())
            for at, name in [(3, "length"), (20, "data")]:
                copy = bytearray(data)
                copy[at] ^= 0x10
                open(os.path.join(broken, "events.out.tfevents.1"), "wb").write(copy)
                try:
                    read_dir(broken)
                    caught = False
                except ValueError:
                    caught = True
                check(f"reader self-check: a changed {name} byte is rejected", caught)
            shutil.rmtree(broken)
    harness.finish()


if __name__ == "__main__":
    main()
