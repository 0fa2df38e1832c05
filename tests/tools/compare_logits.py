#!/usr/bin/env python3
"""Compares a `dsv4 logits` output file with a fixture's expected logits (stdlib only).

usage: compare_logits.py LOGITS.f32 EXPECTED.safetensors TENSOR
Tolerance (the engine's exactness bound): max|logit - ref| <= 1e-4 * max|ref|, and the same argmax on every row
whose reference top-two gap exceeds 1e-3. Exit 0 when both hold."""
import json, struct, sys

def read_tensor(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        t = hdr[name]
        b, e = t["data_offsets"]
        f.seek(8 + n + b)
        raw = f.read(e - b)
    assert t["dtype"] == "F32"
    return t["shape"], struct.unpack("<%df" % (len(raw) // 4), raw)

shape, ref = read_tensor(sys.argv[2], sys.argv[3])
with open(sys.argv[1], "rb") as f:
    raw = f.read()
got = struct.unpack("<%df" % (len(raw) // 4), raw)
if len(got) != len(ref):
    print("size mismatch: %d values, expected %d" % (len(got), len(ref)))
    sys.exit(1)
T, V = shape
mref = max(abs(v) for v in ref)
md = max(abs(a - b) for a, b in zip(got, ref))
bad = 0
for t in range(T):
    r = ref[t * V:(t + 1) * V]
    g = got[t * V:(t + 1) * V]
    s = sorted(r, reverse=True)
    if s[0] - s[1] > 1e-3 and max(range(V), key=g.__getitem__) != max(range(V), key=r.__getitem__):
        bad += 1
print("max|diff| %.3g (bound %.3g), argmax mismatches %d" % (md, 1e-4 * mref, bad))
sys.exit(0 if md <= 1e-4 * mref and bad == 0 else 1)
