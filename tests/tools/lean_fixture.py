#!/usr/bin/env python3
"""Copies an oracle's expected-output .safetensors keeping only the tensors the tests read.

The generators also write debugging tensors (per-layer residual streams, selected entries, drafter
outputs) that no test compares; the committed fixtures leave them out so the tree stays small.
Kept tensors are byte-for-byte the generator's (same dtype, shape, bytes); the header's
__metadata__ is kept too.

    python3 lean_fixture.py SRC DST REGEX [REGEX...]   # keep the tensors whose name fully matches a REGEX
    python3 lean_fixture.py --v41 SRC_DIR DST_DIR        # a V4.1 fixture's two expected files, with KEEP_V41

The drafter's logits are kept for the short case only (case1): the long cases' would be most of the
fixture's size.
"""
import json
import re
import struct
import sys


# What the V4.1 tests read (tests/unit/test_v41_fixtures.c, test_dspark.c), per expected file.
KEEP_V41 = {
    "expected.safetensors": [r"case\d+\.(ids|logits|inc_logits|logits_acc32)", r"case0\.engram_hash",
                             r"case\d+\.spec_(start_pos|ids|confidence)", r"case1\.spec_logits"],
    "expected_fp64.safetensors": [r"case\d+\.(ids|logits|inc_logits)", r"case\d+\.spec_(start_pos|ids|confidence)",
                                  r"case1\.spec_logits"],
}


def main():
    if sys.argv[1] == "--v41":
        for name, keep in KEEP_V41.items():
            lean(sys.argv[2] + "/" + name, sys.argv[3] + "/" + name, [re.compile(p) for p in keep])
        return
    lean(sys.argv[1], sys.argv[2], [re.compile(p) for p in sys.argv[3:]])


def lean(src, dst, pats):
    with open(src, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    base = 8 + n
    out, parts, off = {}, [], 0
    if "__metadata__" in hdr:
        out["__metadata__"] = hdr["__metadata__"]
    for name, t in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
        if name == "__metadata__" or not any(p.fullmatch(name) for p in pats):
            continue
        a, b = t["data_offsets"]
        parts.append(blob[base + a:base + b])
        out[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + b - a]}
        off += b - a
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for p in parts:
            f.write(p)
    print("%s: kept %d of %d tensors, %d bytes" % (dst, len(out) - ("__metadata__" in out),
                                                   len(hdr) - ("__metadata__" in hdr), 8 + len(h) + off))


if __name__ == "__main__":
    main()
