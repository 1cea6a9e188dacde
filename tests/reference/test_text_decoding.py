# test_text_decoding.py: token ids written as text (data/tokenizer.c's
# tokenizer_write, behind detokenize, shard dump --text, tasks and generate)
# against Python's bytes.decode("utf-8", "replace"): every maximal part of an
# invalid or cut-short UTF-8 sequence becomes one U+FFFD, valid characters
# pass through, and what comes out is always valid UTF-8. Hand-picked
# sequences (every row of the Unicode standard's table 3-7 at its edges:
# overlongs, surrogates, above U+10FFFF, lone continuation bytes, sequences
# cut short, in the middle of a line and at its end), then 3000 random byte
# strings weighted towards the bytes that start or continue a sequence.
# `mtrain generate` is checked the same way in test_generate.py.
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import MTRAIN, check, finish, require_mtrain  # noqa: E402

VECTORS = [
    b"plain ASCII",
    "caf\u00e9 \u20ac \U0001F600 \u4e2d".encode(),          # 2, 3 and 4 bytes
    b"\xc3", b"ab\xc3", b"\xe2\x82", b"\xf0\x9f\x98",        # cut short at the end
    b"\xc3x", b"\xe2\x82x", b"\xf0\x9f\x98x",                # cut short by ASCII
    b"\xe2\x82\xc3\xa9",                                     # cut short by a valid character
    b"\x80", b"\xbf\xbf", b"a\x80b",                         # lone continuation bytes
    b"\xc0\x80", b"\xc1\xbf",                                # overlong 2-byte leads
    b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xe0\xa0\x80",       # E0: second byte from A0
    b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",       # ED: surrogates refused
    b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80",  # F0: second byte from 90
    b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",                # F4: nothing above U+10FFFF
    b"\xf5\x80\x80\x80", b"\xf8", b"\xfe\xff",               # leads that never start a character
    b"\xef\xbf\xbd",                                         # U+FFFD itself
]


def random_strings(count, seed):
    rng = random.Random(seed)
    pool = list(range(0x20, 0x7f)) + list(range(0x80, 0xc0)) * 2 + list(range(0xc0, 0x100)) * 3
    return [bytes(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(count)]


def detokenize(d, texts, name):
    path = os.path.join(d, name + ".ids")
    with open(path, "w") as f:
        for t in texts:
            f.write(" ".join(str(b) for b in t) + "\n")
    p = subprocess.run([MTRAIN, "detokenize", "--tokenizer", "bytes", path], capture_output=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def main():
    require_mtrain()
    with tempfile.TemporaryDirectory(prefix="mtrain_text_") as d:
        rc, out, err = detokenize(d, VECTORS, "vectors")
        lines = out.split(b"\n")
        check("detokenize: exits 0 on any bytes", rc == 0, err[-300:])
        for i, t in enumerate(VECTORS):
            want = t.decode("utf-8", "replace").encode()
            got = lines[i] if i < len(lines) else None
            check(f"detokenize: {t!r} reads as {want.decode()!a}", got == want, f"got {got!r}")

        texts = random_strings(3000, 1)
        rc, out, err = detokenize(d, texts, "random")
        want = b"".join(t.decode("utf-8", "replace").encode() + b"\n" for t in texts)
        first = next((i for i, (a, b) in enumerate(zip(out.split(b"\n"), want.split(b"\n"))) if a != b), None)
        check("detokenize: 3000 random byte strings read as Python's decode(errors='replace')",
              rc == 0 and out == want, f"first difference on line {first}: {texts[first] if first is not None else ''!r}")
        try:
            out.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        check("detokenize: the output is valid UTF-8", valid)
    finish()


if __name__ == "__main__":
    main()
